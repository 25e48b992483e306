"""Journal events (harness.records.journal): every kind reads back to the same bytes, strictly."""

from __future__ import annotations

from typing import Any

import pytest

from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes
from harness.records.journal import (
    EVENT_TYPES,
    DispatchEnd,
    DispatchStart,
    LaneSwitch,
    TargetedRepair,
    VerifyEvent,
    event_from_json,
)

H = "a" * 64

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
    {"event": "purge", "action": "verify", "paths": ["wordfreq/__pycache__", "stray.pyc"]},
    {"event": "targeted_repair", "dispatch_id": "d002-0a0b0c0d", "lane": "flash", "model": "m", "reason": "localized",
     "receipt_id": "r0001", "fingerprint": H, "failing_tests": ["tests/t.py::test_a"], "tests_expected": 8,
     "repair": 1, "evidence_file": "/e.json", "evidence_sha256": H, "switch_class": "localized_defect"},
    {"event": "verify", "receipt_id": "r0002", "receipt_sha256": H, "passed": False, "tree": H,
     "tamper_detected": False, "dispatch_seq": 2, "fingerprint": H, "sandbox": "bwrap", "tests_expected": 8,
     "tests_failing": ["tests/t.py::test_a"]},
    {"event": "lane_switch", "from": "glm", "to": "k3", "reason": "stagnation", "fingerprint": H, "stagnant_count": 3,
     "receipt_ids": ["r0001", "r0002", "r0003"], "dispatch_id": "d004-0a0b0c0d", "evidence_file": "/e.json",
     "evidence_sha256": H, "switch_class": "stagnation"},
    {"event": "provider_switch", "dispatch_id": "d005-0a0b0c0d", "from_provider": "a", "to_provider": "b",
     "model": "m", "lane": "glm", "reason": "provider failure", "switch_class": "provider_failure"},
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


def test_switch_events_name_their_class_and_older_lines_read_without_it() -> None:
    repair = event_from_json({**LINES[15], **STAMP})
    assert isinstance(repair, TargetedRepair) and repair.switch_class == "localized_defect"
    assert repair.failing_tests == ("tests/t.py::test_a",)
    verify = event_from_json({**LINES[16], **STAMP})
    assert isinstance(verify, VerifyEvent) and verify.tests_expected == 8
    assert event_from_json({**LINES[17], **STAMP}).fields()["switch_class"] == "stagnation"
    older = event_from_json({**LINES[4], **STAMP})
    assert isinstance(older, LaneSwitch) and older.switch_class is None and "switch_class" not in older.fields()
    assert "tests_expected" not in event_from_json({**LINES[8], **STAMP}).fields()


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
