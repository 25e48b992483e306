"""`proctor init`: pin the task, seal the verifier's inputs outside the workspace, record the baseline.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from harness._version import __version__
from harness.errors import Code, GateRefusal
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.evidence.tree import DEFAULT_EXCLUDES, scan_tree
from harness.evidence.tree_entry import TreeSignature, display_path, manifest_to_json, signature_of
from harness.gate.guards import ancestor_inputs, seal_matches
from harness.gate.lanes import LaneDecision, choose_lane
from harness.gate.seal import seal_files, store_hidden
from harness.gate.state import StateDir, journal_clock, refuse_nested, workspace_root
from harness.gate.task import load_task
from harness.gate.workspace import Gate
from harness.records.journal import InitEvent

__all__ = ["PIN_SCHEMA", "InitResult", "init_workspace"]

PIN_SCHEMA = "proctor-pin.v1"


@dataclass(frozen=True)
class InitResult:
    """What `proctor init` pinned: the task, its lane, the sealed and hidden inputs, the baseline tree."""

    task_id: str
    workspace: str
    state_dir: str
    lane: LaneDecision
    verifier_argv: tuple[str, ...]
    sealed: tuple[str, ...]
    hidden: tuple[str, ...]
    baseline_tree: TreeSignature
    pin_sha256: str
    excluded_from_tree: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "task_id": self.task_id,
            "workspace": self.workspace,
            "state_dir": self.state_dir,
            "lane": self.lane.to_json(),
            "verifier_argv": list(self.verifier_argv),
            "sealed": list(self.sealed),
            "hidden": list(self.hidden),
            "baseline_tree": self.baseline_tree.to_json(),
            "pin_sha256": self.pin_sha256,
            "excluded_from_tree": list(self.excluded_from_tree),
        }


def init_workspace(workspace: str, task_path: str, state_dir: str | None = None) -> InitResult:
    """Create the state folder, pin the task and verifier, seal and hide inputs, record the baseline."""
    refuse_nested("init")
    ws = workspace_root(workspace)
    task = load_task(task_path)
    state = StateDir.locate(ws, state_dir)
    if state.exists():
        raise GateRefusal(
            Code.ALREADY_INITIALIZED,
            "this workspace is already pinned; remove its state folder to start over",
            state.root,
        )
    state.create()
    with state.lock():
        entries = scan_tree(ws, DEFAULT_EXCLUDES)
        matches = seal_matches(task.verifier.seal, entries)
        empty = [pattern for pattern, hits in matches.items() if not hits]
        if empty:
            raise GateRefusal(Code.SEAL_TARGET_MISSING, f"seal patterns match no file: {', '.join(empty)}", ws)
        sealed_paths = sorted({p for hits in matches.values() for p in hits})
        sealed = seal_files(ws, sealed_paths, entries, state.path("sealed"))
        hidden = store_hidden(task.folder, ws, task.verifier.hidden, state.path("hidden"))
        baseline = signature_of(entries)
        baseline_sha = state.write_record("baseline.json", {"entries": manifest_to_json(entries)})
        lane = choose_lane(task)
        pin: dict[str, Any] = {
            "schema": PIN_SCHEMA,
            "task_id": task.task_id,
            "task_path": task.path,
            "task_sha256": task.sha256,
            "workspace": ws,
            "verifier": task.verifier.raw,
            "verifier_argv": task.verifier.resolved_argv(),
            "sealed": sealed,
            "hidden": hidden,
            "excludes": list(DEFAULT_EXCLUDES),
            "baseline_tree": baseline.digest,
            "baseline_manifest_sha256": baseline_sha,
            # pytest reads config and conftest.py from the folders above the verification copy
            "verify_ancestor_inputs": ancestor_inputs(state.path("verify")),
            "lane": lane.to_json(),
            "proctor_version": __version__,
        }
        journal = state.journal(task.task_id)
        prior = state.events(pin) if os.path.exists(state.journal_path) else []  # a retried init
        gate = Gate(ws, task, state, pin, journal, prior, journal_clock(prior))
        # The journal records the pin's hash first: a crash before the pin lands leaves a
        # workspace that is simply not initialized, and a retry appends a second init.
        pin_sha = sha256_hex(canonical_bytes(pin))
        gate.record(
            InitEvent(
                task_id=task.task_id,
                task_sha256=task.sha256,
                pin_sha256=pin_sha,
                baseline_tree=baseline.digest,
                sealed=tuple(s["path"] for s in sealed),
                hidden=tuple(h["to"] for h in hidden),
                lane=lane.lane,
            )
        )
        state.write_record("pin.json", pin)
    return InitResult(
        task_id=task.task_id,
        workspace=ws,
        state_dir=state.root,
        lane=lane,
        verifier_argv=tuple(pin["verifier_argv"]),
        sealed=tuple(s["path"] for s in sealed),
        hidden=tuple(h["to"] for h in hidden),
        baseline_tree=baseline,
        pin_sha256=pin_sha,
        excluded_from_tree=tuple(display_path(os.fsencode(p)) for p in DEFAULT_EXCLUDES),
    )
