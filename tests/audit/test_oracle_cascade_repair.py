"""The oracle's replay of the switch rule on a live cascade's recorded gates (rule `work`, issue 17 item 9): a
targeted repair is justified only by a localized defect on the gate before it, in an arm that registered it."""

from __future__ import annotations

from dataclasses import replace

from harness.audit.oracle.work import _repair_problems
from harness.records.work import CascadeGate, CascadeStep

LOCALIZED = CascadeGate(passed=False, exit_code=1, timed_out=False, duration_s=1.0, output_sha256="a" * 64,
                        fingerprint="f" * 64, tests_expected=8, tests_failing=("t.py::test_x",))
CHEAP = CascadeStep(system="cheap", model="m", dispatch_id="d1", exit_code=0, timed_out=False, exchanges=1,
                    cost_usd=0.001, wire="wire.jsonl", budget_stop=False, gate=LOCALIZED, switch_class="first")
REPAIR = replace(CHEAP, wire="wire.s2.jsonl", switch_class="localized_defect",
                 gate=replace(LOCALIZED, passed=True, fingerprint=None, tests_failing=()))
STRONG = replace(CHEAP, system="strong", wire="wire.s2.jsonl", gate=None, switch_class="escalation")


def test_a_repair_after_a_localized_defect_in_a_registered_arm_is_clean() -> None:
    assert _repair_problems((CHEAP, REPAIR), True) == []
    assert _repair_problems((CHEAP, STRONG), False) == []
    assert _repair_problems((CHEAP, REPAIR), None) == []  # no preregistration: the rule alone is replayed


def test_a_repair_the_gate_does_not_justify_is_caught() -> None:
    broad = replace(CHEAP, gate=replace(LOCALIZED, tests_failing=("t.py::a", "t.py::b", "t.py::c")))
    (problem,) = _repair_problems((broad, REPAIR), True)
    assert "found no localized defect" in problem and "'continue'" in problem
    seen = replace(REPAIR, gate=LOCALIZED)  # the same fingerprint twice: a third cheap step is not a repair
    assert any("step 3" in p for p in _repair_problems((CHEAP, seen, replace(seen, wire="wire.s3.jsonl")), True))


def test_a_repair_in_an_arm_that_did_not_register_it_is_caught() -> None:
    assert any("did not register targeted_repair" in p for p in _repair_problems((CHEAP, REPAIR), False))


def test_a_step_whose_class_is_not_its_place_is_caught() -> None:
    (problem,) = _repair_problems((CHEAP, replace(STRONG, switch_class="localized_defect")), True)
    assert "step 2 (strong) has switch_class 'localized_defect'" in problem
    old = (replace(CHEAP, switch_class=None), replace(STRONG, switch_class=None))  # records from before
    assert _repair_problems(old, False) == []
