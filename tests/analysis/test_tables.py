"""The q table and the cheap-first break-even on hand-built frames with known numbers."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.breakeven import ORACLE_NOTE, break_even, sensitivity_grid
from harness.analysis.tables import q_table
from harness.audit.frame import ATTEMPT_COLUMNS, TOKEN_COLUMNS, validate_attempts
from harness.stats.proportions import clopper_pearson_interval, wilson_interval

SCHEMA: dict[str, Any] = {
    "study": pl.String,
    "stage": pl.String,
    "system": pl.String,
    "arm": pl.String,
    "item": pl.String,
    "repeat": pl.Int64,
    "run_id": pl.String,
    "passed": pl.Boolean,
    "cost_usd": pl.Float64,
    "latency_s": pl.Float64,
    **{name: pl.Int64 for name in TOKEN_COLUMNS},
    "lane": pl.String,
}


def attempts(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A scored-attempts frame; unspecified columns get plain defaults."""
    defaults: dict[str, Any] = {
        "study": "s",
        "stage": "pilot",
        "arm": "single",
        "repeat": 0,
        "run_id": "r1",
        "latency_s": 1.0,
        "lane": "a",
        **{name: 0 for name in TOKEN_COLUMNS},
    }
    return pl.DataFrame([{**defaults, **row} for row in rows], schema=SCHEMA)


def test_schema_matches_the_report_columns() -> None:
    assert list(SCHEMA) == list(ATTEMPT_COLUMNS)


# --- q table ---------------------------------------------------------------------------------


def _q_frame() -> pl.DataFrame:
    a = [
        {"system": "A", "item": f"i{k}", "passed": p, "cost_usd": c, "latency_s": lat}
        for k, (p, c, lat) in enumerate(
            [(True, 0.1, 1.0), (True, 0.2, 2.0), (False, 0.3, 3.0), (True, 0.4, 10.0)]
        )
    ]
    for k, row in enumerate(a):
        row.update(tokens_input=100 * (k + 1), tokens_cached_input=10, tokens_output=7)
    b = [
        {"system": "B", "item": "i0", "passed": False, "cost_usd": 0.5, "latency_s": 4.0},
        {"system": "B", "item": "i1", "passed": False, "cost_usd": None, "latency_s": 6.0},
    ]
    return attempts(a + b)


def test_q_table_exact_numbers() -> None:
    table = q_table(_q_frame())
    assert table.get_column("system").to_list() == ["A", "B"]
    a, b = table.rows(named=True)

    # A: 3 of 4 passed, costs 0.1+0.2+0.3+0.4 = 1.0, cost per pass 1.0/3.
    assert (a["n"], a["passes"], a["pass_rate"]) == (4, 3, 0.75)
    wilson, exact = wilson_interval(3, 4, 0.05), clopper_pearson_interval(3, 4, 0.05)
    assert (a["wilson_low"], a["wilson_high"]) == (wilson.low, wilson.high)
    assert (a["cp_low"], a["cp_high"]) == (exact.low, exact.high)
    assert a["cost_usd"] == pytest.approx(1.0, abs=1e-12)
    assert a["cost_unknown"] == 0
    assert a["cost_per_pass_usd"] == pytest.approx(1.0 / 3.0, abs=1e-12)
    # Latencies 1, 2, 3, 10: median (2+3)/2; p95 at position 0.95*3 = 2.85 -> 3 + 0.85*(10-3).
    assert a["latency_median_s"] == 2.5
    assert a["latency_p95_s"] == pytest.approx(8.95, abs=1e-12)
    assert a["latency_p95_s"] == pytest.approx(float(np.quantile([1.0, 2.0, 3.0, 10.0], 0.95)))
    assert (a["tokens_input"], a["tokens_cached_input"], a["tokens_output"]) == (1000, 40, 28)
    assert a["tokens_reasoning"] == 0

    # B: 0 of 2, one cost unknown: the total is unknown, the known part is kept.
    assert (b["n"], b["passes"], b["pass_rate"]) == (2, 0, 0.0)
    assert b["cost_usd"] is None
    assert (b["cost_unknown"], b["cost_known_usd"]) == (1, 0.5)
    assert b["cost_per_pass_usd"] is None
    exact = clopper_pearson_interval(0, 2, 0.05)
    assert (b["cp_low"], b["cp_high"]) == (exact.low, exact.high)
    assert b["latency_median_s"] == 5.0


def test_q_table_alpha_and_zero_passes_with_known_cost() -> None:
    frame = attempts([{"system": "C", "item": "i", "passed": False, "cost_usd": 0.2}])
    (row,) = q_table(frame, alpha=0.1).rows(named=True)
    assert row["cost_usd"] == 0.2 and row["cost_per_pass_usd"] is None
    assert row["wilson_high"] == wilson_interval(0, 1, 0.1).high
    with pytest.raises(ValueError, match="alpha"):
        q_table(frame, alpha=0.0)


def test_q_table_groups_by_stage_and_arm() -> None:
    frame = attempts(
        [
            {"system": "A", "item": "i", "passed": True, "cost_usd": 1.0, "stage": "pilot"},
            {"system": "A", "item": "i", "passed": True, "cost_usd": 1.0, "stage": "main"},
            {"system": "A", "item": "i", "passed": False, "cost_usd": 1.0, "arm": "agent"},
        ]
    )
    table = q_table(frame)
    assert table.select("stage", "arm", "n").rows() == [
        ("main", "single", 1),
        ("pilot", "agent", 1),
        ("pilot", "single", 1),
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop("lane", "latency_s"), "missing columns: latency_s, lane"),
        (lambda f: f.with_columns(pl.lit(1).alias("bonus")), "extra columns: bonus"),
        (lambda f: f.with_columns(pl.col("passed").cast(pl.Int64)), "passed is Int64"),
        (lambda f: f.with_columns(pl.col("cost_usd").cast(pl.String)), "cost_usd is String"),
        (
            lambda f: f.with_columns(pl.lit(None, dtype=pl.Boolean).alias("passed")),
            "passed has 6 null values",
        ),
    ],
)
def test_schema_refusals(change: Any, message: str) -> None:
    frame = change(_q_frame())
    with pytest.raises(ValueError, match=message):
        validate_attempts(frame)
    with pytest.raises(ValueError, match=message):
        q_table(frame)


# --- break-even ------------------------------------------------------------------------------


def _cascade_frame() -> pl.DataFrame:
    cheap = [(True, 0.01), (True, 0.02), (False, 0.03), (False, 0.04)]
    strong = [(True, 0.10), (False, 0.20), (True, 0.30), (False, 0.40)]
    rows = [
        {"system": system, "item": f"i{k}", "passed": p, "cost_usd": c}
        for system, outcomes in (("cheap", cheap), ("strong", strong))
        for k, (p, c) in enumerate(outcomes)
    ]
    return attempts(rows)


def test_break_even_hand_example() -> None:
    result = break_even(
        _cascade_frame(), cheap="cheap", strong="strong", arm="single", gate_cost_usd=0.005
    )
    # q = 2/4; b = (0.01+0.02+0.03+0.04)/4 = 0.025; s = (0.1+0.2+0.3+0.4)/4 = 0.25; v = 0.005.
    assert (result.q, result.strong_pass_rate) == (0.5, 0.5)
    assert result.b == pytest.approx(0.025, abs=1e-15)
    assert result.s == pytest.approx(0.25, abs=1e-15)
    assert result.v == 0.005
    # predicted cost b + v + (1-q) s = 0.025 + 0.005 + 0.5*0.25 = 0.155
    assert result.predicted_cost_usd == pytest.approx(0.155, abs=1e-15)
    # break-even q* = (b+v)/s = 0.03/0.25 = 0.12; savings q - q* = 0.38
    assert result.break_even_q == pytest.approx(0.12, abs=1e-15)
    assert result.predicted_savings == pytest.approx(0.38, abs=1e-15)
    # composed: i0 cheap pass, i1 cheap pass, i2 cheap fail -> strong pass, i3 both fail: 3/4.
    assert result.composed_pass_rate == 0.75
    # cost: cheap 0.10 + gate 4*0.005 + strong on i2, i3 (0.3+0.4) = 0.82; mean 0.205.
    assert result.composed_total_cost_usd == pytest.approx(0.82, abs=1e-15)
    assert result.composed_mean_cost_usd == pytest.approx(0.205, abs=1e-15)
    assert result.cost_ratio == pytest.approx(0.205 / 0.25, abs=1e-15)
    assert result.composed_cost_per_pass_usd == pytest.approx(0.82 / 3, abs=1e-15)
    assert result.strong_cost_per_pass_usd == pytest.approx(1.0 / 2, abs=1e-15)
    assert (result.n_pairs, result.n_items) == (4, 4)
    record = result.to_dict()
    assert record["gate"] == "oracle" and record["note"] == ORACLE_NOTE
    with pytest.raises(AttributeError):
        result.q = 1.0  # type: ignore[misc]


def test_sensitivity_hand_example() -> None:
    grid = sensitivity_grid(
        _cascade_frame(),
        cheap="cheap",
        strong="strong",
        arm="single",
        gate_cost_usd=0.005,
        false_accept=(0.0, 0.2),
        false_reject=(0.0, 0.1),
    )
    rows = {(r["false_accept"], r["false_reject"]): r for r in grid.rows(named=True)}
    assert rows[(0.0, 0.0)]["pass_rate"] == pytest.approx(0.75, abs=1e-15)
    assert rows[(0.0, 0.0)]["mean_cost_usd"] == pytest.approx(0.205, abs=1e-15)
    # e_fa = 0.2, e_fr = 0.1: mean c = 0.5, mean c*t = 0.25 (i0), mean (1-c) t = 0.25 (i2):
    # pass = 0.5*0.9 + 0.1*0.25 + 0.8*0.25 = 0.675;
    # cost = 0.03 + 0.1*(0.1+0.2)/4 + 0.8*(0.3+0.4)/4 = 0.03 + 0.0075 + 0.14 = 0.1775.
    assert rows[(0.2, 0.1)]["pass_rate"] == pytest.approx(0.675, abs=1e-15)
    assert rows[(0.2, 0.1)]["mean_cost_usd"] == pytest.approx(0.1775, abs=1e-15)
    assert rows[(0.2, 0.1)]["cost_ratio"] == pytest.approx(0.1775 / 0.25, abs=1e-15)
    with pytest.raises(ValueError, match="false_accept"):
        sensitivity_grid(
            _cascade_frame(), cheap="cheap", strong="strong", arm="single", false_accept=(1.5,)
        )


def test_break_even_refusals() -> None:
    frame = _cascade_frame()
    with pytest.raises(ValueError, match="unpaired"):
        break_even(
            frame.filter(~((pl.col("system") == "strong") & (pl.col("item") == "i0"))),
            cheap="cheap",
            strong="strong",
            arm="single",
        )
    with pytest.raises(ValueError, match="unknown cost"):
        break_even(
            frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("cost_usd")),
            cheap="cheap",
            strong="strong",
            arm="single",
        )
    with pytest.raises(ValueError, match="duplicate"):
        break_even(pl.concat([frame, frame.head(1)]), cheap="cheap", strong="strong", arm="single")
    with pytest.raises(ValueError, match="no attempts"):
        break_even(frame, cheap="cheap", strong="absent", arm="single")
    with pytest.raises(ValueError, match="gate_cost_usd"):
        break_even(frame, cheap="cheap", strong="strong", arm="single", gate_cost_usd=-1.0)


outcome = st.tuples(st.booleans(), st.floats(0.0, 2.0, allow_nan=False, allow_infinity=False))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda n: st.tuples(
            st.lists(outcome, min_size=n, max_size=n), st.lists(outcome, min_size=n, max_size=n)
        )
    ),
    st.integers(1, 2),
)
def test_cascade_composition_properties(sides: Any, repeats: int) -> None:
    cheap, strong = sides
    rows = [
        {
            "system": system,
            "item": f"i{k // repeats}",
            "repeat": k % repeats,
            "passed": p,
            "cost_usd": c,
        }
        for system, outcomes in (("cheap", cheap), ("strong", strong))
        for k, (p, c) in enumerate(outcomes)
    ]
    frame = attempts(rows)
    result = break_even(frame, cheap="cheap", strong="strong", arm="single")
    n = len(cheap)
    # Per pair, cascade pass = cheap or strong >= each: so the rate is >= both rates.
    assert result.composed_pass_rate >= result.q
    assert result.composed_pass_rate >= result.strong_pass_rate
    expected_pass = sum(c[0] or s[0] for c, s in zip(cheap, strong, strict=True)) / n
    expected_cost = sum(c[1] + (0.0 if c[0] else s[1]) for c, s in zip(cheap, strong, strict=True))
    assert result.composed_pass_rate == pytest.approx(expected_pass, abs=1e-12)
    assert result.composed_total_cost_usd == pytest.approx(expected_cost, abs=1e-9)

    rates = (0.0, 0.1, 0.3, 0.6, 1.0)
    grid = sensitivity_grid(
        frame, cheap="cheap", strong="strong", arm="single", false_accept=rates, false_reject=rates
    )
    at = {(r["false_accept"], r["false_reject"]): r for r in grid.rows(named=True)}
    assert at[(0.0, 0.0)]["pass_rate"] == pytest.approx(result.composed_pass_rate, abs=1e-12)
    assert at[(0.0, 0.0)]["mean_cost_usd"] == pytest.approx(result.composed_mean_cost_usd, abs=1e-9)
    tol = 1e-12
    for fr in rates:
        for lo, hi in itertools.pairwise(rates):
            # More false accepts keep more failed cheap answers: fewer passes, less strong spend.
            assert at[(hi, fr)]["pass_rate"] <= at[(lo, fr)]["pass_rate"] + tol
            assert at[(hi, fr)]["mean_cost_usd"] <= at[(lo, fr)]["mean_cost_usd"] + 1e-9
    for fa in rates:
        for lo, hi in itertools.pairwise(rates):
            # More false rejects re-run passed answers on strong: no more passes, more spend.
            assert at[(fa, hi)]["pass_rate"] <= at[(fa, lo)]["pass_rate"] + tol
            assert at[(fa, hi)]["mean_cost_usd"] >= at[(fa, lo)]["mean_cost_usd"] - 1e-9
    # Always-accept gate is the cheap system alone.
    assert at[(1.0, 0.0)]["pass_rate"] == pytest.approx(result.q, abs=1e-12)
    assert at[(1.0, 0.0)]["mean_cost_usd"] == pytest.approx(result.b, abs=1e-9)
