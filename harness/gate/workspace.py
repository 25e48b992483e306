"""Opening a workspace's gate: the workspace, its task, its state and the pin it must match.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, Refusal, TaskRefusal
from harness.evidence.chain import ChainedLog
from harness.evidence.clock import Clock
from harness.evidence.jsonio import canonical_bytes
from harness.gate.state import StateDir, journal_clock, stamp, workspace_root
from harness.gate.task import Task, load_task
from harness.records.journal import JournalEvent, RefusedEvent

__all__ = ["Gate", "check_pin", "gated", "withheld_paths"]


def check_pin(task: Task, pin: dict[str, Any]) -> None:
    """Refuse a task file whose verifier, or any other byte, changed since init."""
    if canonical_bytes(task.verifier.raw) != canonical_bytes(pin["verifier"]) or (
        task.verifier.resolved_argv() != pin["verifier_argv"]
    ):
        raise GateRefusal(
            Code.VERIFIER_CHANGED_SINCE_INIT,
            "the task file's verifier differs from the one pinned at init",
            task.path,
        )
    if task.sha256 != pin["task_sha256"]:
        raise GateRefusal(Code.TASK_CHANGED_SINCE_INIT, "the task file changed since init", task.path)


@dataclass
class Gate:
    """One command's view of a pinned workspace."""

    workspace: str
    task: Task
    state: StateDir
    pin: dict[str, Any]
    journal: ChainedLog
    events: list[dict[str, Any]]
    clock: Clock

    def record(self, event: JournalEvent) -> dict[str, Any]:
        """Append one event to the chained journal, stamped by the never-backwards clock."""
        written = self.journal.append({"event": event.KIND, **event.fields(), **stamp(self.clock)})
        self.events.append(written)
        return written

    @contextmanager
    def journaling_refusals(self, action: str) -> Iterator[None]:
        """Record a refusal of `action` in the journal before it propagates."""
        try:
            yield
        except Refusal as refusal:
            # A journal the refusal is about (broken, tampered) may refuse this append too:
            # the first refusal is the one to report. One found cut or rewritten gets no line.
            if refusal.code in (Code.JOURNAL_SHORTENED, Code.JOURNAL_REWRITTEN):
                raise
            with suppress(Refusal):
                self.record(RefusedEvent(action=action, refusal=refusal.code, message=refusal.message))
            raise


@contextmanager
def gated(workspace: str, task_path: str | None, state_dir: str | None, *, lock: bool = True) -> Iterator[Gate]:
    """Resolve the workspace, take its invocation lock, and load what a gated command needs.

    Without `lock` (read-only commands) nothing is locked; the journal is read as it stands.
    """
    ws = workspace_root(workspace)
    state = StateDir.locate(ws, state_dir)
    state.pin()  # refuses not_initialized before any lock file is made
    if not lock:
        yield _open(ws, state, task_path)
        return
    with state.lock():
        yield _open(ws, state, task_path)


def _open(ws: str, state: StateDir, task_path: str | None) -> Gate:
    loaded = state.pin_loaded()
    pin: dict[str, Any] = loaded.value
    task = load_task(pin["task_path"] if task_path is None else task_path)
    if task.task_id != pin["task_id"]:
        raise TaskRefusal(Code.TASK_MISMATCH, f"this workspace is pinned to task {pin['task_id']!r}", task.path)
    journal = state.journal(pin["task_id"])
    events = state.events(pin)
    inits = [e for e in events if e.get("event") == "init"]
    if not inits or inits[-1].get("pin_sha256") != loaded.sha256:
        raise GateRefusal(Code.STATE_TAMPERED, "the pin's bytes differ from those the journal recorded", state.pin_path)
    tampered = [e for e in events if e.get("event") == "state_tampered"]
    if tampered:
        paths = tampered[-1].get("paths", [])
        raise GateRefusal(
            Code.STATE_TAMPERED,
            f"dispatch {tampered[-1].get('dispatch_id')} changed the state folder ({', '.join(paths)}): "
            "its evidence cannot be trusted; remove the state folder and init again",
            state.journal_path,
            paths=paths,
        )
    return Gate(ws, task, state, pin, journal, events, journal_clock(events))


def withheld_paths(gate: Gate) -> tuple[str, ...]:
    """What a sandbox never shows, even beneath a path a worker names: the state folders and hidden inputs."""
    found = [gate.state.root, os.path.join(os.path.dirname(gate.workspace), ".runner-state")]
    if os.path.basename(os.path.dirname(gate.state.root)) == ".runner-state":
        found.append(os.path.dirname(gate.state.root))
    found += [os.path.realpath(os.path.join(gate.task.folder, h["from"])) for h in gate.pin["hidden"]]
    return tuple(dict.fromkeys(found))
