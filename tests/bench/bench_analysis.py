"""Benchmark: the q table and the cheap-first composition on a 1,000,000-row attempts frame.

The frame (numpy, fixed seed): 3 systems x 2 arms x 2 stages x 8,334 items x 10
repeats, truncated to 1,000,000 rows. `q_table` (polars group_by/agg) and
`break_even` + `sensitivity_grid` are timed on it. The baseline is a plain
Python loop over rows (dicts of running sums, `statistics.median`/quantiles per
group) on the first 100,000 rows, against `q_table` on the same 100,000 rows;
the two must agree on n, passes, costs and latency quantiles.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_analysis.py -s
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import numpy as np
import polars as pl
import pytest

from harness.analysis.breakeven import break_even, sensitivity_grid
from harness.analysis.tables import q_table
from harness.audit.frame import TOKEN_COLUMNS
from tests.support.bench import Row, bench_command, record

pytestmark = pytest.mark.bench

ROWS = 1_000_000
LOOP_ROWS = 100_000
SYSTEMS = ("cheap", "mid", "strong")
ARMS = ("single", "agent")
STAGES = ("pilot", "main")
REPEATS = 10


def _frame(rows: int, seed: int = 20261130) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    cells = len(SYSTEMS) * len(ARMS) * len(STAGES)
    items = math.ceil(rows / (cells * REPEATS))
    total = cells * items * REPEATS
    idx = np.arange(total)
    repeat = idx % REPEATS
    item = (idx // REPEATS) % items
    cell = idx // (REPEATS * items)
    system = cell % len(SYSTEMS)
    arm = (cell // len(SYSTEMS)) % len(ARMS)
    stage = cell // (len(SYSTEMS) * len(ARMS))
    pass_p = np.array([0.55, 0.7, 0.85])[system]
    cost = np.array([0.002, 0.01, 0.05])[system] * rng.lognormal(0.0, 0.3, total)
    # A few unknown costs, on "mid" only, so the q table shows them and the cascade has none.
    cost_known = (system != 1) | (rng.random(total) > 0.001)
    frame = pl.DataFrame(
        {
            "study": pl.Series(["bench"] * total, dtype=pl.String),
            "stage": np.array(STAGES)[stage],
            "system": np.array(SYSTEMS)[system],
            "arm": np.array(ARMS)[arm],
            "item": np.char.add("HumanEval/", item.astype(str)),
            "repeat": repeat.astype(np.int64),
            "run_id": np.char.add("run-", (idx // 50_000).astype(str)),
            "passed": rng.random(total) < pass_p,
            "cost_usd": pl.Series(np.where(cost_known, cost, np.nan)).fill_nan(None),
            "latency_s": rng.gamma(2.0, 1.5, total),
            **{name: rng.integers(0, 4000, total, dtype=np.int64) for name in TOKEN_COLUMNS},
            "lane": np.array(["a", "b"])[idx % 2],
        }
    )
    # Keep `rows` (the cut falls in the last cell: main/agent/strong), then shuffle so groups
    # interleave as in an append-only log.
    return frame.head(rows).sample(fraction=1.0, shuffle=True, seed=seed)


def _loop_q_table(frame: pl.DataFrame) -> dict[tuple[str, ...], dict[str, Any]]:
    """The straightforward per-row Python loop a notebook might write (no intervals)."""
    groups: dict[tuple[str, ...], dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "passes": 0, "cost": 0.0, "unknown": 0, "lat": [], "tokens": [0] * 5}
    )
    for row in frame.iter_rows(named=True):
        g = groups[(row["study"], row["stage"], row["system"], row["arm"])]
        g["n"] += 1
        g["passes"] += row["passed"]
        if row["cost_usd"] is None:
            g["unknown"] += 1
        else:
            g["cost"] += row["cost_usd"]
        g["lat"].append(row["latency_s"])
        for k, name in enumerate(TOKEN_COLUMNS):
            g["tokens"][k] += row[name]
    for g in groups.values():
        lat = sorted(g.pop("lat"))
        g["median"] = float(np.median(lat))
        pos = 0.95 * (len(lat) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(lat) - 1)
        g["p95"] = lat[lo] + (pos - lo) * (lat[hi] - lat[lo])
    return groups


def test_q_table_million_rows() -> None:
    frame = _frame(ROWS)
    assert frame.height == ROWS

    start = time.perf_counter()
    table = q_table(frame)
    q_seconds = time.perf_counter() - start
    assert table.get_column("n").sum() == ROWS

    start = time.perf_counter()
    result = break_even(frame, cheap="cheap", strong="strong", arm="single", stage="main")
    grid = sensitivity_grid(frame, cheap="cheap", strong="strong", arm="single", stage="main")
    cascade_seconds = time.perf_counter() - start
    assert result.composed_pass_rate >= max(result.q, result.strong_pass_rate)
    assert grid.height == 25

    small = frame.head(LOOP_ROWS)
    start = time.perf_counter()
    small_table = q_table(small)
    small_seconds = time.perf_counter() - start
    start = time.perf_counter()
    loop = _loop_q_table(small)
    loop_seconds = time.perf_counter() - start
    for row in small_table.rows(named=True):
        g = loop[(row["study"], row["stage"], row["system"], row["arm"])]
        assert (row["n"], row["passes"], row["cost_unknown"]) == (g["n"], g["passes"], g["unknown"])
        assert row["cost_known_usd"] == pytest.approx(g["cost"], rel=1e-9)
        assert row["latency_median_s"] == pytest.approx(g["median"], rel=1e-12)
        assert row["latency_p95_s"] == pytest.approx(g["p95"], rel=1e-12)
        assert [row[name] for name in TOKEN_COLUMNS] == g["tokens"]

    print(
        f"\nq_table on {ROWS:,} rows ({table.height} groups): {q_seconds:.3f} s"
        f"\nbreak_even + sensitivity_grid (5x5) on {ROWS:,} rows, stage main "
        f"({result.n_pairs:,} pairs): {cascade_seconds:.3f} s"
        f"\non {LOOP_ROWS:,} rows: q_table {small_seconds:.3f} s, plain Python row loop "
        f"{loop_seconds:.3f} s, loop/q_table = {loop_seconds / small_seconds:.1f}x"
        f"\nrows/s: q_table {ROWS / q_seconds:,.0f} (1M), loop {LOOP_ROWS / loop_seconds:,.0f} (100k)"
    )
    record("analysis_q_table", [Row(
        f"the q table on {ROWS:,} attempt rows ({table.height} groups); break-even + 5x5 sensitivity grid",
        f"`q_table` {q_seconds:.3f} s; `break_even` + `sensitivity_grid` {cascade_seconds:.3f} s; on {LOOP_ROWS:,} "
        f"rows `q_table` {small_seconds:.3f} s", f"a plain Python row loop on the same {LOOP_ROWS:,} rows (same n, "
        "passes, costs, latency quantiles)", f"{loop_seconds:.3f} s", f"q_table {loop_seconds / small_seconds:.1f}x faster",
        bench_command("tests/bench/bench_analysis.py", k="q_table"))])
    assert q_seconds < 30.0


def _bench_design() -> Any:
    """The registered design behind `_frame`: three comparisons over both arms, repeats clustered by item."""
    from harness.prereg.design import parse_design

    items = math.ceil(ROWS / (len(SYSTEMS) * len(ARMS) * len(STAGES) * REPEATS))
    doc: dict[str, Any] = {
        "study": {"id": "bench", "seed": 1, "title": "bench"},
        "suite": {"name": "bench", "packet": "packet.jsonl", "packet_sha256": "0" * 64},
        "draw": {"items": items},
        "systems": [{"slot": s, "provider": "sim", "model": s, "setting": "default", "pricing_key": s,
                     "cap_usd": 1.0} for s in SYSTEMS],
        "arms": [{"id": a, "template": "{prompt}"} for a in ARMS],
        "stages": [{"id": s, "systems": list(SYSTEMS), "arms": list(ARMS), "items": items, "repeats": REPEATS}
                   for s in STAGES],
        "budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": 3.0, "ceiling_margin_usd": 0.1,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 1, "attempt_deadline_s": 10, "reruns": 0, "transport_retries": 0,
                "max_output_tokens": 10, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item", "comparisons": [
            {"a": "cheap", "b": "mid", "arm": "single", "margin": 0.1, "expected_a": 0.55, "expected_b": 0.7,
             "correlation": 0.3},
            {"a": "mid", "b": "strong", "arm": "agent", "margin": 0.1, "expected_a": 0.7, "expected_b": 0.75,
             "correlation": 0.3},
            {"a": "cheap", "b": "strong", "arm": "agent", "margin": 0.3, "expected_a": 0.55, "expected_b": 0.85,
             "correlation": 0.3},
        ]},
    }
    return parse_design(doc, path="/bench/design.toml", sha256="0" * 64)


def _loop_comparisons(frame: pl.DataFrame, design: Any) -> dict[tuple[str, str, str, str], Any]:
    """The peer: a plain Python pass over the rows pairing cells in dicts, then `paired_comparison`."""
    from harness.stats.paired import paired_comparison

    cells: dict[tuple[str, str, str], dict[tuple[str, int], bool]] = defaultdict(dict)
    for stage, system, arm, item, repeat, passed in frame.select(
        "stage", "system", "arm", "item", "repeat", "passed"
    ).iter_rows():
        cells[(stage, system, arm)][(item, repeat)] = passed
    out = {}
    for stage in STAGES:
        for c in design.comparisons:
            a, b = cells[(stage, c.a, c.arm)], cells[(stage, c.b, c.arm)]
            keys = [k for k in a if k in b]
            out[(stage, c.a, c.b, c.arm)] = paired_comparison(
                [a[k] for k in keys], [b[k] for k in keys], items=[k[0] for k in keys],
                margin=c.margin, alpha=design.alpha)
    return out


def test_study_analysis_million_rows() -> None:
    from harness.analysis.frame_tables import analyze_frame

    frame = _frame(ROWS)
    design = _bench_design()

    start = time.perf_counter()
    tables = analyze_frame(frame, design)
    analysis_seconds = time.perf_counter() - start

    start = time.perf_counter()
    loop = _loop_comparisons(frame, design)
    loop_seconds = time.perf_counter() - start

    assert tables.comparisons.height == len(STAGES) * len(design.comparisons)
    for row in tables.comparisons.iter_rows(named=True):
        hand = loop[(row["stage"], row["a"], row["b"], row["arm"])]
        assert (row["n"], row["n_items"], row["b10"], row["b01"]) == (hand.n, hand.n_items, hand.b10, hand.b01)
        assert row["se"] == pytest.approx(hand.se, rel=1e-9)
        assert row["tango_p"] == pytest.approx(hand.tango_p, rel=1e-9, abs=1e-300)
    # 3 systems x 2 arms x 2 stages: 12 cascades; those with "mid" (unknown costs) are named, not composed
    assert tables.breakeven.height == 12
    composed = tables.breakeven.filter(pl.col("q").is_not_null()).height
    assert composed == 4 and tables.sensitivity.height == composed * 25

    print(
        f"\nanalyze_frame on {ROWS:,} rows ({tables.comparisons.height} comparisons, "
        f"{tables.breakeven.height} cascades, {tables.sensitivity.height} sensitivity rows): "
        f"{analysis_seconds:.3f} s"
        f"\npeer (Python row loop pairing in dicts + paired_comparison, comparisons only): {loop_seconds:.3f} s"
        f"\npeer / analyze_frame = {loop_seconds / analysis_seconds:.1f}x"
    )
    record("analysis_frame", [Row(
        f"the study's tables on {ROWS:,} rows ({tables.comparisons.height} paired comparisons, "
        f"{tables.breakeven.height} cascades, {tables.sensitivity.height} sensitivity rows)",
        f"`analyze_frame` {analysis_seconds:.3f} s", "a Python row loop pairing cells in dicts + `paired_comparison` "
        "(comparisons only, the same results)", f"{loop_seconds:.3f} s",
        f"analyze_frame {loop_seconds / analysis_seconds:.1f}x faster",
        bench_command("tests/bench/bench_analysis.py", k="study_analysis"))])
    assert analysis_seconds < 60.0
