"""Live cascades beside composed ones (`harness.analysis.cascade`) on hand-built steps with known numbers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from harness.analysis.cascade import LIVE_CASCADE_SCHEMA, LiveCascade, LiveStep, live_cascade_rows
from harness.audit.frame import TOKEN_COLUMNS
from harness.prereg.design import load_design
from tests.support.design import write_prereg

SCHEMA: dict[str, Any] = {"study": pl.String, "stage": pl.String, "system": pl.String, "arm": pl.String,
                          "item": pl.String, "repeat": pl.Int64, "run_id": pl.String, "passed": pl.Boolean,
                          "cost_usd": pl.Float64, "latency_s": pl.Float64, **{n: pl.Int64 for n in TOKEN_COLUMNS},
                          "lane": pl.String}


def attempts(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A scored-attempts frame of stage `pilot`, arm `single`; unspecified columns get plain defaults."""
    defaults: dict[str, Any] = {"study": "s", "stage": "pilot", "arm": "single", "repeat": 0, "run_id": "r1",
                                "latency_s": 1.0, "lane": "a", **{n: 0 for n in TOKEN_COLUMNS}}
    return pl.DataFrame([{**defaults, **row} for row in rows], schema=SCHEMA)


def _design(tmp_path: Path, single_in_stage: bool = True):  # type: ignore[no-untyped-def]
    def apply(doc):  # type: ignore[no-untyped-def]
        doc["arms"] = [{"id": "single", "template": "{prompt}"},
                       {"id": "cascade", "template": "{prompt}", "cascade": ["cheap", "strong"]}]
        arms = ["single", "cascade"] if single_in_stage else ["cascade"]
        doc["stages"] = [{"id": "pilot", "systems": ["cheap", "strong"], "arms": arms, "items": 4, "repeats": 1}]
        doc["analysis"]["comparisons"] = [{"a": "cheap", "b": "strong", "arm": "single", "margin": 0.1,
                                           "expected_a": 0.6, "expected_b": 0.65, "correlation": 0.5}]
        if not single_in_stage:
            doc["stages"].append({"id": "other", "systems": ["cheap", "strong"], "arms": ["single"], "items": 4,
                                  "repeats": 1})
    return load_design(write_prereg(tmp_path, apply) / "design.toml")


def _step(item: str, passed: bool, gate: bool, first: float, later: float) -> LiveStep:
    return LiveStep(stage="pilot", arm="cascade", item=item, repeat=0, run_id=f"c-{item}", passed=passed,
                    systems_ran=("cheap",) if gate else ("cheap", "strong"), escalated=not gate, gate_passed=gate,
                    gate_s=0.5, first_cost_usd=first, later_cost_usd=0.0 if gate else later,
                    cost_usd=first + (0.0 if gate else later))


STEPS = [_step("i0", True, True, 0.01, 0.0), _step("i1", False, True, 0.02, 0.0),  # i1: a false pass
         _step("i2", True, False, 0.03, 0.30), _step("i3", False, False, 0.04, 0.50)]


def _singles():  # type: ignore[no-untyped-def]
    cheap = [(True, 0.01), (False, 0.02), (False, 0.03), (False, 0.04)]
    strong = [(True, 0.10), (True, 0.20), (True, 0.30), (False, 0.40)]
    return attempts([{"system": s, "item": f"i{k}", "passed": p, "cost_usd": c}
                     for s, rows in (("cheap", cheap), ("strong", strong)) for k, (p, c) in enumerate(rows)])


def test_live_against_composed_hand_example(tmp_path: Path) -> None:
    (row,) = live_cascade_rows(STEPS, _singles(), _design(tmp_path))
    assert isinstance(row, LiveCascade) and list(row.to_dict()) == list(LIVE_CASCADE_SCHEMA)
    assert (row.stage, row.arm, row.cheap, row.strong, row.composed_from) == ("pilot", "cascade", "cheap", "strong",
                                                                               "single")
    assert row.n == 4 and row.escalated == 2 and row.live_pass_rate == 0.5
    assert math.isclose(row.live_mean_cost_usd or 0, (0.01 + 0.02 + 0.33 + 0.54) / 4)
    assert math.isclose(row.live_cost_per_pass_usd or 0, 0.90 / 2)
    assert math.isclose(row.b_live or 0, 0.025) and math.isclose(row.s_live or 0, 0.40)
    assert row.v_usd == 0.0 and row.v_s == 0.5 and row.gate_pass_rate == 0.5 and row.gate_false_pass == 1
    # the composition: cheap passes i0; strong passes i1, i2; i3 neither: 3 of 4
    assert row.composed_n_pairs == 4 and row.composed_pass_rate == 0.75 and row.strong_pass_rate == 0.75
    assert math.isclose(row.break_even_q_measured or 0, 0.025 / 0.40) and row.note is None


def test_composed_mean_cost_is_the_oracle_composition(tmp_path: Path) -> None:
    (row,) = live_cascade_rows(STEPS, _singles(), _design(tmp_path))
    # cheap costs every item (0.10 in all); strong only where cheap failed (i1..i3: 0.20+0.30+0.40)
    assert math.isclose(row.composed_mean_cost_usd or 0, (0.10 + 0.90) / 4)


def test_without_a_single_system_arm_in_the_stage_nothing_is_composed(tmp_path: Path) -> None:
    (row,) = live_cascade_rows(STEPS, _singles(), _design(tmp_path, single_in_stage=False))
    assert row.composed_from is None and row.composed_pass_rate is None
    assert row.note is not None and "not composed" in row.note
    assert row.live_pass_rate == 0.5  # the live side stands on its own


def test_no_escalation_takes_s_from_the_single_arm(tmp_path: Path) -> None:
    steps = [_step("i0", True, True, 0.01, 0.0), _step("i1", False, True, 0.02, 0.0)]
    (row,) = live_cascade_rows(steps, _singles(), _design(tmp_path))
    assert row.escalated == 0 and math.isclose(row.s_live or 0, 0.25)
    assert row.note is not None and "no attempt escalated" in row.note


@pytest.mark.parametrize("steps", [[]])
def test_no_cascade_steps_no_rows(tmp_path: Path, steps: list[LiveStep]) -> None:
    assert live_cascade_rows(steps, _singles(), _design(tmp_path)) == []
