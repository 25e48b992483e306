"""`proctor accept`: accept only a passing, untampered receipt for the tree as it is now.

A receipt the static scan flagged (`suspicious_code`, `harness.gate.scan`) is
refused unless `allow_flagged` (a reviewed, counted override).

An accept also says under which sandbox the receipt's verifier and every
dispatch ran (`harness.workers.sandbox`): `guarantee` is `sandboxed` only
when all of them ran under bwrap, and `weaker` when any ran with
`--sandbox none` (recorded in the journal's accept event too).

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal
from harness.evidence.tree_entry import signature_of
from harness.gate.baseline import baseline_entries
from harness.gate.continuity import check_continuity
from harness.gate.receipts import load_receipt
from harness.gate.record import record_seed
from harness.gate.scope import check_scope, scan_purged
from harness.gate.state import refuse_nested
from harness.gate.workspace import check_pin, gated
from harness.records.journal import AcceptEvent, OverrideEvent
from harness.workers.sandbox import guarantee_of

__all__ = ["AcceptResult", "SandboxSummary", "accept", "sandbox_summary"]


@dataclass(frozen=True)
class SandboxSummary:
    """Under which sandbox the receipt's verifier and each dispatch ran, and the guarantee that leaves."""

    verify: str
    dispatches: dict[str, str]
    guarantee: str
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verify": self.verify, "dispatches": dict(self.dispatches), "guarantee": self.guarantee}
        if self.note is not None:
            out["note"] = self.note
        return out


def sandbox_summary(receipt_sandbox: Mapping[str, Any] | None, starts: Sequence[Mapping[str, Any]]) -> SandboxSummary:
    """Under which sandbox the receipt's verifier and each dispatch ran, and the guarantee that leaves.

    A record without a sandbox (made before sandboxes were recorded) counts as `none`.
    """
    verify_kind = str((receipt_sandbox or {}).get("kind", "none"))
    dispatches = {str(e["dispatch_id"]): str((e.get("sandbox") or {}).get("kind", "none")) for e in starts}
    guarantee = guarantee_of([verify_kind, *dispatches.values()])
    if guarantee != "weaker":
        return SandboxSummary(verify_kind, dispatches, guarantee)
    unsandboxed = (["the verifier"] if verify_kind != "bwrap" else []) + [
        f"dispatch {d}" for d, k in dispatches.items() if k != "bwrap"
    ]
    note = (
        f"{', '.join(unsandboxed)} ran without a sandbox (--sandbox none): a worker could read the hidden "
        "tests and reach the network and the state folder as the proctor's user; only the proctor's own "
        "checks stood between it and the evidence"
    )
    return SandboxSummary(verify_kind, dispatches, guarantee, note)


@dataclass(frozen=True)
class AcceptResult:
    """What `proctor accept` accepted: the receipt, the tree, the overrides used, the sandbox guarantee."""

    task_id: str
    receipt_id: str
    tree: str
    dispatches: int
    overrides: tuple[str, ...]
    overrides_total: int
    sandbox: SandboxSummary

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "accepted": True,
            "task_id": self.task_id,
            "receipt_id": self.receipt_id,
            "tree": self.tree,
            "dispatches": self.dispatches,
            "overrides": list(self.overrides),
            "overrides_total": self.overrides_total,
            "sandbox": self.sandbox.to_json(),
        }


def accept(
    workspace: str,
    task_path: str,
    *,
    allow_zero_dispatch: bool = False,
    allow_detached_payload: bool = False,
    allow_flagged: bool = False,
    state_dir: str | None = None,
) -> AcceptResult:
    """Accept the workspace's current tree on the strength of its last receipt, or refuse."""
    refuse_nested("accept")
    with gated(workspace, task_path, state_dir) as gate, gate.journaling_refusals("accept"):
        check_pin(gate.task, gate.pin)
        check_continuity(gate, record_seed(gate))
        git_refused = [
            e for e in gate.events
            if e["event"] == "refused" and e["action"] == "dispatch" and e["refusal"] == Code.GIT_DIR_CHANGED
        ]  # fmt: skip
        if git_refused:
            raise GateRefusal(
                Code.GIT_DIR_CHANGED,
                f"a worker changed the workspace's .git ({len(git_refused)} dispatches): nothing it left is accepted",
                os.path.join(gate.workspace, ".git"),
            )
        verifies = [e for e in gate.events if e["event"] == "verify"]
        if not verifies:
            raise GateRefusal(Code.RECEIPT_MISSING, "no receipt: run `proctor verify` first", gate.workspace)
        last = verifies[-1]
        path = gate.state.path("receipts", f"{last['receipt_id']}.json")
        receipt = load_receipt(path, last["receipt_sha256"])
        if not receipt.passed:
            raise GateRefusal(Code.RECEIPT_NOT_PASSING, f"receipt {receipt.receipt_id} did not pass", path)
        if receipt.tamper_detected:
            raise GateRefusal(
                Code.TAMPER_DETECTED,
                f"sealed inputs were tampered with and restored: {', '.join(receipt.tampered_paths)}",
                path,
                paths=list(receipt.tampered_paths),
            )
        dispatches = [e for e in gate.events if e["event"] == "dispatch_start"]
        latest_seq = dispatches[-1]["seq"] if dispatches else 0
        if latest_seq != receipt.dispatch_seq:
            raise GateRefusal(
                Code.DISPATCH_AFTER_RECEIPT,
                f"dispatch {latest_seq} ran after receipt {receipt.receipt_id}; verify again",
                path,
            )
        current = scan_purged(gate, "accept")
        tree = signature_of(current)
        if tree.digest != receipt.tree:
            raise GateRefusal(Code.RECEIPT_STALE, "the workspace changed since the receipt; verify again", gate.workspace)
        check_scope(gate, baseline_entries(gate), current, gate.workspace)
        overrides = []
        if latest_seq == 0 and receipt.verifier_nondiscriminating:
            if not allow_zero_dispatch:
                raise GateRefusal(
                    Code.ZERO_DISPATCH_NONDISCRIMINATING,
                    "nothing was dispatched and the verifier passes on the untouched baseline",
                    path,
                )
            overrides.append("allow_zero_dispatch")
        ends = [e for e in gate.events if e["event"] == "dispatch_end" and e.get("detached_pids")]
        if ends:
            detached = [e["dispatch_id"] for e in ends]
            if not allow_detached_payload:
                raise GateRefusal(
                    Code.DETACHED_PAYLOAD,
                    f"processes outlived dispatches {', '.join(detached)}",
                    gate.workspace,
                    dispatch_ids=detached,
                )
            overrides.append("allow_detached_payload")
        if receipt.suspicious_code:
            hits = receipt.suspicious_code
            flagged = [f"{s.path}:{s.line}: {s.pattern}" for s in hits]
            if not allow_flagged:
                raise GateRefusal(
                    Code.SUSPICIOUS_CODE,
                    f"the static scan flagged changed code (review it, then --allow-flagged): {'; '.join(flagged)}",
                    path,
                    flagged=[{"path": s.path, "line": s.line, "pattern": s.pattern} for s in hits],
                )
            overrides.append("allow_flagged")
        for name in overrides:
            gate.record(OverrideEvent(override=name, receipt_id=receipt.receipt_id))
        sandboxes = sandbox_summary(receipt.sandbox, dispatches)
        gate.record(
            AcceptEvent(
                receipt_id=receipt.receipt_id,
                tree=tree.digest,
                dispatch_seq=latest_seq,
                overrides=tuple(overrides),
                guarantee=sandboxes.guarantee,
            )
        )
    return AcceptResult(
        task_id=gate.task.task_id,
        receipt_id=receipt.receipt_id,
        tree=tree.digest,
        dispatches=latest_seq,
        overrides=tuple(overrides),
        overrides_total=sum(1 for e in gate.events if e["event"] == "override"),
        sandbox=sandboxes,
    )
