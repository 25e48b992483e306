"""The repository-task tables (harness.analysis.repo) on hand-built frames, every number computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from harness.analysis import figures
from harness.analysis.repo import ASSUMED_GATE_COST_USD, LATE_COLUMNS, repo_tables, with_late_costs
from tests.support.analysis import design, frame


def _stage() -> pl.DataFrame:
    """Stage B runs only x on direct; stage A: x and y on arms direct and cot, items i1..i4, one repeat each.

    x direct: pass i1, i2          cost 0.01 each
    y direct: pass i1, i2, i3, i4  cost 0.10 each
    x cot:    pass i1              cost 0.02 each
    y cot:    pass i1, i2, i3      cost 0.20 each
    """
    rows = []
    passes = {("x", "direct"): {"i1", "i2"}, ("y", "direct"): {"i1", "i2", "i3", "i4"},
              ("x", "cot"): {"i1"}, ("y", "cot"): {"i1", "i2", "i3"}}
    costs = {("x", "direct"): 0.01, ("y", "direct"): 0.10, ("x", "cot"): 0.02, ("y", "cot"): 0.20}
    for (system, arm), won in passes.items():
        for item in ("i1", "i2", "i3", "i4"):
            rows.append({"system": system, "arm": arm, "item": item, "passed": item in won,
                         "cost_usd": costs[(system, arm)], "run_id": f"{system}-{arm}-{item}"})
    return frame(rows)


def _late(rows: list[tuple[str, float | None]]) -> pl.DataFrame:
    return pl.DataFrame([{"stage": "A", "run_id": r, "cost_usd": c} for r, c in rows], schema=LATE_COLUMNS)


def test_late_costs_are_added_to_their_cells_and_an_unknown_one_makes_the_cell_unknown() -> None:
    cells = _stage()
    full = with_late_costs(cells, _late([("x-direct-i3", 0.005), ("x-direct-i3", 0.001), ("y-cot-i4", None)]))
    cost = dict(zip(full["run_id"].to_list(), full["cost_usd"].to_list(), strict=True))
    assert cost["x-direct-i3"] == pytest.approx(0.016) and cost["x-direct-i1"] == 0.01
    assert cost["y-cot-i4"] is None and full.height == cells.height and full.columns == cells.columns


def test_the_q_table_counts_every_request_and_late_cost_in_the_cost_per_pass() -> None:
    requests = pl.DataFrame({"stage": ["A"] * 4, "run_id": [f"x-direct-i{i}" for i in range(1, 5)],
                             "requests": [1, 3, 2, 2]})
    got = repo_tables(_stage(), design(), late=_late([("x-direct-i3", 0.04)]), requests=requests)
    x = got.q.filter((pl.col("system") == "x") & (pl.col("arm") == "direct")).row(0, named=True)
    # 4 x 0.01 + the late 0.04 = 0.08 for 2 passes
    assert (x["n"], x["passes"], x["requests"], x["late_costs"]) == (4, 2, 8, 1)
    assert x["cost_usd"] == pytest.approx(0.08) and x["cost_per_pass_usd"] == pytest.approx(0.04)
    assert x["late_cost_usd"] == pytest.approx(0.04) and x["requests_per_attempt"] == 2.0
    assert x["cost_per_attempt_usd"] == pytest.approx(0.02)
    y = got.q.filter((pl.col("system") == "y") & (pl.col("arm") == "cot")).row(0, named=True)
    assert y["cost_per_pass_usd"] == pytest.approx(0.8 / 3) and y["late_cost_usd"] == 0.0
    # an unknown late cost: the total and the cost per pass are unknown, never under-counted
    unknown = repo_tables(_stage(), design(), late=_late([("y-cot-i4", None)])).q
    y = unknown.filter((pl.col("system") == "y") & (pl.col("arm") == "cot")).row(0, named=True)
    assert y["cost_usd"] is None and y["cost_per_pass_usd"] is None and y["late_unknown"] == 1


def test_paired_rows_compare_systems_on_each_arm_and_arms_on_each_system() -> None:
    got = repo_tables(_stage(), design()).paired
    rows = {(r["between"], r["a"], r["b"], r["arm"] or r["system"]): r for r in got.iter_rows(named=True)}
    assert set(rows) == {("systems", "x", "y", "direct"), ("systems", "x", "y", "cot"),
                         ("arms", "direct", "cot", "x"), ("arms", "direct", "cot", "y")}
    xy = rows[("systems", "x", "y", "direct")]
    # x passes i1 i2, y passes all: both 2, y only 2 (b01), x only 0
    assert (xy["n"], xy["n11"], xy["b10"], xy["b01"], xy["n00"]) == (4, 2, 0, 2, 0)
    assert xy["diff"] == pytest.approx(-0.5) and xy["ci_low"] < -0.5 < xy["ci_high"]
    assert xy["mcnemar_p"] == pytest.approx(0.5)  # two discordant pairs, both one way: 2 * 0.5^2
    assert xy["cost_diff_usd"] == pytest.approx(0.01 - 0.10)
    assert xy["registered_margin"] == 0.2 and xy["verdict"] is not None  # the registered comparison
    arms_y = rows[("arms", "direct", "cot", "y")]
    assert (arms_y["b10"], arms_y["b01"], arms_y["diff"]) == (1, 0, pytest.approx(0.25))
    assert arms_y["verdict"] is None and arms_y["registered_margin"] is None  # exploratory
    assert arms_y["cost_a_usd"] == pytest.approx(0.10) and arms_y["cost_b_usd"] == pytest.approx(0.20)


def test_break_even_uses_the_measured_gate_cost_where_there_is_one_and_says_assumed_otherwise() -> None:
    assumed = {r["arm"]: r for r in repo_tables(_stage(), design()).breakeven.iter_rows(named=True)}
    direct = assumed["direct"]
    assert (direct["cheap"], direct["strong"]) == ("x", "y")
    assert direct["v_source"] == "assumed" and direct["v"] == ASSUMED_GATE_COST_USD == 0.0
    assert "assumed" in direct["note"]
    # q 0.5, b 0.01, s 0.10: savings 0.5 - 0.01/0.10 = 0.4; composed pass rate: x's 2 + y on x's 2 failures = 1
    assert direct["q"] == 0.5 and direct["predicted_savings"] == pytest.approx(0.4)
    assert direct["break_even_q"] == pytest.approx(0.1) and direct["composed_pass_rate"] == 1.0
    # composed cost: 4 x 0.01 + 2 x 0.10 = 0.24 over 4 pairs
    assert direct["composed_mean_cost_usd"] == pytest.approx(0.06)
    measured = {r["arm"]: r for r in repo_tables(_stage(), design(), gate_costs={"A": 0.004, "B": 9.0})
                .breakeven.iter_rows(named=True)}
    cot = measured["cot"]
    assert cot["v_source"] == "measured" and cot["v"] == 0.004 and "measured" in cot["note"]
    # q 0.25, b 0.02, v 0.004, s 0.20: 0.25 - 0.024/0.2 = 0.13
    assert cot["predicted_savings"] == pytest.approx(0.13) and cot["break_even_q"] == pytest.approx(0.12)
    assert cot["composed_mean_cost_usd"] == pytest.approx(0.02 + 0.004 + 0.75 * 0.20)
    assert measured["direct"]["predicted_savings"] == pytest.approx(0.5 - 0.014 / 0.10)


def test_a_cascade_with_an_unknown_cost_is_a_row_that_says_why() -> None:
    got = repo_tables(_stage(), design(), late=_late([("y-cot-i4", None)])).breakeven
    cot = got.filter(pl.col("arm") == "cot").row(0, named=True)
    assert cot["predicted_savings"] is None and cot["note"].startswith("not composed") and cot["n_pairs"] == 4


def test_features_break_pass_rates_down_by_mutation_kind_library_and_module() -> None:
    features = pl.DataFrame({"item": ["i1", "i2", "i3", "i4"],
                             "mutation_kind": ["comparison", "comparison", "constant", "off_by_one"],
                             "library": ["alpha", "alpha", "beta", "beta"],
                             "module": ["a/x.py", "a/x.py", "b/y.py", None]})
    got = repo_tables(_stage(), design(), features=features).features
    row = {(r["system"], r["arm"], r["feature"], r["value"]): r for r in got.iter_rows(named=True)}
    comparison = row[("x", "direct", "mutation_kind", "comparison")]
    assert (comparison["n"], comparison["passes"], comparison["pass_rate"]) == (2, 2, 1.0)
    assert comparison["cost_per_pass_usd"] == pytest.approx(0.01)
    assert row[("x", "direct", "mutation_kind", "constant")]["passes"] == 0
    assert row[("x", "direct", "mutation_kind", "constant")]["cost_per_pass_usd"] is None
    assert (row[("y", "cot", "library", "beta")]["n"], row[("y", "cot", "library", "beta")]["passes"]) == (2, 1)
    assert row[("x", "cot", "module", "(not recorded)")]["n"] == 1  # an item without the metadata
    assert got.filter(pl.col("feature") == "library")["n"].sum() == 16  # every cell once per feature
    w = row[("x", "direct", "library", "alpha")]
    assert w["wilson_low"] < 1.0 == w["wilson_high"] and not math.isnan(w["wilson_low"])


def test_the_kind_figure_draws_a_bar_per_system_and_kind_and_its_bytes_repeat(tmp_path: Path) -> None:
    features = pl.DataFrame({"item": ["i1", "i2", "i3", "i4"],
                             "mutation_kind": ["comparison", "comparison", "constant", "off_by_one"],
                             "library": ["a"] * 4, "module": ["m"] * 4})
    table = repo_tables(_stage(), design(), features=features).features
    fig = figures.kind_figure(table)
    bars = [p for ax in fig.axes for p in ax.patches]
    assert len(bars) == 3 * 4  # three kinds x (x, y) x (direct, cot)
    first = figures.kind_plot(table, tmp_path / "a" / "kinds")
    again = figures.kind_plot(table, tmp_path / "b" / "kinds")
    assert [Path(p).suffix for p in first] == [".png", ".svg"]
    assert [Path(p).read_bytes() for p in first] == [Path(p).read_bytes() for p in again]
    empty = figures.kind_figure(table.clear())
    assert empty.axes and not empty.axes[0].patches
