"""Reading a gated receipt back: its bytes must hash as the journal recorded.

The record type is `harness.records.receipt.Receipt`; a receipt is written
once, canonical, and its sha256 is recorded in the chained journal.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os

from harness.errors import Code, GateRefusal
from harness.evidence.jsonio import loads_strict, read_bytes, sha256_hex
from harness.records.receipt import RECEIPT_SCHEMA, Receipt

__all__ = ["RECEIPT_SCHEMA", "load_receipt"]


def load_receipt(path: str | os.PathLike[str], expected_sha256: str) -> Receipt:
    """Read a receipt and refuse `receipt_tampered` unless its bytes hash as the journal says."""
    raw = read_bytes(path)
    if sha256_hex(raw) != expected_sha256:
        raise GateRefusal(Code.RECEIPT_TAMPERED, "the receipt's bytes differ from those the journal recorded", path)
    receipt = loads_strict(raw, path=path)
    if receipt.get("schema") != RECEIPT_SCHEMA:
        raise GateRefusal(Code.RECEIPT_INVALID, f"expected schema {RECEIPT_SCHEMA}", path)
    return Receipt.from_json(receipt, os.fspath(path))
