"""Live cascades beside composed ones (`harness.analysis.cascade`) on hand-built steps with known numbers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from harness.analysis.cascade import (
    GATE_USD_PER_RUN,
    LIVE_CASCADE_SCHEMA,
    GateCost,
    LiveCascade,
    LiveStep,
    gate_costs,
    live_cascade_rows,
    live_steps,
)
from harness.analysis.repo import repo_tables
from harness.audit.frame import TOKEN_COLUMNS
from harness.evidence.chain import ChainedLog
from harness.prereg.design import Design, load_design
from harness.records.work import WORK_KIND, AttemptWork, CascadeGate, CascadeStep, CascadeWork
from harness.run.layout import log_seed
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


def _design(tmp_path: Path, single_in_stage: bool = True) -> Design:
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
                    gates=1, gate_s=0.5, first_cost_usd=first, later_cost_usd=0.0 if gate else later,
                    cost_usd=first + (0.0 if gate else later))


STEPS = [_step("i0", True, True, 0.01, 0.0), _step("i1", False, True, 0.02, 0.0),  # i1: a false pass
         _step("i2", True, False, 0.03, 0.30), _step("i3", False, False, 0.04, 0.50)]


def _singles() -> pl.DataFrame:
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


# --------------------------------------------------------------------------
# The measured gate cost v in the repository-task break-even (issue 17 item 5)


def _cascade_step(system: str, cost: float, gate: tuple[bool, float] | None) -> CascadeStep:
    return CascadeStep(system=system, model=f"m-{system}", dispatch_id=None, exit_code=0, timed_out=False,
                       exchanges=1, cost_usd=cost, wire=None, budget_stop=False,
                       gate=None if gate is None else CascadeGate(passed=gate[0], exit_code=0 if gate[0] else 1,
                                                                  timed_out=False, duration_s=gate[1],
                                                                  output_sha256="0" * 64))


def _cascade_records(folder: Path, study: str, cells: dict[str, tuple[CascadeStep, ...]]) -> None:
    """A stage folder's attempts and finals logs (chained, as the runner writes them) for cascade cells run_id ->
    steps; each after an earlier attempt of its cell (a rerun's, with a 99 s gate) the finals do not stand on."""
    attempts = ChainedLog(folder / "attempts.jsonl", log_seed(study, "pilot", "attempts"))
    finals = ChainedLog(folder / "finals.jsonl", log_seed(study, "pilot", "finals"))
    line = 0
    for run_id, steps in cells.items():
        for rerun in (0, 1):
            work = AttemptWork(kind=WORK_KIND, folder=f"work/{run_id}.r{rerun}.a1", dispatch_id=None, exit_code=0,
                               timed_out=False, provider_failure=False, exchanges=len(steps), files={},
                               passed=rerun == 1, refusal=None, queued_s=0.0,
                               cascade=CascadeWork(systems=("cheap", "strong"), steps=steps if rerun else (
                                   _cascade_step("cheap", 0.0, (False, 99.0)),)))
            attempts.append({"run_id": run_id, "rerun": rerun, "work": work.to_json()})
            line += 1
        finals.append({"run_id": run_id, "attempt_line": line})


def test_the_gate_cost_v_is_measured_from_live_cascade_records_into_the_break_even(tmp_path: Path) -> None:
    design = _design(tmp_path / "prereg")
    stage = tmp_path / "stage"
    stage.mkdir()
    # i0: the gate passed cheap's tree after 0.5 s; i1: it failed after 1.25 s and strong ran; i2: cheap's step
    # ended without a gate (1 step of 2 ran, no gate): it counts as an attempt with no gate cost
    _cascade_records(stage, design.study_id, {
        "c-i0": (_cascade_step("cheap", 0.01, (True, 0.5)),),
        "c-i1": (_cascade_step("cheap", 0.02, (False, 1.25)), _cascade_step("strong", 0.30, None)),
        "c-i2": (_cascade_step("cheap", 0.03, None),)})
    cascade = attempts([{"system": "cheap", "arm": "cascade", "item": f"i{k}", "run_id": f"c-i{k}",
                         "passed": k == 1, "cost_usd": c} for k, c in enumerate((0.01, 0.32, 0.03))])
    frame = pl.concat([_singles(), cascade], how="vertical")
    steps = live_steps(str(stage), frame, design)
    assert [(s.run_id, s.gates, s.gate_s) for s in steps] == [("c-i0", 1, 0.5), ("c-i1", 1, 1.25), ("c-i2", 0, 0.0)]
    # v per attempt: dollars (every gate $0: it calls no model) and seconds over the 3 attempts, by hand
    assert gate_costs(steps) == {"pilot": GateCost(stage="pilot", attempts=3, gates=2, v_usd=0.0,
                                                   v_s=(0.5 + 1.25 + 0.0) / 3)}
    assert GATE_USD_PER_RUN == 0.0
    got = gate_costs(steps)
    measured = repo_tables(frame, design, gate_costs={s: g.v_usd for s, g in got.items()},
                           gate_seconds={s: g.v_s for s, g in got.items()}).breakeven
    single = measured.filter(pl.col("arm") == "single").row(0, named=True)
    assert (single["cheap"], single["strong"], single["v_source"], single["v"]) == ("cheap", "strong", "measured", 0.0)
    assert single["v_s"] == pytest.approx(1.75 / 3) and single["note"].startswith("v measured $0")
    # b = 0.10 / 4, s = 1.00 / 4 (the single arm's means), v = 0: break-even q* = (b + v) / s = 0.1
    assert single["break_even_q"] == pytest.approx(0.1) and single["predicted_savings"] == pytest.approx(0.25 - 0.1)
    # without cascade records (or with cascade attempts that never reached a gate) v stays assumed
    assumed = repo_tables(frame, design).breakeven.filter(pl.col("arm") == "single").row(0, named=True)
    assert (assumed["v_source"], assumed["v"], assumed["v_s"]) == ("assumed", 0.0, None)
    assert gate_costs([s for s in steps if s.gates == 0]) == {} and gate_costs([]) == {}
    assert live_steps(str(stage), _singles(), design) == []
