"""The study analysis (`harness.analysis.study`): a real stage against the simulator, hand-built frames.

The module-scoped `run` is one real stage (10 HumanEval items x 2 repeats, two simulated
systems of different skill) run by the runner on loopback; its tables are checked against
an independent recount from the report's frame, against `paired_comparison` called by
hand, and against the files on disk (provenance). Hand-built polars frames cover the
cases a real stage rarely shows (clustering, unpaired cells, unknown costs, stages that
do not run a comparison, the independent test, infeasible power inputs).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.breakeven import ORACLE_NOTE
from harness.analysis.frame_tables import analyze_frame
from harness.analysis.study import analyze_study, table_csv, write_tables
from harness.analysis.tables import q_table
from harness.audit.frame import ATTEMPT_COLUMNS
from harness.audit.report import build_report
from harness.errors import Refusal
from harness.stats.paired import cluster_robust_se, independent_tost, paired_comparison
from harness.stats.power import (
    exact_tost_power,
    items_needed,
    minimum_detectable_margin,
    tost_power,
)
from tests.support.analysis import design, frame
from tests.support.study import prereg, sim_servers, system, urls

ITEMS, REPEATS = 10, 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(prereg folder, results root) of one real stage A: good (sim-flash, skill .7) vs bad (sim-glm, .5)."""
    root = tmp_path_factory.mktemp("analysis-run")
    with sim_servers(root) as sim:
        url = sim([system("sim-flash", 0.7), system("sim-glm", 0.5)])
        p = prereg(root, items=ITEMS, repeats=REPEATS)
        from harness.run.runner import run_stage

        summary = run_stage(p, "A", root / "results", base_urls=urls(url))
        assert summary.exit_code == 0
        yield p, root / "results"


@pytest.fixture
def copied(run: tuple[Path, Path], tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    """A copy of the run's preregistration and results under `tmp_path/<where>`."""
    def make(where: str) -> tuple[Path, Path]:
        p, results = run
        base = tmp_path / where
        shutil.copytree(p, base / "prereg" / "rt")
        shutil.copytree(results, base / "results")
        return base / "prereg" / "rt", base / "results"

    return make


def _by_cell(frame: pl.DataFrame, system: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["item"], r["repeat"]): r for r in frame.iter_rows(named=True) if r["system"] == system}


def test_a_real_stage_matches_an_independent_recount(run: tuple[Path, Path]) -> None:
    p, results = run
    analysis = analyze_study(results / "rt", prereg=p)
    report = build_report(results / "rt" / "A", prereg_dir=p)
    frame = report.frame
    assert analysis.study == "rt" and analysis.prereg == str(p) and analysis.alpha == 0.05
    assert analysis.attempts.equals(frame)
    assert list(analysis.attempts.columns) == list(ATTEMPT_COLUMNS)
    assert analysis.q.equals(q_table(frame, alpha=0.05))

    (v,) = analysis.validation.iter_rows(named=True)
    assert (v["stage"], v["cells"], v["standing"], v["not_standing"]) == ("A", 2 * ITEMS * REPEATS, frame.height, 0)
    assert v["passed"] == sum(frame.get_column("passed").to_list())
    assert v["plan_sha256"] == hashlib.sha256((results / "rt" / "A" / "plan.jsonl").read_bytes()).hexdigest()
    assert v["frozen_sha256"] == hashlib.sha256((p / "FROZEN.json").read_bytes()).hexdigest()

    # comparisons: a plain recount of the pairs, then paired_comparison by hand on the same pairs
    good, bad = _by_cell(frame, "good"), _by_cell(frame, "bad")
    keys = sorted(good.keys() & bad.keys())
    assert len(keys) == ITEMS * REPEATS
    xa = [good[k]["passed"] for k in keys]
    xb = [bad[k]["passed"] for k in keys]
    (c,) = analysis.comparisons.iter_rows(named=True)
    assert (c["stage"], c["a"], c["b"], c["arm"], c["margin"]) == ("A", "good", "bad", "direct", 0.1)
    assert c["n"] == len(keys) and c["n_items"] == ITEMS and c["unpaired"] == 0
    assert c["b10"] == sum(1 for x, y in zip(xa, xb, strict=True) if x and not y)
    assert c["b01"] == sum(1 for x, y in zip(xa, xb, strict=True) if y and not x)
    assert c["p_a"] == sum(xa) / len(keys) and c["p_b"] == sum(xb) / len(keys)
    assert c["b10"] + c["b01"] > 0, "the simulator's skills .7 and .5 should disagree somewhere"
    hand = paired_comparison(xa, xb, items=[k[0] for k in keys], margin=0.1, alpha=0.05)
    assert c["se_method"] == hand.se_method == "cluster"
    assert (c["method"], c["verdict"]) == ("tango", hand.verdict)
    # issue 15: a clustered variance below the unclustered one is floored, and the note says so
    assert c["note"] == hand.note and c["ci_method"] == "tango score"
    for name in ("diff", "se", "ci_low", "ci_high", "wald_p", "tango_p", "mcnemar_p", "design_effect", "p",
                 "wald_ci_low", "wald_ci_high"):
        assert c[name] == pytest.approx(getattr(hand, name), rel=1e-12, abs=1e-15), name

    # break-even: the cheaper system by measured mean cost per standing cell
    mean = {s: math.fsum(r["cost_usd"] for r in cells.values()) / len(cells) for s, cells in
            (("good", good), ("bad", bad))}
    cheap, strong = sorted(mean, key=lambda s: (mean[s], ["good", "bad"].index(s)))
    (be,) = analysis.breakeven.iter_rows(named=True)
    assert (be["stage"], be["arm"], be["cheap"], be["strong"], be["gate"]) == ("A", "direct", cheap, strong, "oracle")
    assert be["note"] == ORACLE_NOTE and be["n_pairs"] == len(keys) and be["unpaired"] == 0
    cells = {"good": good, "bad": bad}
    c_pass = [cells[cheap][k]["passed"] for k in keys]
    s_pass = [cells[strong][k]["passed"] for k in keys]
    assert be["q"] == pytest.approx(sum(c_pass) / len(keys))
    assert be["b"] == pytest.approx(mean[cheap], rel=1e-12)
    assert be["s"] == pytest.approx(mean[strong], rel=1e-12)
    assert be["composed_pass_rate"] == pytest.approx(sum(x or y for x, y in zip(c_pass, s_pass, strict=True))
                                                     / len(keys))
    composed = math.fsum(cells[cheap][k]["cost_usd"] + (0.0 if cells[cheap][k]["passed"] else
                                                        cells[strong][k]["cost_usd"]) for k in keys)
    assert be["composed_total_cost_usd"] == pytest.approx(composed, rel=1e-12)
    assert be["break_even_q"] == pytest.approx(mean[cheap] / mean[strong], rel=1e-12)

    grid = analysis.sensitivity
    assert grid.height == 25
    assert set(grid.select("stage", "arm", "cheap", "strong").unique().rows()) == {("A", "direct", cheap, strong)}
    oracle = grid.filter((pl.col("false_accept") == 0) & (pl.col("false_reject") == 0)).row(0, named=True)
    assert oracle["pass_rate"] == pytest.approx(be["composed_pass_rate"], rel=1e-12)
    assert oracle["mean_cost_usd"] == pytest.approx(be["composed_mean_cost_usd"], rel=1e-12)

    # power at the registered items: repeats are clustered by item, so n is the stage's items
    (pw,) = analysis.power.iter_rows(named=True)
    common: dict[str, Any] = {"alpha": 0.05, "p_a": 0.6, "p_b": 0.65, "correlation": 0.5}
    assert (pw["items"], pw["repeats"], pw["items_registered"]) == (ITEMS, REPEATS, ITEMS)
    # issue 15: power_at_n is the exact power of Tango's TOST; the normal approximation is beside it
    assert pw["power_at_n"] == exact_tost_power(ITEMS, margin=0.1, **common) and pw["power_method"] == "exact"
    assert pw["power_at_n_normal"] == tost_power(ITEMS, margin=0.1, **common)
    needed = items_needed(margin=0.1, power=0.8, **common)
    assert pw["items_needed"] == needed.n and pw["reaches"] is ((needed.n or 0) <= ITEMS)
    assert pw["minimum_detectable_margin"] == minimum_detectable_margin(ITEMS, power=0.8, **common)


def _last_line_sha(path: Path) -> tuple[int, str]:
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    return len(lines) - 1, hashlib.sha256(lines[-2]).hexdigest()


def test_provenance_hashes_the_files_and_does_not_depend_on_where_they_lie(
    copied: Callable[[str], tuple[Path, Path]],
) -> None:
    p1, r1 = copied("one")
    p2, r2 = copied("two/deeper")
    first = analyze_study(r1 / "rt", prereg=p1).provenance
    second = analyze_study(r2 / "rt" / "A", prereg=p2).provenance  # a stage folder finds the same study
    assert first.equals(second)
    assert table_csv(first) == table_csv(second)
    rows = {r["name"]: r for r in first.iter_rows(named=True)}
    for name in ("FROZEN.json", "design.toml", "systems.json", "PREREG.md"):
        assert rows[f"prereg:{name}"]["sha256"] == hashlib.sha256((p1 / name).read_bytes()).hexdigest()
        assert rows[f"prereg:{name}"]["path"] == name
    assert rows["A:plan"]["path"] == "A/plan.jsonl"
    assert rows["A:plan"]["sha256"] == hashlib.sha256((r1 / "rt" / "A" / "plan.jsonl").read_bytes()).hexdigest()
    for log in ("attempts", "finals", "run", "anchors"):
        row = rows[f"A:{log}"]
        assert row["path"] == f"A/{log}.jsonl" and row["kind"] == "log"
        assert (row["lines"], row["head"]) == _last_line_sha(r1 / "rt" / "A" / f"{log}.jsonl")
    for name in ("model-proctor", "python", "polars", "scipy", "matplotlib"):
        assert rows[f"version:{name}"]["version"]
    assert not any(str(v).startswith("/") for v in first.get_column("path").drop_nulls().to_list())


def test_results_root_study_folder_and_stage_folder_give_the_same_tables(run: tuple[Path, Path]) -> None:
    p, results = run
    analyses = [analyze_study(path, prereg=p) for path in (results, results / "rt", results / "rt" / "A")]
    for other in analyses[1:]:
        for name, table in analyses[0].tables().items():
            assert table.equals(other.tables()[name]), name


def test_a_completion_study_gets_no_repository_task_tables(run: tuple[Path, Path]) -> None:
    p, results = run
    analysis = analyze_study(results / "rt", prereg=p)
    assert analysis.repo is None  # its analysis is exactly as before repo_task suites had their own tables
    assert list(analysis.tables()) == ["hypotheses", "validation", "amendments", "left_out", "q", "comparisons",
                                       "breakeven", "sensitivity", "power", "provenance"]


def test_write_tables_is_byte_identical_and_reads_back(run: tuple[Path, Path], tmp_path: Path) -> None:
    p, results = run
    first = write_tables(analyze_study(results / "rt", prereg=p), tmp_path / "one")
    again = write_tables(analyze_study(results / "rt", prereg=p), tmp_path / "two")
    assert list(first) == ["hypotheses", "validation", "amendments", "left_out", "q", "comparisons", "breakeven",
                           "sensitivity", "power", "provenance"]
    analysis = analyze_study(results / "rt", prereg=p)
    for name, path in first.items():
        data = Path(path).read_bytes()
        assert data == Path(again[name]).read_bytes(), name
        assert Path(path).name == f"{name}.csv"
        parsed = list(csv.reader(io.StringIO(data.decode("utf-8"))))
        frame = analysis.tables()[name]
        assert parsed[0] == frame.columns and len(parsed) == frame.height + 1
    comparisons = list(csv.DictReader(io.StringIO(Path(first["comparisons"]).read_text())))
    assert float(comparisons[0]["tango_p"]) == pytest.approx(analysis.comparisons.item(0, "tango_p"), rel=1e-11)
    assert comparisons[0]["note"] == (analysis.comparisons.item(0, "note") or "")


def test_a_broken_stage_propagates_the_reports_refusal_unchanged(copied: Callable[[str], tuple[Path, Path]]) -> None:
    p, results = copied("broken")
    finals = results / "rt" / "A" / "finals.jsonl"
    data = bytearray(finals.read_bytes())
    at = data.index(b'"passed":') + len(b'"passed":')
    data[at:at + 4] = b"true" if data[at:at + 5] == b"false" else b"fals"
    finals.write_bytes(bytes(data))
    with pytest.raises(Refusal) as direct:
        build_report(results / "rt" / "A", prereg_dir=p)
    with pytest.raises(Refusal) as through:
        analyze_study(results / "rt", prereg=p)
    assert through.value.code == direct.value.code == "report_refused"
    assert (through.value.message, through.value.path, through.value.details) == (
        direct.value.message, direct.value.path, direct.value.details)


def test_no_results_and_no_preregistration_are_refused(run: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(Refusal) as info:
        analyze_study(tmp_path / "empty")
    assert info.value.code == "results_not_found"
    _, results = run
    with pytest.raises(Refusal) as info:
        analyze_study(results / "rt", root=tmp_path)  # no prereg/ under this root holds the freeze
    assert info.value.code == "prereg_not_found"


# --- hand-built frames (tests.support.analysis) ---------------------------------------------


def test_repeats_use_the_item_clustered_standard_error() -> None:
    # three items x three repeats; item i0 always agrees, i1 always favours x, i2 is mixed
    outcomes = {("i0", 0): (1, 1), ("i0", 1): (0, 0), ("i0", 2): (1, 1),
                ("i1", 0): (1, 0), ("i1", 1): (1, 0), ("i1", 2): (1, 0),
                ("i2", 0): (0, 1), ("i2", 1): (1, 0), ("i2", 2): (0, 0)}
    rows = [{"system": s, "item": item, "repeat": r, "passed": bool(pair[k])}
            for (item, r), pair in outcomes.items() for k, s in enumerate(("x", "y"))]
    keys = list(outcomes)
    xa, xb, items = [outcomes[k][0] for k in keys], [outcomes[k][1] for k in keys], [k[0] for k in keys]
    (c,) = analyze_frame(frame(rows), design(), stages=["A"]).comparisons.iter_rows(named=True)
    assert (c["n"], c["n_items"], c["b10"], c["b01"], c["n11"], c["n00"]) == (9, 3, 4, 1, 2, 2)
    assert c["se_method"] == "cluster"
    assert c["se"] == pytest.approx(cluster_robust_se(xa, xb, items), rel=1e-12)
    # by hand: S = (0, 3, 0), d = 3/9; se^2 = ((0 - 3d)^2 + (3 - 3d)^2 + (0 - 3d)^2) / 81
    d = 3 / 9
    assert c["se"] == pytest.approx(math.sqrt(((3 * d) ** 2 * 2 + (3 - 3 * d) ** 2) / 81), rel=1e-12)
    assert c["se"] != pytest.approx(paired_comparison(xa, xb, margin=0.2).se)  # not the unclustered SE
    hand = paired_comparison(xa, xb, items=items, margin=0.2, alpha=0.05)
    for name in ("ci_low", "ci_high", "wald_p", "tango_p", "mcnemar_p", "design_effect"):
        assert c[name] == pytest.approx(getattr(hand, name), rel=1e-12), name
    (unclustered,) = analyze_frame(frame(rows), design(clustering="none")).comparisons.iter_rows(named=True)
    assert unclustered["se_method"] == "paired"
    assert unclustered["se"] == pytest.approx(paired_comparison(xa, xb, margin=0.2).se, rel=1e-12)


def test_comparisons_do_not_depend_on_row_order_or_on_the_run() -> None:
    # irregular outcomes and missing cells: polars' group_by hands the per-item sums back
    # in varying orders, so a float sum over them would differ in its last bits from run to run
    rng = random.Random(1)
    rows = [{"system": s, "item": f"i{i}", "repeat": r, "passed": rng.random() < 0.6}
            for s in "xy" for i in range(40) for r in range(3) if rng.random() < 0.9]
    cells = frame(rows)
    first = analyze_frame(cells, design())
    assert first.comparisons.item(0, "se_method") == "cluster"
    for seed in range(10):
        again = analyze_frame(cells.sample(fraction=1.0, shuffle=True, seed=seed), design())
        assert again.comparisons.equals(first.comparisons)
        assert again.power.equals(first.power)
        same = analyze_frame(cells, design())
        for name in ("q", "comparisons", "breakeven", "sensitivity", "power"):
            assert getattr(same, name).equals(getattr(first, name)), name


@st.composite
def random_cells(draw: st.DrawFn) -> pl.DataFrame:
    items = draw(st.integers(1, 6))
    repeats = draw(st.integers(1, 3))
    rows = []
    for slot in ("x", "y"):
        for i in range(items):
            for r in range(repeats):
                present = draw(st.booleans()) or draw(st.booleans())  # some cells do not stand
                if present:
                    rows.append({"system": slot, "item": f"i{i}", "repeat": r, "passed": draw(st.booleans())})
    return frame(rows) if rows else frame([]).clear()


@settings(max_examples=150, deadline=None)
@given(random_cells())
def test_discordant_counts_equal_a_plain_recount(cells: pl.DataFrame) -> None:
    (c,) = analyze_frame(cells, design(), stages=["A"]).comparisons.iter_rows(named=True)
    x = {(r["item"], r["repeat"]): r["passed"] for r in cells.iter_rows(named=True) if r["system"] == "x"}
    y = {(r["item"], r["repeat"]): r["passed"] for r in cells.iter_rows(named=True) if r["system"] == "y"}
    both = x.keys() & y.keys()
    assert c["unpaired"] == len(x) + len(y) - 2 * len(both)
    if not both:
        assert c["n"] == 0 and c["b10"] is None and c["verdict"] is None and "no paired standing cells" in c["note"]
        return
    assert c["n"] == len(both)
    assert c["n_items"] == len({item for item, _ in both})
    assert c["b10"] == sum(1 for k in both if x[k] and not y[k])
    assert c["b01"] == sum(1 for k in both if y[k] and not x[k])
    assert c["n11"] == sum(1 for k in both if x[k] and y[k])
    keys = sorted(both)
    hand = paired_comparison([x[k] for k in keys], [y[k] for k in keys], items=[k[0] for k in keys], margin=0.2)
    assert c["se"] == pytest.approx(hand.se, rel=1e-9, abs=1e-15)
    assert c["verdict"] == hand.verdict


def test_a_comparison_a_stage_cannot_make_is_a_row_with_a_note() -> None:
    rows = [{"stage": "A", "system": "x", "item": f"i{i}", "passed": True} for i in range(3)]
    rows += [{"stage": "B", "system": "x", "item": f"i{i}", "passed": i % 2 == 0} for i in range(3)]
    tables = analyze_frame(frame(rows), design())
    a, b = tables.comparisons.iter_rows(named=True)
    assert (a["stage"], a["n"], a["n_a"], a["n_b"], a["verdict"]) == ("A", 0, 3, 0, None)
    assert "no paired standing cells" in a["note"]
    assert (b["stage"], b["n"], b["verdict"], b["note"]) == ("B", None, None, "stage B does not run system y")
    # single-system stage and a stage where only one system stood: no cascade to compose
    assert tables.breakeven.height == 0 and tables.sensitivity.height == 0
    pa, pb = tables.power.iter_rows(named=True)
    assert pa["items_registered"] == 50 and pa["note"] is None
    assert (pb["items_registered"], pb["power_at_n"], pb["note"]) == (None, None, "stage B does not run system y")


def test_an_empty_frame_still_lists_every_stage_and_comparison() -> None:
    tables = analyze_frame(frame([]).clear(), design(), stages=["B", "A"])
    assert tables.q.height == 0 and tables.breakeven.height == 0
    assert tables.comparisons.get_column("stage").to_list() == ["A", "B"]  # design order
    assert tables.comparisons.get_column("n").to_list() == [0, None]


def test_the_independent_test_when_registered() -> None:
    rows = [{"system": "x", "item": f"i{i}", "passed": i < 7} for i in range(10)]
    rows += [{"system": "y", "item": f"i{i}", "passed": i < 5} for i in range(8)]
    (c,) = analyze_frame(frame(rows), design(test="independent_tost")).comparisons.iter_rows(named=True)
    hand = independent_tost(7, 10, 5, 8, 0.2, 0.05)
    # issue 15: the registered independent test is Miettinen-Nurminen's score TOST (it was Wald's)
    assert (c["method"], c["se_method"], c["n_a"], c["n_b"], c["n"]) == ("miettinen-nurminen", "independent", 10, 8, 18)
    assert (c["diff"], c["se"], c["p"], c["verdict"]) == (hand.diff, hand.se, hand.p, hand.verdict)
    assert (c["ci_low"], c["ci_high"], c["wald_p"]) == (hand.ci_low, hand.ci_high, hand.wald_p)
    assert c["b10"] is None and c["tango_p"] is None and c["mcnemar_p"] is None


def test_the_independent_test_clusters_repeats_by_item() -> None:
    """Issue 15 item 4: with repeats and clustering = "item", each system's variance carries its design effect."""
    rows = [{"system": "x", "item": f"i{i}", "repeat": r, "passed": i < 14} for i in range(20) for r in range(3)]
    rows += [{"system": "y", "item": f"i{i}", "repeat": r, "passed": i < 13} for i in range(20) for r in range(3)]
    (c,) = analyze_frame(frame(rows), design(test="independent_tost")).comparisons.iter_rows(named=True)
    # every repeat of an item agrees: the design effect is the 3 repeats
    assert c["design_effect_a"] == pytest.approx(3.0) and c["design_effect_b"] == pytest.approx(3.0)
    hand = independent_tost(42, 60, 39, 60, 0.2, 0.05, design_effect_a=3.0, design_effect_b=3.0)
    assert c["ci_low"] == pytest.approx(hand.ci_low, abs=1e-12) and c["verdict"] == hand.verdict
    unclustered = independent_tost(42, 60, 39, 60, 0.2, 0.05)
    assert c["ci_high"] - c["ci_low"] > unclustered.ci_high - unclustered.ci_low
    assert "design effect" in c["note"]
    plain = analyze_frame(frame(rows), design(test="independent_tost", clustering="none")).comparisons.row(0, named=True)
    assert plain["design_effect_a"] == 1.0 and plain["ci_low"] == pytest.approx(unclustered.ci_low, abs=1e-12)


def test_cascades_follow_measured_cost_and_name_what_cannot_be_composed() -> None:
    rows = []
    for i in range(4):
        # direct: z cheapest, x and y tie (design order: x first); y has one cell more than its partners
        rows += [{"system": "x", "item": f"i{i}", "passed": i < 2, "cost_usd": 0.02},
                 {"system": "y", "item": f"i{i}", "passed": i < 3, "cost_usd": 0.02},
                 {"system": "z", "item": f"i{i}", "passed": i < 1, "cost_usd": 0.001}]
        # cot: x has an unknown cost
        rows += [{"system": s, "arm": "cot", "item": f"i{i}", "passed": True,
                  "cost_usd": None if (s, i) == ("x", 0) else 0.01 * (k + 1)} for k, s in enumerate("xy")]
    rows.append({"system": "y", "item": "i9", "passed": True, "cost_usd": 0.02})
    tables = analyze_frame(frame(rows), design(), stages=["A"])
    be = tables.breakeven
    order = [(r["arm"], r["cheap"], r["strong"]) for r in be.iter_rows(named=True)]
    assert order == [("direct", "z", "x"), ("direct", "z", "y"), ("direct", "x", "y"), ("cot", "x", "y")]
    zy = be.row(1, named=True)
    assert (zy["n_pairs"], zy["unpaired"]) == (4, 1) and "1 standing cells without a partner" in zy["note"]
    assert zy["q"] == 0.25 and zy["composed_pass_rate"] == 0.75
    cot = be.row(3, named=True)  # x is cheaper on its known costs (0.01 against 0.02), one is unknown
    assert cot["q"] is None and "unknown cost" in cot["note"]
    assert tables.sensitivity.height == 3 * 25


def test_power_names_infeasible_inputs() -> None:
    impossible = {"a": "x", "b": "y", "arm": "direct", "margin": 0.2, "expected_a": 0.9, "expected_b": 0.1,
                  "correlation": 0.9}
    tables = analyze_frame(frame([]).clear(), design(comparisons=[impossible]), stages=["A"])
    (pw,) = tables.power.iter_rows(named=True)
    assert pw["power_at_n"] is None and pw["minimum_detectable_margin"] is None and pw["items_needed"] is None
    assert "impossible" in pw["note"]
    outside = {**impossible, "expected_a": 0.5, "expected_b": 0.8, "correlation": 0.0}
    (pw,) = analyze_frame(frame([]).clear(), design(comparisons=[outside]), stages=["A"]).power.iter_rows(named=True)
    assert pw["items_needed"] is None and "not inside the margin" in pw["note"]
    assert pw["power_at_n_normal"] == tost_power(50, margin=0.2, alpha=0.05, p_a=0.5, p_b=0.8, correlation=0.0)
    assert pw["power_at_n"] == exact_tost_power(50, margin=0.2, alpha=0.05, p_a=0.5, p_b=0.8, correlation=0.0)


def test_scope_stages_run_every_system_and_arm() -> None:
    rows = [{"stage": "full", "system": s, "item": f"i{i}", "repeat": r, "passed": (i + r) % 2 == 0}
            for s in "xy" for i in range(3) for r in range(2)]
    tables = analyze_frame(frame(rows), design())
    (c,) = tables.comparisons.iter_rows(named=True)
    assert (c["stage"], c["n"], c["n_items"], c["se_method"]) == ("full", 6, 3, "cluster")
    (pw,) = tables.power.iter_rows(named=True)
    assert (pw["items"], pw["repeats"], pw["items_registered"]) == (50, 2, 50)


def test_bad_frames_are_refused() -> None:
    good = frame([{"system": "x", "item": "i0", "passed": True}])
    with pytest.raises(ValueError, match="extra columns: oops"):
        analyze_frame(good.with_columns(pl.lit(1).alias("oops")), design())
    with pytest.raises(ValueError, match="share a"):
        analyze_frame(pl.concat([good, good]), design())
    with pytest.raises(ValueError, match="not registered"):
        analyze_frame(good.with_columns(pl.lit("Z").alias("stage")), design())


def test_exhausted_cells_are_dropped_from_every_comparison_which_says_how_many_and_why() -> None:
    """Issue 13 item 1: an exhausted cell (an outage) is never scored; a comparison names the pairs it lost."""
    rows = [{"system": s, "item": f"i{i}", "passed": s == "x"} for s in ("x", "y") for i in range(10)]
    # items i8, i9 of y were exhausted: they are not in the scored frame at all
    scored = frame([r for r in rows if not (r["system"] == "y" and r["item"] in ("i8", "i9"))])
    gone = pl.DataFrame([{"stage": "A", "system": "y", "arm": "direct", "item": i, "repeat": 0} for i in ("i8", "i9")],
                        schema={"stage": pl.String, "system": pl.String, "arm": pl.String, "item": pl.String,
                                "repeat": pl.Int64})
    (c,) = analyze_frame(scored, design(), stages=["A"], exhausted=gone).comparisons.iter_rows(named=True)
    assert c["n"] == 8 and c["dropped_exhausted"] == 2 and c["unpaired"] == 2
    assert c["note"].startswith("2 pairs dropped: exhausted by transport failures")
    (be,) = analyze_frame(scored, design(), stages=["A"], exhausted=gone).breakeven.iter_rows(named=True)
    assert be["n_pairs"] == 8 and be["note"].startswith("2 pairs dropped: exhausted")  # the cascade says it too
    (plain,) = analyze_frame(scored, design(), stages=["A"]).comparisons.iter_rows(named=True)
    assert plain["dropped_exhausted"] == 0 and plain["n"] == 8
    (ind,) = analyze_frame(scored, design(test="independent_tost"), stages=["A"],
                           exhausted=gone).comparisons.iter_rows(named=True)
    assert ind["dropped_exhausted"] == 2 and ind["n_b"] == 8 and "2 cells dropped" in ind["note"]


def test_an_outage_study_is_analysed_without_its_exhausted_cells(tmp_path: Path) -> None:
    with sim_servers(tmp_path) as sim:
        url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0, server_error=1.0)])  # every 'bad' answer: 500
        p = prereg(tmp_path)
        from harness.run.runner import run_stage

        run_stage(p, "A", tmp_path / "results", base_urls=urls(url))
    got = analyze_study(tmp_path / "results" / "rt", prereg=p)
    (v,) = got.validation.iter_rows(named=True)
    assert v["exhausted"] == 6 and v["standing"] == 6 and v["not_standing"] == 0
    assert set(got.attempts.get_column("system")) == {"good"}  # 'bad' is never scored 0/6
    (c,) = got.comparisons.iter_rows(named=True)
    assert c["n"] == 0 and c["dropped_exhausted"] == 6 and "6 pairs dropped" in c["note"]
    assert set(got.q.get_column("system")) == {"good"}
    # issue 13 item 8: the reader sees the exhausted cells per system, and why they are not scored
    assert got.left_out.select("stage", "system", "cells", "scored", "exhausted", "not_standing").rows() == [
        ("A", "good", 6, 6, 0, 0), ("A", "bad", 6, 0, 6, 0)]
    (why,) = got.left_out.filter(pl.col("system") == "bad").get_column("why")
    assert why.startswith("exhausted: every transport retry failed (an outage, not the model)")
    assert got.statement is not None and got.statement.question is None  # the fixture's PREREG.md asks nothing
    (h,) = got.hypotheses.iter_rows(named=True)
    assert (h["a"], h["b"], h["arm"], h["margin"]) == ("good", "bad", "direct", 0.1)
