"""Receipts: the gate's `proctor-receipt.v1` and the warm verifier's `proctor-item-receipt.v1`.

A gated receipt says what `proctor verify` checked, on which exact tree, with
what result; an item receipt says how one answer to an eval item was checked.
Both are written canonical once; `to_json` gives today's keys in the order
the CLI prints them, `from_json` reads them back strictly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from harness.records._typed import Fields

__all__ = ["ITEM_RECEIPT_SCHEMA", "RECEIPT_SCHEMA", "ItemReceipt", "Receipt"]

RECEIPT_SCHEMA: Final = "proctor-receipt.v1"
ITEM_RECEIPT_SCHEMA: Final = "proctor-item-receipt.v1"

_RECEIPT_KEYS: Final = (
    "schema", "receipt_id", "task_id", "task_sha256", "tree", "tree_entries", "tree_excludes", "baseline_tree",
    "dispatch_seq", "verifier_argv", "exit_code", "signal", "timed_out", "passed", "output_sha256", "output_bytes",
    "fingerprint", "tamper_detected", "tampered_paths", "verifier_nondiscriminating", "detached_pids", "sandbox",
    "started", "ended", "duration_s",
)  # fmt: skip
_RECEIPT_OPTIONAL: Final = ("fingerprint", "sandbox")  # absent from receipts made before they were recorded


@dataclass(frozen=True)
class Receipt:
    """One `proctor verify` run: the tree it checked, the verifier's exit, tampering, sandbox, times."""

    receipt_id: str
    task_id: str
    task_sha256: str
    tree: str
    tree_entries: int
    tree_excludes: tuple[str, ...]
    baseline_tree: str
    dispatch_seq: int
    verifier_argv: tuple[str, ...]
    exit_code: int | None
    signal: int | None
    timed_out: bool
    passed: bool
    output_sha256: str
    output_bytes: int
    fingerprint: str | None
    tamper_detected: bool
    tampered_paths: tuple[str, ...]
    verifier_nondiscriminating: bool
    detached_pids: tuple[int, ...]
    sandbox: dict[str, Any] | None
    started: float
    ended: float
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RECEIPT_SCHEMA,
            "receipt_id": self.receipt_id,
            "task_id": self.task_id,
            "task_sha256": self.task_sha256,
            "tree": self.tree,
            "tree_entries": self.tree_entries,
            "tree_excludes": list(self.tree_excludes),
            "baseline_tree": self.baseline_tree,
            "dispatch_seq": self.dispatch_seq,
            "verifier_argv": list(self.verifier_argv),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "passed": self.passed,
            "output_sha256": self.output_sha256,
            "output_bytes": self.output_bytes,
            "fingerprint": self.fingerprint,
            "tamper_detected": self.tamper_detected,
            "tampered_paths": list(self.tampered_paths),
            "verifier_nondiscriminating": self.verifier_nondiscriminating,
            "detached_pids": list(self.detached_pids),
            "sandbox": self.sandbox,
            "started": self.started,
            "ended": self.ended,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_json(cls, obj: object, path: str | None = None) -> Receipt:
        """Read a receipt strictly; `receipt_invalid` names the first problem."""
        f = Fields(obj, "receipt_invalid", path, "receipt")
        if f.obj.get("schema") != RECEIPT_SCHEMA:
            raise f.bad("schema", RECEIPT_SCHEMA)
        f.keys([k for k in _RECEIPT_KEYS if k not in _RECEIPT_OPTIONAL], _RECEIPT_OPTIONAL)
        return cls(
            receipt_id=f.text("receipt_id"),
            task_id=f.text("task_id"),
            task_sha256=f.text("task_sha256"),
            tree=f.text("tree"),
            tree_entries=f.integer("tree_entries"),
            tree_excludes=f.texts("tree_excludes"),
            baseline_tree=f.text("baseline_tree"),
            dispatch_seq=f.integer("dispatch_seq"),
            verifier_argv=f.texts("verifier_argv"),
            exit_code=f.opt_integer("exit_code"),
            signal=f.opt_integer("signal"),
            timed_out=f.flag("timed_out"),
            passed=f.flag("passed"),
            output_sha256=f.text("output_sha256"),
            output_bytes=f.integer("output_bytes"),
            fingerprint=f.opt_text("fingerprint"),
            tamper_detected=f.flag("tamper_detected"),
            tampered_paths=f.texts("tampered_paths"),
            verifier_nondiscriminating=f.flag("verifier_nondiscriminating"),
            detached_pids=f.integers("detached_pids"),
            sandbox=f.obj_or_none("sandbox"),
            started=f.number("started"),
            ended=f.number("ended"),
            duration_s=f.number("duration_s"),
        )


_ITEM_KEYS: Final = (
    "schema", "suite", "private_sha256", "item", "entry_point", "response_sha256", "extraction_rule",
    "program_sha256", "test_sha256", "check_program_sha256", "verdict", "passed", "timeout_s", "memory_bytes",
    "started", "ended", "started_at", "ended_at", "verifier", "sandbox",
)  # fmt: skip


@dataclass(frozen=True)
class ItemReceipt:
    """How one answer to an eval item was checked: what by hash, the rule, limits, worker, verdict, times."""

    suite: str
    private_sha256: str | None
    item: str
    entry_point: str
    response_sha256: str
    extraction_rule: str
    program_sha256: str
    test_sha256: str
    check_program_sha256: str
    verdict: dict[str, Any]
    passed: bool
    timeout_s: float
    memory_bytes: int | None
    started: float
    ended: float
    started_at: str
    ended_at: str
    verifier: dict[str, Any]
    sandbox: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": ITEM_RECEIPT_SCHEMA,
            "suite": self.suite,
            "private_sha256": self.private_sha256,
            "item": self.item,
            "entry_point": self.entry_point,
            "response_sha256": self.response_sha256,
            "extraction_rule": self.extraction_rule,
            "program_sha256": self.program_sha256,
            "test_sha256": self.test_sha256,
            "check_program_sha256": self.check_program_sha256,
            "verdict": self.verdict,
            "passed": self.passed,
            "timeout_s": self.timeout_s,
            "memory_bytes": self.memory_bytes,
            "started": self.started,
            "ended": self.ended,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "verifier": self.verifier,
            "sandbox": self.sandbox,
        }

    @classmethod
    def from_json(cls, obj: object, path: str | None = None) -> ItemReceipt:
        """Read an item receipt (without the runner's own fields) strictly."""
        f = Fields(obj, "receipt_invalid", path, "item receipt")
        if f.obj.get("schema") != ITEM_RECEIPT_SCHEMA:
            raise f.bad("schema", ITEM_RECEIPT_SCHEMA)
        f.keys(_ITEM_KEYS)
        return cls(
            suite=f.text("suite"),
            private_sha256=f.opt_text("private_sha256"),
            item=f.text("item"),
            entry_point=f.text("entry_point"),
            response_sha256=f.text("response_sha256"),
            extraction_rule=f.text("extraction_rule"),
            program_sha256=f.text("program_sha256"),
            test_sha256=f.text("test_sha256"),
            check_program_sha256=f.text("check_program_sha256"),
            verdict=f.object("verdict"),
            passed=f.flag("passed"),
            timeout_s=f.number("timeout_s"),
            memory_bytes=f.opt_integer("memory_bytes"),
            started=f.number("started"),
            ended=f.number("ended"),
            started_at=f.text("started_at"),
            ended_at=f.text("ended_at"),
            verifier=f.object("verifier"),
            sandbox=f.obj_or_none("sandbox"),
        )
