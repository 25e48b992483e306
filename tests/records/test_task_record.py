"""Task-record rows (harness.records.task_record): today's keys in today's order, read strictly."""

from __future__ import annotations

from typing import Any

import pytest

from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes
from harness.records.task_record import RECORD_SCHEMA, TaskRecord

H = "a" * 64

BASE_ROW: dict[str, Any] = {
    "schema": RECORD_SCHEMA, "task_id": "t", "task_sha256": H, "lane": "flash", "initial_lane": "flash",
    "lane_switches": [], "dispatches": {"count": 1, "ids": ["d001-0a0b0c0d"], "models": [None], "lanes": ["flash"]},
    "receipt": {"receipt_id": "r0001", "sha256": H, "passed": True, "tree": H, "dispatch_seq": 1, "fingerprint": None},
    "accept": {"state": "accepted", "receipt_id": "r0001", "tree": H},
}  # fmt: skip
FLAT_ROW = {**BASE_ROW, "metering": "flat_rate", "wire_source": None, "note": "dispatched without a wire log",
            "tokens": None, "cost": None, "known_cost": None, "cost_status": "flat_rate", "usage_unknown": 0,
            "price_unknown": 0, "unmetered_dispatch_ids": ["d001-0a0b0c0d"]}  # fmt: skip
NONE_ROW = {**BASE_ROW, "metering": "none", "wire_source": None, "tokens": None, "cost": 0.0, "known_cost": 0.0,
            "cost_status": "no_dispatch", "usage_unknown": 0, "price_unknown": 0}  # fmt: skip
WIRE_ROW = {**BASE_ROW, "metering": "wire", "wire_source": "journal",
            "wire_logs": [{"path": "/w.jsonl", "dispatch_id": "d001-0a0b0c0d", "lines": 2, "head": H}],
            "pricing": {"path": "p.toml", "sha256": H, "notional": True}, "exchanges": 2, "errors_unbilled": 0,
            "not_metered": 0, "tokens": {"input": 10, "output": 5}, "cost": None, "known_cost": 0.25,
            "cost_status": "partial", "usage_unknown": 0, "price_unknown": 0, "by_model": {"m": {"exchanges": 2}},
            "unmetered_dispatch_ids": ["d002-0a0b0c0d"]}  # fmt: skip


@pytest.mark.parametrize("row", [FLAT_ROW, NONE_ROW, WIRE_ROW], ids=["flat_rate", "none", "wire"])
def test_a_task_record_row_reads_back_to_the_same_keys_in_the_same_order(row: dict[str, Any]) -> None:
    chained = {**row, "prev": H}  # as the chained log holds it
    record = TaskRecord.from_json(chained)
    assert list(record.to_json()) == list(row)
    assert canonical_bytes(record.to_json()) == canonical_bytes(row)


def test_a_task_record_row_is_read_strictly() -> None:
    with pytest.raises(Refusal) as caught:
        TaskRecord.from_json({**NONE_ROW, "wire_logs": []}, "task-record.jsonl")
    assert caught.value.code == "log_record_invalid" and "unknown field wire_logs" in caught.value.message
    with pytest.raises(Refusal, match="missing by_model"):
        TaskRecord.from_json({k: v for k, v in WIRE_ROW.items() if k != "by_model"})
