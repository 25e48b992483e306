"""The gate's record types (harness.records.receipt, harness.records.task_record): strict and byte-exact."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from harness.errors import Refusal
from harness.evals.verify_humaneval import Extraction, Verdict, verify_receipt
from harness.evidence.jsonio import canonical_bytes
from harness.records.journal import (
    EVENT_TYPES,
    DispatchEnd,
    DispatchStart,
    LaneSwitch,
    VerifyEvent,
    event_from_json,
)
from harness.records.receipt import ITEM_RECEIPT_SCHEMA, RECEIPT_SCHEMA, ItemReceipt, Receipt
from harness.records.task_record import RECORD_SCHEMA, TaskRecord

H = "a" * 64

RECEIPT: dict[str, Any] = {
    "schema": RECEIPT_SCHEMA, "receipt_id": "r0002", "task_id": "wordfreq-case-fold", "task_sha256": H, "tree": H,
    "tree_entries": 5, "tree_excludes": ["__pycache__/", "*.pyc", ".pytest_cache/"], "baseline_tree": H,
    "dispatch_seq": 2, "verifier_argv": ["python", "-m", "pytest", "tests"], "exit_code": 0, "signal": None,
    "timed_out": False, "passed": True, "output_sha256": H, "output_bytes": 98, "fingerprint": None,
    "tamper_detected": False, "tampered_paths": [], "verifier_nondiscriminating": False, "detached_pids": [],
    "sandbox": {"kind": "none", "guarantee": "weaker"}, "started": 1796160786.7450163, "ended": 1796160792.1079757,
    "duration_s": 5.362959,
}  # fmt: skip


def test_a_receipt_reads_back_to_the_same_bytes_and_key_order() -> None:
    receipt = Receipt.from_json(RECEIPT)
    assert receipt.passed and receipt.dispatch_seq == 2
    assert canonical_bytes(receipt.to_json()) == canonical_bytes(RECEIPT)
    assert list(receipt.to_json()) == list(RECEIPT)  # the order `proctor verify` prints


def test_a_receipt_made_before_fingerprints_and_sandboxes_were_recorded_still_reads() -> None:
    old = {k: v for k, v in RECEIPT.items() if k not in ("fingerprint", "sandbox")}
    receipt = Receipt.from_json(old)
    assert receipt.fingerprint is None and receipt.sandbox is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.pop("passed"), "missing passed"),
        (lambda r: r.update(extra=1), "unknown field extra"),
        (lambda r: r.update(passed="yes"), "passed 'yes' is not true or false"),
        (lambda r: r.update(dispatch_seq=True), "dispatch_seq True is not an integer"),
        (lambda r: r.update(tampered_paths=[1]), "tampered_paths [1] is not a list, each a string"),
        (lambda r: r.update(schema="proctor-receipt.v0"), "is not 'proctor-receipt.v1'"),
    ],
)
def test_a_receipt_is_read_strictly(change: Any, says: str) -> None:
    bad = copy.deepcopy(RECEIPT)
    change(bad)
    with pytest.raises(Refusal) as caught:
        Receipt.from_json(bad, "r.json")
    assert caught.value.code == "receipt_invalid" and says in caught.value.message and caught.value.path == "r.json"


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


def test_an_item_receipt_is_built_from_the_record_type_and_reads_back() -> None:
    receipt = verify_receipt(
        suite="humaneval", item="HumanEval/0", response_text="x", extraction=Extraction("def f(): pass", "text-definition"),
        test="def check(f): pass", entry_point="f", verdict=Verdict(True, "passed", "", 0.01), timeout_s=3.0,
        memory_bytes=None, started=1.0, ended=2.0, private_sha256=H, sandbox=None,
    )  # fmt: skip
    assert receipt["schema"] == ITEM_RECEIPT_SCHEMA
    assert ItemReceipt.from_json(receipt).to_json() == receipt
    with pytest.raises(Refusal, match="unknown field run_id"):
        ItemReceipt.from_json({**receipt, "run_id": "x"})


# --- journal events (harness.records.journal) ----------------------------------------------------------------

STAMP = {"t": 1.5, "at": "2026-12-01T21:00:00.000000Z", "prev": H}
LINES: list[dict[str, Any]] = [
    {"event": "init", "task_id": "t", "task_sha256": H, "pin_sha256": H, "baseline_tree": H, "sealed": ["a.py"],
     "hidden": ["tests/h.py"], "lane": "flash", "seed": "proctor-journal:t:ws-0"},
    {"event": "dispatch_start", "dispatch_id": "d001-0a0b0c0d", "seq": 1, "argv": ["w"], "lane": "glm",
     "proctor_pid": 7, "prompt_sha256": H, "heartbeat": "/h.json", "timeout_s": 60.0, "preflight": [],
     "evidence_file": None, "sandbox": {"kind": "bwrap"}, "model": "sim-glm", "api_model": "glm", "provider": "sim",
     "api_shape": "openai-chat", "pricing_key": "glm", "model_choice": {"mode": "auto"},
     "catalog": {"path": "c.toml", "sha256": H}, "upstream": "http://x", "metering": "proxy",
     "worker_network": "proxy", "wire_log": "/w.jsonl", "wire_name": "t/d001"},
    {"event": "dispatch_end", "dispatch_id": "d001-0a0b0c0d", "seq": 1, "output_sha256": H, "tree_after": H,
     "provider_failure": False, "wire": {"path": "/w.jsonl", "lines": 2}, "exit_code": 0, "signal": None,
     "timed_out": False, "duration_s": 1.0, "cpu_s": 0.5, "detached_pids": [], "process_tracking": True},
    {"event": "dispatch_end", "dispatch_id": "d002-0a0b0c0d", "seq": 2, "spawn_error": "no such file",
     "detached_pids": []},
    {"event": "lane_switch", "from": "glm", "to": "k3", "reason": "stagnation", "fingerprint": H, "stagnant_count": 3,
     "receipt_ids": ["r0001", "r0002", "r0003"], "dispatch_id": "d004-0a0b0c0d", "evidence_file": "/e.json",
     "evidence_sha256": H},
    {"event": "provider_switch", "dispatch_id": "d005-0a0b0c0d", "from_provider": "a", "to_provider": "b",
     "model": "m", "lane": "glm", "reason": "provider failure"},
    {"event": "state_tampered", "dispatch_id": "d001-0a0b0c0d", "paths": ["/s/pin.json"], "wire_log": "forged"},
    {"event": "tamper", "paths": ["tests/test_visible.py"], "action": "restored"},
    {"event": "verify", "receipt_id": "r0001", "receipt_sha256": H, "passed": False, "tree": H,
     "tamper_detected": False, "dispatch_seq": 1, "fingerprint": H, "sandbox": "bwrap"},
    {"event": "override", "override": "allow_zero_dispatch", "receipt_id": "r0001"},
    {"event": "accept", "receipt_id": "r0001", "tree": H, "dispatch_seq": 0, "overrides": [], "guarantee": "sandboxed"},
    {"event": "ack", "dispatch_id": "d001-0a0b0c0d"},
    {"event": "record", "line": 1, "row_sha256": H, "cost_status": "metered"},
    {"event": "refused", "action": "accept", "refusal": "receipt_missing", "message": "no receipt"},
]  # fmt: skip


def test_every_kind_of_journal_event_is_covered() -> None:
    assert {line["event"] for line in LINES} == set(EVENT_TYPES)


@pytest.mark.parametrize("line", LINES, ids=[f"{i}-{line['event']}" for i, line in enumerate(LINES)])
def test_a_journal_line_reads_back_to_the_same_bytes(line: dict[str, Any]) -> None:
    full = {**line, **STAMP}
    event = event_from_json(full)
    assert line["event"] == event.KIND
    back = {"event": event.KIND, **event.fields(), **{k: v for k, v in full.items() if k in ("t", "at", "prev", "seed")}}
    assert canonical_bytes(back) == canonical_bytes(full)


def test_typed_journal_events_carry_their_fields() -> None:
    start = event_from_json({**LINES[1], **STAMP})
    assert isinstance(start, DispatchStart) and start.model is not None and start.model["provider"] == "sim"
    spawn = event_from_json({**LINES[3], **STAMP})
    assert isinstance(spawn, DispatchEnd) and spawn.spawn_error and spawn.process is None
    switch = event_from_json({**LINES[4], **STAMP})
    assert isinstance(switch, LaneSwitch) and (switch.from_lane, switch.to_lane) == ("glm", "k3")
    assert switch.fields()["from"] == "glm"


def test_an_older_verify_event_without_fingerprint_or_sandbox_still_reads() -> None:
    old = {k: v for k, v in LINES[8].items() if k not in ("fingerprint", "sandbox")}
    event = event_from_json({**old, **STAMP})
    assert isinstance(event, VerifyEvent) and event.fingerprint is None and event.sandbox is None


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ({"event": "nope"}, "unknown journal event"),
        ({**LINES[11], "extra": 1}, "unknown field extra"),
        ({"event": "ack"}, "missing dispatch_id"),
        ({**LINES[12], "line": "1"}, "line '1' is not an integer"),
        ({**LINES[8], "passed": 1}, "passed 1 is not true or false"),
    ],
)
def test_a_journal_line_is_read_strictly(line: dict[str, Any], says: str) -> None:
    with pytest.raises(Refusal) as caught:
        event_from_json({**line, **STAMP}, "journal.jsonl")
    assert caught.value.code == "log_record_invalid" and says in caught.value.message
