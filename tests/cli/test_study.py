"""The text `proctor analyze` prints (`harness.cli.study.analyze_text`, rendered by `harness.cli.output.human`) for a
repository-task study: its break-even lines, with v measured or assumed, read back from the repo_breakeven table
as `analyze_results` reads them (a real repo-task results folder needs the gated path: tests/e2e)."""

from __future__ import annotations

import io
from typing import Any

import polars as pl

from harness.analysis.repo import repo_tables
from harness.analysis.study import table_csv
from harness.cli.output import human
from harness.cli.study import analyze_text
from harness.notebooks.analyze import repo_breakeven_lines
from tests.support.analysis import design, frame


def _rows(table: pl.DataFrame) -> list[dict[str, Any]]:
    """The table through its CSV, as `analyze_results` reads tables/repo_breakeven.csv back."""
    return pl.read_csv(io.BytesIO(table_csv(table)), infer_schema_length=None).to_dicts()


def _got(repo_lines: list[str]) -> dict[str, Any]:
    return {"study": "rt", "prereg": "prereg/rt", "q_table": [{"stage": "A", "system": "x", "pass_rate": 0.5}],
            "verdicts": [], "break_even": [], "repo_break_even": repo_lines,
            "notebook": {"path": "a/analysis.ipynb"}, "html": {"path": "a/analysis.html"}, "tables": [],
            "figures": [], "anchored": []}


def _cells() -> pl.DataFrame:
    # x passes i1, i2 at $0.01; y passes all four at $0.10: q 0.5, b 0.01, s 0.10
    return frame([{"system": s, "arm": "direct", "item": f"i{k}", "passed": s == "y" or k <= 2,
                   "cost_usd": 0.01 if s == "x" else 0.10, "run_id": f"{s}-{k}"}
                  for s in ("x", "y") for k in range(1, 5)])


def test_analyze_text_prints_the_repo_task_break_even_with_v_measured_or_assumed() -> None:
    measured = repo_tables(_cells(), design(), gate_costs={"A": 0.0}, gate_seconds={"A": 1.5}).breakeven
    assumed = repo_tables(_cells(), design()).breakeven
    lines = repo_breakeven_lines(_rows(pl.concat([measured, assumed])))
    assert lines == [
        "stage A, arm direct: x first, then y: q 0.500 vs break-even 0.100 = (b $0.01 + v $0 measured, gate 1.50 "
        "s/attempt) / s $0.1 -> predicted savings +0.400 of y's cost; composed pass rate 1.000 vs y alone 1.000 "
        "(hidden-test gate)",
        "stage A, arm direct: x first, then y: q 0.500 vs break-even 0.100 = (b $0.01 + v $0 assumed) / s $0.1 "
        "-> predicted savings +0.400 of y's cost; composed pass rate 1.000 vs y alone 1.000 (hidden-test gate)"]
    text = "\n".join(human(analyze_text(_got(lines))))
    assert "repo_break_even:\n  - " + lines[0] + "\n  - " + lines[1] + "\nnotebook: a/analysis.ipynb" in text


def test_a_cascade_not_composed_is_a_line_saying_why_and_a_completion_study_prints_no_repo_lines() -> None:
    unknown = frame([{"system": s, "arm": "direct", "item": "i1", "passed": True,
                      "cost_usd": None if s == "y" else 0.01, "run_id": s} for s in ("x", "y")])
    (line,) = repo_breakeven_lines(_rows(repo_tables(unknown, design()).breakeven))
    assert line.startswith("stage A, arm direct: x first, then y: not composed: ")
    text = human(analyze_text(_got([])))
    assert not any("repo_break_even" in t for t in text) and "break_even: (none)" in text
