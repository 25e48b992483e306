"""A repository-task attempt's work record with a live cascade (`CascadeWork`): declared once, read strictly."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from harness.errors import Refusal
from harness.records.work import AttemptWork, CascadeGate, CascadeStep, CascadeWork, step_wire

GATE = CascadeGate(passed=False, exit_code=1, timed_out=False, duration_s=1.5, output_sha256="a" * 64)


def _work(cascade: CascadeWork | None) -> AttemptWork:
    files = {"wire.jsonl": "b" * 64, "wire.s2.jsonl": "c" * 64, "gate.s1.output": "d" * 64}
    return AttemptWork(kind="repo-task-work.v1", folder="work/r.r0.a1", dispatch_id="d002-x", exit_code=0,
                       timed_out=False, provider_failure=False, exchanges=2, files=files, passed=True,
                       refusal=None, queued_s=0.0, cascade=cascade)


CASCADE = CascadeWork(systems=("cheap", "strong"), steps=(
    CascadeStep(system="cheap", model="sim-flash", dispatch_id="d001-x", exit_code=0, timed_out=False, exchanges=1,
                cost_usd=0.001, wire="wire.jsonl", budget_stop=False, gate=GATE),
    CascadeStep(system="strong", model="sim-k3", dispatch_id="d002-x", exit_code=0, timed_out=False, exchanges=1,
                cost_usd=None, wire="wire.s2.jsonl", budget_stop=False, gate=None)))


def test_a_cascade_round_trips_and_a_single_arm_s_work_has_no_cascade_key() -> None:
    doc = _work(CASCADE).to_json()
    assert AttemptWork.from_json(doc) == _work(CASCADE)
    assert doc["cascade"]["steps"][0]["gate"]["passed"] is False and doc["cascade"]["systems"] == ["cheap", "strong"]
    plain = _work(None).to_json()
    assert "cascade" not in plain and AttemptWork.from_json(plain).cascade is None


@pytest.mark.parametrize("change", [
    lambda d: d["cascade"].pop("systems"),
    lambda d: d["cascade"]["steps"][0].update(cost_usd="0.1"),
    lambda d: d["cascade"]["steps"][0]["gate"].update(passed="no"),
    lambda d: d["cascade"].update(extra=1),
    lambda d: d["files"].update({"wire.s9.jsonl": "e" * 64}),
    lambda d: d["cascade"]["steps"][0].update(switch_class="stagnation"),
    lambda d: d["cascade"]["steps"][0]["gate"].update(tests_failing="t.py::test_x"),
    lambda d: d["files"].update({"gate.s3.output": "e" * 64}),  # a gate after a third step of two recorded
    lambda d: d["cascade"]["steps"][1].update(wire="wire.jsonl"),
    lambda d: d["cascade"].update(steps=[]),
    lambda d: d["cascade"]["steps"][0]["gate"].update(extra=True),
    lambda d: d["cascade"]["steps"][1].update(surplus=0),
])
def test_a_bad_cascade_is_refused_and_its_nested_objects_are_read_exactly(change: Any) -> None:
    doc = _work(CASCADE).to_json()
    change(doc)
    with pytest.raises(Refusal) as caught:
        AttemptWork.from_json(doc)
    assert caught.value.code == "attempt_invalid"


def test_step_wire_names() -> None:
    assert [step_wire(n) for n in (1, 2, 3)] == ["wire.jsonl", "wire.s2.jsonl", "wire.s3.jsonl"]


def test_a_cascade_record_from_before_targeted_repairs_still_reads() -> None:
    # committed results carry no switch_class and no per-test gate fields: they read with the defaults
    doc = _work(CASCADE).to_json()
    for step in doc["cascade"]["steps"]:
        del step["switch_class"]
    for key in ("fingerprint", "tests_expected", "tests_failing"):
        del doc["cascade"]["steps"][0]["gate"][key]
    read = AttemptWork.from_json(doc)
    assert read == _work(CASCADE) and read.cascade is not None and read.cascade.steps[0].switch_class is None


def test_a_repaired_step_round_trips_with_its_class_and_the_gate_s_per_test_report() -> None:
    gate = CascadeGate(passed=False, exit_code=1, timed_out=False, duration_s=1.0, output_sha256="a" * 64,
                       fingerprint="f" * 64, tests_expected=9, tests_failing=("t.py::test_x",))
    first, last = CASCADE.steps
    steps = (replace(first, gate=gate, switch_class="first"), replace(first, switch_class="localized_defect", wire=None),
             replace(last, wire="wire.s3.jsonl", switch_class="escalation"))
    work = replace(_work(CascadeWork(systems=("cheap", "strong"), steps=steps)),
                   files={"wire.jsonl": "b" * 64, "wire.s3.jsonl": "c" * 64, "gate.s2.output": "d" * 64})
    doc = work.to_json()
    assert doc["cascade"]["steps"][0]["gate"]["tests_failing"] == ["t.py::test_x"]
    assert AttemptWork.from_json(doc) == work
