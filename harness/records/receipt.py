"""Receipts: the gate's `proctor-receipt.v1` and the warm verifier's `proctor-item-receipt.v1`.

The manual: docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code
from harness.records._shape import Fields, kind_is, read, write

__all__ = ["ITEM_RECEIPT_SCHEMA", "RECEIPT_SCHEMA", "ItemReceipt", "Receipt", "SuspiciousLine", "TestResults"]

RECEIPT_SCHEMA: Final = "proctor-receipt.v1"
ITEM_RECEIPT_SCHEMA: Final = "proctor-item-receipt.v1"

_SCHEMA: Final = frozenset({"schema"})
_ADDED: Final = frozenset({"results", Code.SUSPICIOUS_CODE.value, "visible_output_sha256"})
"""Left out when None (issue 14's fields; the scan's field is named as the refusal it leads to)."""
_RECEIPT_LEGACY: Final = frozenset({"fingerprint", "sandbox", "output_truncated_from"})  # absent from receipts made before they were recorded
_MARK: Final = frozenset({"journal_lines", "journal_head", "output_truncated_from"})
"""Left out when None: the journal's mark (absent from older receipts) and an output that was not cut."""


@dataclass(frozen=True)
class TestResults:
    """The proctor's own per-test report compared with the expected ids (`harness.gate.results`)."""

    __test__ = False  # not a pytest class

    kind: str
    ok: bool
    expected: tuple[str, ...]
    reported: int
    not_passed: tuple[str, ...]
    failed: tuple[str, ...]
    ended: bool
    tampered: tuple[str, ...]
    problem: str | None


@dataclass(frozen=True)
class SuspiciousLine:
    """A line of a changed file that matches a known pattern of forging a verdict (`harness.gate.scan`)."""

    path: str
    line: int
    pattern: str


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
    output_truncated_from: int | None = None
    """The output's size before it was cut to `OUTPUT_CAP` (docs/gated-path.md); None: not cut."""
    journal_lines: int | None = None
    """The journal's line count when the receipt was written (its verify event is the next line)."""
    journal_head: str | None = None
    """The sha256 of the journal's last line then: accept notices a shortened or rewritten journal."""
    results: TestResults | None = None
    """The proctor's pytest report against the expected tests; None for a verifier that is not pytest."""
    suspicious_code: tuple[SuspiciousLine, ...] | None = None
    """The static scan's hits (`proctor verify` always records them, maybe none)."""
    visible_output_sha256: str | None = None
    """A failing run with hidden inputs: the output of the verifier run again without them (what a worker may see)."""

    def to_json(self) -> dict[str, Any]:
        return {"schema": RECEIPT_SCHEMA, **write(self, _MARK | _ADDED)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], path: str | None = None) -> Receipt:
        """Read a receipt strictly (`receipt_invalid`); `fingerprint`, `sandbox` and the journal mark
        may be absent (older receipts)."""
        Fields(obj, None, path, Code.RECEIPT_INVALID).shape({"schema": kind_is(RECEIPT_SCHEMA)})
        return read(cls, obj, code=Code.RECEIPT_INVALID, path=path, optional=_RECEIPT_LEGACY, ignore=_SCHEMA)


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
        return {"schema": ITEM_RECEIPT_SCHEMA, **write(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], path: str | None = None) -> ItemReceipt:
        """Read an item receipt (without the runner's own fields) strictly (`receipt_invalid`)."""
        Fields(obj, None, path, Code.RECEIPT_INVALID).shape({"schema": kind_is(ITEM_RECEIPT_SCHEMA)})
        return read(cls, obj, code=Code.RECEIPT_INVALID, path=path, ignore=_SCHEMA)
