"""Receipts: what the proctor verified, on which exact tree, with what result.

A receipt is written once, canonical, and its sha256 is recorded in the
chained journal; reading it back checks those bytes against the journal.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os
from typing import Any

from harness.errors import Code, GateRefusal
from harness.evidence.jsonio import loads_strict, read_bytes, sha256_hex

__all__ = ["RECEIPT_SCHEMA", "load_receipt"]

RECEIPT_SCHEMA = "proctor-receipt.v1"


def load_receipt(path: str | os.PathLike[str], expected_sha256: str) -> dict[str, Any]:
    """Read a receipt and refuse `receipt_tampered` unless its bytes hash as the journal says."""
    raw = read_bytes(path)
    if sha256_hex(raw) != expected_sha256:
        raise GateRefusal(Code.RECEIPT_TAMPERED, "the receipt's bytes differ from those the journal recorded", path)
    receipt: dict[str, Any] = loads_strict(raw, path=path)
    if receipt.get("schema") != RECEIPT_SCHEMA:
        raise GateRefusal(Code.RECEIPT_INVALID, f"expected schema {RECEIPT_SCHEMA}", path)
    return receipt
