"""Live cascades against composed ones, and the measured gate cost v (issue 17 item 5).

A live cascade arm (`[[arms]] cascade = [cheap, strong]`) ran cheap first, gated it on the visible
tests and escalated on a failed gate; its attempts record every step (`harness.records.work.CascadeWork`).
The composed cascade is the oracle-gate composition of the single-system arms' results
(`harness.analysis.breakeven.break_even`). `live_cascades` puts them side by side per stage and cascade
arm: pass rates, mean cost per attempt, cost per pass, the escalation rate, the gate's measured cost v
(its model spend, always $0 for a test gate, and its seconds) and its errors against the hidden tests,
and the break-even with the measured v instead of an assumed one.

The manual: docs/analysis.md ("Live cascades").
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from harness.analysis.breakeven import break_even
from harness.evidence.chain_read import read_log
from harness.prereg.design import Design
from harness.records.work import AttemptWork
from harness.run.layout import log_seed

__all__ = ["GATE_USD_PER_RUN", "LIVE_CASCADE_SCHEMA", "GateCost", "LiveCascade", "LiveStep", "gate_costs",
           "live_cascade_rows", "live_cascades", "live_steps"]

GATE_USD_PER_RUN: Final = 0.0
"""The dollars one visible-test gate costs: it runs the visible tests in the sandbox outside the metering proxy,
so it sends no model request, and its record (`CascadeGate`) holds no spend (docs/analysis.md, "The gate's cost v")."""


@dataclass(frozen=True)
class LiveStep:
    """One scored live-cascade attempt as the analysis reads it (from its standing final's attempt)."""

    stage: str
    arm: str
    item: str
    repeat: int
    run_id: str
    passed: bool
    """The hidden tests' verdict on the tree it ended with."""
    systems_ran: tuple[str, ...]
    escalated: bool
    gate_passed: bool | None
    """The verdict of the last gate on the first system's tree (after its targeted repairs, if any): the one that
    kept or escalated the attempt (None: no gate ran, e.g. the first step failed)."""
    gates: int
    """How many visible-test gates the attempt ran (one after each step of a system but the cascade's last)."""
    gate_s: float
    """The seconds every gate of the attempt took (v's time part)."""
    first_cost_usd: float | None
    """What the first system's steps spent: its first dispatch and its targeted repairs (None: unknown)."""
    later_cost_usd: float | None
    """What the steps after the first spent (0 when it did not escalate; None: unknown)."""
    cost_usd: float | None
    """The attempt's whole cost (the report's, every rerun's attempt included)."""
    repairs: int = 0
    """The targeted repairs its steps made (`switch_class` `localized_defect`; docs/run.md, "Cascade arms")."""


@dataclass(frozen=True)
class LiveCascade:
    """One cascade arm of one stage: the live result, the composed (oracle-gate) one, and the measured v.

    Attributes:
        stage, arm, cheap, strong: the cascade (its first and last system).
        composed_from: the single-system arm composed (same worker, no cascade), or None.
        n: scored live attempts; escalated: how many escalated.
        live_pass_rate, live_mean_cost_usd, live_cost_per_pass_usd: the live cascade.
        b_live: the first system's steps' mean spend (its targeted repairs included); s_live: the later systems'
            steps' mean spend per escalation.
        v_usd: the gate's measured model spend per attempt (0: the visible tests call no model).
        v_s: the gate's mean seconds per attempt.
        gate_pass_rate: the first gate's pass rate; gate_false_pass: gate passed, hidden tests failed (a lost
            escalation); gate_false_fail: gate failed, and the cheap tree would have passed the hidden tests
            is not observable live (the tree was changed), so it is estimated from the composed pairs (None).
        composed_*: the oracle-gate composition (`break_even`) on the same stage's single-system arm.
        break_even_q_measured: (b + v) / s with the live b and s and the measured v_usd.
        note: why a part is missing.
    """

    stage: str
    arm: str
    cheap: str
    strong: str
    composed_from: str | None
    n: int
    escalated: int
    live_pass_rate: float | None
    live_mean_cost_usd: float | None
    live_cost_per_pass_usd: float | None
    b_live: float | None
    s_live: float | None
    v_usd: float
    v_s: float | None
    gate_pass_rate: float | None
    gate_false_pass: int
    composed_n_pairs: int | None
    composed_pass_rate: float | None
    composed_mean_cost_usd: float | None
    composed_cost_per_pass_usd: float | None
    strong_pass_rate: float | None
    break_even_q_measured: float | None
    note: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


LIVE_CASCADE_SCHEMA: Final[dict[str, Any]] = {
    "stage": pl.String, "arm": pl.String, "cheap": pl.String, "strong": pl.String, "composed_from": pl.String,
    "n": pl.Int64, "escalated": pl.Int64, "live_pass_rate": pl.Float64, "live_mean_cost_usd": pl.Float64,
    "live_cost_per_pass_usd": pl.Float64, "b_live": pl.Float64, "s_live": pl.Float64, "v_usd": pl.Float64,
    "v_s": pl.Float64, "gate_pass_rate": pl.Float64, "gate_false_pass": pl.Int64, "composed_n_pairs": pl.Int64,
    "composed_pass_rate": pl.Float64, "composed_mean_cost_usd": pl.Float64,
    "composed_cost_per_pass_usd": pl.Float64, "strong_pass_rate": pl.Float64,
    "break_even_q_measured": pl.Float64, "note": pl.String,
}
assert list(LIVE_CASCADE_SCHEMA) == [f.name for f in dataclasses.fields(LiveCascade)]


def _log(folder: str, study: str, stage: str, name: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, f"{name}.jsonl")
    if not os.path.lexists(path):
        return []
    return [r for r in read_log(path, log_seed(study, stage, name)) if "run_id" in r]


def live_steps(stage_folder: str, frame: pl.DataFrame, design: Design) -> list[LiveStep]:
    """Every scored cell of a cascade arm in one stage folder, read from its standing final's attempt.

    `frame` is the report's scored attempts of that stage (`harness.audit.report.Report.frame`): only its
    cells are read, so a cell the report left out is left out here too."""
    cascades = {a.id for a in design.arms if a.cascade is not None}
    cells = frame.filter(pl.col("arm").is_in(sorted(cascades)))
    if cells.height == 0:
        return []
    stage = str(cells.get_column("stage")[0])
    attempts = _log(stage_folder, design.study_id, stage, "attempts")
    finals = _log(stage_folder, design.study_id, stage, "finals")
    standing = {str(f["run_id"]): f for f in finals}
    out: list[LiveStep] = []
    for row in cells.iter_rows(named=True):
        final = standing[row["run_id"]]
        record = attempts[int(final["attempt_line"]) - 1]
        work = AttemptWork.from_json(record["work"])
        steps = () if work.cascade is None else work.cascade.steps
        # the first system's steps are its first dispatch and its targeted repairs (b includes the repairs)
        own = [s for s in steps if s.system == steps[0].system] if steps else []
        later = [s.cost_usd for s in steps[len(own):]]
        gates = [s.gate for s in steps if s.gate is not None]
        own_gates = [s.gate for s in own if s.gate is not None]
        out.append(LiveStep(
            stage=stage, arm=row["arm"], item=str(row["item"]), repeat=int(row["repeat"]), run_id=row["run_id"],
            passed=bool(row["passed"]), systems_ran=tuple(dict.fromkeys(s.system for s in steps)),
            escalated=len(steps) > len(own), gate_passed=own_gates[-1].passed if own_gates else None,
            gates=len(gates), gate_s=math.fsum(g.duration_s for g in gates),
            first_cost_usd=0.0 if not own else None if any(s.cost_usd is None for s in own) else math.fsum(
                s.cost_usd for s in own if s.cost_usd is not None),
            later_cost_usd=None if any(c is None for c in later) else math.fsum(c for c in later if c is not None),
            cost_usd=row["cost_usd"], repairs=sum(1 for s in steps if s.switch_class == "localized_defect")))
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known and len(known) == len(values) else None


def live_cascade_rows(steps: Sequence[LiveStep], frame: pl.DataFrame, design: Design) -> list[LiveCascade]:
    """One `LiveCascade` per (stage, cascade arm) in `steps`, composed against `frame` (every arm's scored
    attempts of those stages)."""
    out: list[LiveCascade] = []
    keys = sorted({(s.stage, s.arm) for s in steps})
    for stage, arm_id in keys:
        arm = design.arm(arm_id)
        assert arm.cascade is not None
        cheap, strong = arm.cascade[0], arm.cascade[-1]
        mine = [s for s in steps if s.stage == stage and s.arm == arm_id]
        n = len(mine)
        passes = sum(s.passed for s in mine)
        escalated = [s for s in mine if s.escalated]
        mean_cost = _mean([s.cost_usd for s in mine])
        gated = [s for s in mine if s.gate_passed is not None]
        notes: list[str] = []
        b_live = _mean([s.first_cost_usd for s in mine])
        s_live = _mean([s.later_cost_usd for s in escalated]) if escalated else None
        singles = [a.id for a in design.arms if a.cascade is None and a.worker == arm.worker
                   and a.id in design.stage(stage).arms]
        composed: dict[str, Any] = {}
        if not singles:
            notes.append("not composed: the stage runs no single-system arm with the cascade's worker")
        else:
            try:
                be = break_even(frame, cheap=cheap, strong=strong, arm=singles[0], stage=stage)
            except ValueError as exc:
                notes.append(f"not composed: {exc}")
            else:
                composed = {"composed_n_pairs": be.n_pairs, "composed_pass_rate": be.composed_pass_rate,
                            "composed_mean_cost_usd": be.composed_mean_cost_usd,
                            "composed_cost_per_pass_usd": be.composed_cost_per_pass_usd,
                            "strong_pass_rate": be.strong_pass_rate}
                if s_live is None:  # no escalation observed: the strong system's own mean from its single arm
                    s_live = be.s
                    notes.append("s from the single-system arm (no attempt escalated)")
        v_usd = math.fsum(GATE_USD_PER_RUN * s.gates for s in mine) / n  # $0: the gate calls no model
        out.append(LiveCascade(
            stage=stage, arm=arm_id, cheap=cheap, strong=strong, composed_from=singles[0] if singles else None,
            n=n, escalated=len(escalated), live_pass_rate=passes / n if n else None, live_mean_cost_usd=mean_cost,
            live_cost_per_pass_usd=None if mean_cost is None or not passes else mean_cost * n / passes,
            b_live=b_live, s_live=s_live, v_usd=v_usd,
            v_s=math.fsum(s.gate_s for s in mine) / n if n else None,
            gate_pass_rate=sum(bool(s.gate_passed) for s in gated) / len(gated) if gated else None,
            gate_false_pass=sum(1 for s in mine if s.gate_passed and not s.passed),
            composed_n_pairs=composed.get("composed_n_pairs"),
            composed_pass_rate=composed.get("composed_pass_rate"),
            composed_mean_cost_usd=composed.get("composed_mean_cost_usd"),
            composed_cost_per_pass_usd=composed.get("composed_cost_per_pass_usd"),
            strong_pass_rate=composed.get("strong_pass_rate"),
            break_even_q_measured=None if b_live is None or not s_live else (b_live + v_usd) / s_live,
            note="; ".join(notes) or None))
    return out


@dataclass(frozen=True)
class GateCost:
    """The visible-test gate's measured cost in one stage, per scored live-cascade attempt (the v of
    `savings = q - (b + v) / s`; docs/analysis.md, "The gate's cost v").

    Attributes:
        stage: the stage.
        attempts: the scored live-cascade attempts read (every cascade arm of the stage: the gate is the same).
        gates: the gates they ran (at least one, else the stage has no `GateCost`).
        v_usd: the gates' dollars per attempt (`GATE_USD_PER_RUN` times gates, over attempts): the unit of b and s.
        v_s: the gates' seconds per attempt (reported beside v, not priced into it).
    """

    stage: str
    attempts: int
    gates: int
    v_usd: float
    v_s: float


def gate_costs(steps: Sequence[LiveStep]) -> dict[str, GateCost]:
    """stage -> its `GateCost`, for each stage in `steps` whose live-cascade attempts ran at least one gate (a
    stage whose cascade attempts never reached a gate measured nothing and is left out: its v stays assumed)."""
    out: dict[str, GateCost] = {}
    for stage in sorted({s.stage for s in steps}):
        mine = [s for s in steps if s.stage == stage]
        gates = sum(s.gates for s in mine)
        if gates:
            out[stage] = GateCost(stage=stage, attempts=len(mine), gates=gates,
                                  v_usd=GATE_USD_PER_RUN * gates / len(mine),
                                  v_s=math.fsum(s.gate_s for s in mine) / len(mine))
    return out


def live_cascades(analysis: Any) -> pl.DataFrame:
    """The live-versus-composed table of a `harness.analysis.study.StudyAnalysis` (`LIVE_CASCADE_SCHEMA`):
    one row per stage and cascade arm; empty when the design has no cascade arm."""
    from harness.audit.results import open_study
    from harness.prereg.frozen import check_frozen

    design = check_frozen(analysis.prereg).design
    steps: list[LiveStep] = []
    if any(a.cascade is not None for a in design.arms):
        for ref in open_study(analysis.folder, prereg=analysis.prereg).stages:
            steps += live_steps(ref.folder, analysis.attempts.filter(pl.col("stage") == ref.stage), design)
    rows = [r.to_dict() for r in live_cascade_rows(steps, analysis.attempts, design)]
    return pl.DataFrame(rows, schema=LIVE_CASCADE_SCHEMA, orient="row") if rows else pl.DataFrame(
        schema=LIVE_CASCADE_SCHEMA)
