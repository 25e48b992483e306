"""The journal's mark (line count and head) in each receipt and task-record row, checked back.

A chained journal cut off at its end, or rewritten with a recomputed chain,
still verifies on its own. Each receipt and each row of the task record
records how many lines the journal had when it was written and the sha256 of
the last one; accept and `record` check every receipt and row against the
journal as it stands: fewer lines is `journal_shortened`, another line there
is `journal_rewritten`. What this does not stop (someone rewriting the
journal, every receipt and the task record together) is on docs/sandbox.md.

The manual: docs/gated-path.md ("Chained logs").
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from harness.errors import Code, GateRefusal
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_bytes, loads_strict, read_bytes, sha256_hex
from harness.gate.workspace import Gate
from harness.records.receipt import Receipt

__all__ = ["check_continuity", "check_mark", "journal_mark"]

_RECEIPT_NAME = re.compile(r"^r[0-9]{4,}\.json$")


def journal_mark(events: Sequence[dict[str, Any]]) -> tuple[int, str | None]:
    """The journal's line count and the sha256 of its last line (None when empty)."""
    return len(events), (sha256_hex(canonical_bytes(events[-1])) if events else None)


def check_mark(gate: Gate, lines: int, head: str | None, what: str, path: str) -> None:
    """Refuse unless the journal still holds the `lines` lines `what` saw, ending in `head`."""
    have = len(gate.events)
    if lines > have:
        raise GateRefusal(
            Code.JOURNAL_SHORTENED,
            f"{what} was written when the journal had {lines} line(s); it now has {have}: lines were cut off its end",
            gate.state.journal_path,
            evidence=path,
            expected_lines=lines,
            lines=have,
        )
    found = journal_mark(gate.events[:lines])[1]
    if found != head:
        raise GateRefusal(
            Code.JOURNAL_REWRITTEN,
            f"{what} was written when the journal's line {lines} hashed {str(head)[:16]}; "
            f"that line now hashes {str(found)[:16]}: the journal was rewritten",
            gate.state.journal_path,
            evidence=path,
            line=lines,
        )


def _receipt_files(gate: Gate) -> list[tuple[str, Receipt]]:
    folder = gate.state.path("receipts")
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if _RECEIPT_NAME.match(name):
            path = os.path.join(folder, name)
            found.append((path, Receipt.from_json(loads_strict(read_bytes(path), path=path), path)))
    return found


def check_continuity(gate: Gate, task_record_seed: str) -> None:
    """Check every receipt on disk and every task-record row against the journal as it stands.

    A receipt the journal names must have its verify event right after its mark.
    Receipts and rows made before marks were recorded carry none and are skipped.
    """
    verifies = {e["receipt_id"]: i for i, e in enumerate(gate.events) if e["event"] == "verify"}
    for path, receipt in _receipt_files(gate):
        if receipt.journal_lines is None:
            continue
        what = f"receipt {receipt.receipt_id}"
        check_mark(gate, receipt.journal_lines, receipt.journal_head, what, path)
        at = verifies.get(receipt.receipt_id)
        if at is not None and at != receipt.journal_lines:
            raise GateRefusal(
                Code.JOURNAL_REWRITTEN,
                f"{what} was written at journal line {receipt.journal_lines + 1}; "
                f"the journal records it at line {at + 1}",
                gate.state.journal_path,
                evidence=path,
                line=at + 1,
            )
    record = gate.state.path("task-record.jsonl")
    if os.path.lexists(record):
        for n, row in enumerate(read_log(record, task_record_seed), start=1):
            if row.get("journal_lines") is not None:
                check_mark(gate, row["journal_lines"], row.get("journal_head"), f"task record line {n}", record)
