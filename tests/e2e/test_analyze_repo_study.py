"""The analysis of a repository-task study (issue 17 item 8) on a real results folder: a tiny stage on the mutant
suite run by the interleaved runner through the gated path against the simulator, then `analyze_study`'s
repository-task tables checked against numbers computed by hand from the records, then the analysis notebook
run by papermill (`analyze_results`).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import nbformat
import polars as pl
import pytest

from harness.analysis.study import analyze_study
from harness.evidence.chain_read import read_log
from harness.evidence.portable import machine_paths
from harness.notebooks.analyze import analyze_results
from harness.run.layout import log_seed
from harness.run.runner import run_stage
from tests.support.repo_study import MUTANTS, mutant_sim, repo_prereg

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap"),
              pytest.mark.timeout(900)]  # 8 gated-path attempts on a loaded 2-core machine; a hang still fails

ARMS: list[dict[str, Any]] = [
    {"id": "single", "template": "{prompt}"},
    {"id": "feedback", "template": "{prompt}", "worker": {"kind": "llm-edit", "repair_turns": 1}}]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(prereg, results): a tiny real stage, 2 mutant items x (cheap, strong) x (single, feedback)."""
    root = tmp_path_factory.mktemp("repo-study")
    prereg = repo_prereg(root, suite=MUTANTS, items=2, arms=ARMS)
    results = root / "results"
    with mutant_sim(root, {"sim-flash": 0.0, "sim-k3": 1.0}) as url:
        summary = run_stage(prereg, "A", results, base_urls={"sim-flash": url, "sim-k3": url})
    assert summary.exit_code == 0 and summary.complete, summary.stops
    return prereg, results


def test_a_repo_task_study_is_analysed_by_system_arm_and_mutation_kind(study: tuple[Path, Path]) -> None:
    prereg, results = study
    folder = results / "rt" / "A"

    # by hand, from the records: each cell's spend is every attempt's metered cost plus its late costs
    plan = {json.loads(x)["run_id"]: json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    attempts = read_log(folder / "attempts.jsonl", log_seed("rt", "A", "attempts"))
    finals = read_log(folder / "finals.jsonl", log_seed("rt", "A", "finals"))
    late = [e for e in read_log(folder / "run.jsonl", log_seed("rt", "A", "run")) if e["event"] == "late_cost"]
    cost: dict[tuple[str, str], float] = defaultdict(float)
    requests: Counter[tuple[str, str]] = Counter()
    for a in [*attempts, *late]:
        cell = plan[a["run_id"]]
        cost[(cell["system"], cell["arm"])] += float(a["cost_usd"])
        requests[(cell["system"], cell["arm"])] += a.get("work", {}).get("exchanges", 0)
    passes = Counter((plan[f["run_id"]]["system"], plan[f["run_id"]]["arm"]) for f in finals if f["passed"])
    kind_of = {json.loads(x)["item"]: json.loads(x)["metadata"]["mutation_kind"]
               for x in (MUTANTS / "packet.jsonl").read_text().splitlines()}

    analysis = analyze_study(results / "rt", prereg=prereg)
    repo = analysis.repo
    assert repo is not None
    q = {(r["system"], r["arm"]): r for r in repo.q.iter_rows(named=True)}
    assert set(q) == {(s, a) for s in ("cheap", "strong") for a in ("single", "feedback")}
    for key, row in q.items():
        assert row["n"] == 2 and row["passes"] == passes[key]
        assert row["cost_usd"] == pytest.approx(cost[key], rel=1e-12) and row["requests"] == requests[key]
        want = cost[key] / passes[key] if passes[key] else None
        assert row["cost_per_pass_usd"] == (pytest.approx(want, rel=1e-12) if want is not None else None)
    assert q[("strong", "single")]["passes"] == 2 and q[("cheap", "single")]["passes"] == 0
    # cheap is always wrong: the feedback arm ran its repair turn, so it made more requests than attempts
    assert q[("cheap", "feedback")]["requests"] > q[("cheap", "single")]["requests"] == 2

    paired = {(r["between"], r["a"], r["b"], r["arm"] or r["system"]): r for r in repo.paired.iter_rows(named=True)}
    single = paired[("systems", "cheap", "strong", "single")]
    assert (single["n"], single["b01"], single["diff"]) == (2, 2, -1.0) and single["verdict"] is not None
    assert ("arms", "single", "feedback", "strong") in paired

    breakeven = repo.breakeven.filter(pl.col("arm") == "single").row(0, named=True)
    assert (breakeven["cheap"], breakeven["strong"], breakeven["v_source"], breakeven["v"]) == (
        "cheap", "strong", "assumed", 0.0)
    b, s = cost[("cheap", "single")] / 2, cost[("strong", "single")] / 2
    assert breakeven["predicted_savings"] == pytest.approx(0.0 - b / s, rel=1e-9)

    kinds = repo.features.filter((pl.col("feature") == "mutation_kind") & (pl.col("system") == "strong")
                                 & (pl.col("arm") == "single"))
    drawn = Counter(kind_of[plan[rid]["item"]] for rid in plan
                    if plan[rid]["system"] == "strong" and plan[rid]["arm"] == "single")
    assert dict(zip(kinds["value"].to_list(), kinds["n"].to_list(), strict=True)) == dict(drawn)
    assert set(kinds["pass_rate"].to_list()) == {1.0}



def test_the_analysis_notebook_shows_a_repo_task_study(study: tuple[Path, Path]) -> None:
    prereg, results = study
    root = prereg.parent.parent
    copy = root / "notebook-results"  # the notebook anchors its outputs: a copy, beside the preregistration
    shutil.copytree(results, copy)
    analysis = analyze_study(copy / "rt", prereg=prereg)
    got = analyze_results(copy / "rt", prereg=prereg, root=root)
    out = Path(got["out"])
    for name in ("repo_q", "repo_paired", "repo_breakeven", "repo_features"):
        assert (out / "tables" / f"{name}.csv").read_bytes() == _csv(analysis.tables()[name])
    assert (out / "figures" / "pass_by_kind.png").read_bytes().startswith(b"\x89PNG")
    executed = nbformat.read(out / "analysis.ipynb", as_version=4)  # type: ignore[no-untyped-call]
    text = "\n".join(str(o.get("text", "")) + json.dumps(o.get("data", {}))
                     for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Repository tasks" in text and "Cost per hidden-test pass" in text and "assumed" in text
    assert "pass_by_kind.png" in text
    assert machine_paths(copy, extra=[str(root)]) == ()


def _csv(frame: pl.DataFrame) -> bytes:
    from harness.analysis.study import table_csv

    return table_csv(frame)
