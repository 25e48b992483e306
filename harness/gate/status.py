"""`proctor status` and `proctor journal --ack`: what is running, stalled, orphaned or detached.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, Refusal
from harness.evidence.jsonio import read_json
from harness.evidence.lock import lock_holder
from harness.gate.escalation import EscalationState, escalation_state
from harness.gate.state import refuse_nested
from harness.gate.workspace import Gate, gated
from harness.records.journal import AckEvent
from harness.workers.sandbox import guarantee_of

__all__ = ["HEARTBEAT_STALE_S", "AckResult", "JournalTail", "StatusResult", "acknowledge", "journal_tail", "status"]

HEARTBEAT_STALE_S = 300.0
"""A heartbeat older than this (or than the task's timeout, if shorter) is `stale`."""


def _open_dispatches(gate: Gate) -> dict[str, dict[str, Any]]:
    opened: dict[str, dict[str, Any]] = {}
    for event in gate.events:
        if event["event"] == "dispatch_start":
            opened[event["dispatch_id"]] = event
        elif event["event"] == "dispatch_end":
            opened.pop(event["dispatch_id"], None)
    return opened


def _lock_holder(gate: Gate) -> int | None:
    """The pid of the invocation holding this workspace's lock, or None when it is free."""
    return lock_holder(gate.state.path("invocation.lock"))


def _orphans(gate: Gate, opened: dict[str, dict[str, Any]], holder: int | None) -> list[str]:
    """Open dispatches whose proctor is gone (it does not hold the lock), not yet acknowledged.

    While another invocation holds the lock, a dispatch started by a different
    proctor is still an orphan.
    """
    if not opened:
        return []
    acked = {e["dispatch_id"] for e in gate.events if e["event"] == "ack"}
    return [d for d, e in opened.items() if d not in acked and e.get("proctor_pid") != holder]


def _heartbeat(start: dict[str, Any], now: float, stale_after: float) -> dict[str, Any]:
    path = start.get("heartbeat", "")
    try:
        mtime = os.stat(path).st_mtime
        beat = read_json(path, max_bytes=65536).value
    except (OSError, Refusal):
        return {"state": "absent"}
    age = max(0.0, now - mtime)  # a beat written after `now` was read (or a coarse file clock) is 0 s old
    progress = {k: v for k, v in beat.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    return {"state": "stale" if age > stale_after else "fresh", "age_s": round(age, 3), **progress}


@dataclass(frozen=True)
class StatusResult:
    """`proctor status`: dispatches running, stalled, orphaned or detached; receipts; measurement; escalation."""

    task_id: str
    workspace: str
    state_dir: str
    dispatches: int
    max_dispatches: int
    running_dispatch_ids: tuple[str, ...]
    stall_suspected: bool
    silence_s: float
    stall_after_s: float
    orphaned_dispatch_ids: tuple[str, ...]
    detached_dispatch_ids: tuple[str, ...]
    payload_progress: dict[str, dict[str, Any]]
    degraded_components: tuple[str, ...]
    last_receipt: dict[str, Any] | None
    accepted: bool
    journal_lines: int
    escalation: EscalationState
    sandbox_dispatches: dict[str, Any]
    guarantee: str | None

    def to_json(self) -> dict[str, Any]:
        esc = self.escalation
        return {
            "ok": True,
            "task_id": self.task_id,
            "workspace": self.workspace,
            "state_dir": self.state_dir,
            "dispatches": self.dispatches,
            "max_dispatches": self.max_dispatches,
            "running_dispatch_ids": list(self.running_dispatch_ids),
            "stall_suspected": self.stall_suspected,
            "silence_s": self.silence_s,
            "stall_after_s": self.stall_after_s,
            "orphaned_dispatch_ids": list(self.orphaned_dispatch_ids),
            "detached_dispatch_ids": list(self.detached_dispatch_ids),
            "payload_progress": self.payload_progress,
            "measurement_degraded": {"degraded": bool(self.degraded_components),
                                     "components": list(self.degraded_components)},
            "last_receipt": self.last_receipt,
            "accepted": self.accepted,
            "journal_lines": self.journal_lines,
            "lane": esc.lane,
            "lane_switches": len(esc.switches),
            "fingerprints": list(esc.fingerprints),
            "stagnant_count": esc.stagnant_count,
            "failed_providers": {k: list(v) for k, v in sorted(esc.failed_providers.items())},
            # `weaker` when a dispatch or the last verification ran with --sandbox none
            "sandbox": {"dispatches": self.sandbox_dispatches,
                        "last_receipt": None if self.last_receipt is None else self.last_receipt["sandbox"],
                        "guarantee": self.guarantee},
        }  # fmt: skip


def status(workspace: str, state_dir: str | None = None) -> StatusResult:
    """A read-only report of the workspace's dispatches, receipts and measurement."""
    with gated(workspace, None, state_dir, lock=False) as gate:
        now = time.time()
        budget = gate.task.budget
        opened = _open_dispatches(gate)
        holder = _lock_holder(gate)
        orphans = _orphans(gate, opened, holder)
        acked = {e["dispatch_id"] for e in gate.events if e["event"] == "ack"}
        running = {} if holder is None else {d: e for d, e in opened.items() if d not in orphans and d not in acked}
        stale_after = min(HEARTBEAT_STALE_S, budget.timeout_s)
        progress = {d: _heartbeat(e, now, stale_after) for d, e in opened.items()}
        last_t = float(gate.events[-1]["t"]) if gate.events else 0.0
        beats = [now - p["age_s"] for p in progress.values() if "age_s" in p]
        silence = now - max([last_t, *beats])
        stall_after = max(2 * budget.timeout_s, 3600.0)
        ends = [e for e in gate.events if e["event"] == "dispatch_end"]
        detached = [e["dispatch_id"] for e in ends if e.get("detached_pids")]
        starts = [e for e in gate.events if e["event"] == "dispatch_start"]
        # Tokens and cost are measured only from wire logs: a --command worker has none, and
        # until a --model dispatch has run nothing has been metered.
        degraded = ["tokens", "cost"] if not starts or any(not e.get("wire_log") for e in starts) else []
        if any(e.get("process_tracking") is False for e in ends):
            degraded.append("process_tracking")
        verifies = [e for e in gate.events if e["event"] == "verify"]
        accepts = [e for e in gate.events if e["event"] == "accept"]
        esc = escalation_state(gate.pin["lane"]["lane"], gate.events)
        last_receipt = None
        if verifies:
            v = verifies[-1]
            last_receipt = {k: v[k] for k in ("receipt_id", "passed", "tree", "tamper_detected", "at")}
            last_receipt["sandbox"] = v.get("sandbox", "none")
        kinds = {e["dispatch_id"]: (e.get("sandbox") or {}).get("kind", "none") for e in starts}
        ran = [*kinds.values(), *([last_receipt["sandbox"]] if last_receipt else [])]
        return StatusResult(
            task_id=gate.task.task_id,
            workspace=gate.workspace,
            state_dir=gate.state.root,
            dispatches=len(starts),
            max_dispatches=budget.max_dispatches,
            running_dispatch_ids=tuple(sorted(running)),
            stall_suspected=bool(running) and silence > stall_after,
            silence_s=round(silence, 3),
            stall_after_s=stall_after,
            orphaned_dispatch_ids=tuple(orphans),
            detached_dispatch_ids=tuple(detached),
            payload_progress=progress,
            degraded_components=tuple(degraded),
            last_receipt=last_receipt,
            accepted=bool(accepts) and accepts[-1]["receipt_id"] == (last_receipt or {}).get("receipt_id"),
            journal_lines=len(gate.events),
            escalation=esc,
            sandbox_dispatches=kinds,
            guarantee=guarantee_of(ran) if ran else None,
        )


@dataclass(frozen=True)
class AckResult:
    """The orphaned dispatch `proctor journal --ack` acknowledged."""

    acknowledged: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "acknowledged": self.acknowledged}


@dataclass(frozen=True)
class JournalTail:
    """The last events of a verified journal, and how many lines it holds."""

    journal: str
    lines: int
    events: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "journal": self.journal, "lines": self.lines, "events": list(self.events)}


def acknowledge(workspace: str, dispatch_id: str, state_dir: str | None = None) -> AckResult:
    """Acknowledge an orphaned dispatch so that status stops reporting it."""
    refuse_nested("journal --ack")
    with gated(workspace, None, state_dir) as gate:
        opened = _open_dispatches(gate)
        known = {e["dispatch_id"] for e in gate.events if e["event"] == "dispatch_start"}
        if dispatch_id not in known:
            raise GateRefusal(Code.UNKNOWN_DISPATCH_ID, f"no dispatch {dispatch_id!r} in the journal", gate.state.journal_path)
        if dispatch_id not in opened:
            raise GateRefusal(Code.DISPATCH_NOT_ORPHANED, f"dispatch {dispatch_id!r} ended normally", gate.state.journal_path)
        if any(e["event"] == "ack" and e["dispatch_id"] == dispatch_id for e in gate.events):
            raise GateRefusal(Code.ALREADY_ACKNOWLEDGED, f"dispatch {dispatch_id!r} was acknowledged before", gate.state.journal_path)
        gate.record(AckEvent(dispatch_id))
    return AckResult(dispatch_id)


def journal_tail(workspace: str, state_dir: str | None = None, count: int = 20) -> JournalTail:
    """The last `count` journal events, verified."""
    with gated(workspace, None, state_dir, lock=False) as gate:
        shown = gate.events[-count:] if count > 0 else []
        return JournalTail(gate.state.journal_path, len(gate.events), tuple(shown))
