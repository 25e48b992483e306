"""`proctor analyze`: notebooks/analysis.ipynb under a real papermill kernel on a real simulator stage.

One module-scoped run of a small stage (6 HumanEval items, two simulated systems,
the fixture's registered comparison); each test works on a copy of the
preregistration and the results under its tmp_path, so the preregistration can
also be found by its freeze's sha256 under `<tmp_path>/prereg/`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import polars as pl
import pytest

from harness.audit.oracle import run_problems
from harness.errors import Refusal
from harness.evidence.chain_read import read_log, verify_log
from harness.evidence.jsonio import sha256_hex
from harness.notebooks.analyze import (
    analysis_paths,
    analyze_results,
    breakeven_lines,
    frame_table,
    verdict_lines,
)
from harness.run.anchors import output_manifest_name
from harness.run.layout import log_seed
from tests.support.cli import run_proctor
from tests.support.oracle import flip_verdict, rebuild
from tests.support.paths import REPO
from tests.support.study import prereg, sim_servers, system, urls

TABLES = ("amendments", "breakeven", "comparisons", "hypotheses", "left_out", "power", "provenance", "q",
          "sensitivity", "validation")
FIGURES = ("forest.png", "forest.svg", "savings.png", "savings.svg", "sensitivity.png", "sensitivity.svg")
PREREG_TEXT = """# runner test

Registered before running.

## Research question

Does the *bad* system keep the good one's pass rate?

## Hypotheses

- H1: good and bad pass within 0.1 of each other.

## Budgets

Small.
"""


@pytest.fixture(scope="module")
def stage_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("analyze-run")
    with sim_servers(root) as sim:
        url = sim([system("sim-flash", 0.8), system("sim-glm", 0.5)])
        p = prereg(root, text=PREREG_TEXT)
        from harness.run.runner import run_stage

        assert run_stage(p, "A", root / "results", base_urls=urls(url)).exit_code == 0
    yield root


@pytest.fixture
def study(stage_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of (prereg/rt, results) under tmp_path."""
    shutil.copytree(stage_run / "prereg", tmp_path / "prereg")
    shutil.copytree(stage_run / "results", tmp_path / "results")
    return tmp_path / "prereg" / "rt", tmp_path / "results"


def anchors(stage: Path) -> list[dict[str, Any]]:
    seed = log_seed("rt", "A", "anchors")
    assert verify_log(stage / "anchors.jsonl", seed).ok
    return read_log(stage / "anchors.jsonl", seed)


def code_text(path: Path) -> str:
    parts = []
    for cell in nbformat.read(path, as_version=4).cells:
        for out in cell.get("outputs", []):
            parts += [out.get("text", ""), out.get("data", {}).get("text/plain", ""), *out.get("traceback", [])]
    return "\n".join(parts)


def files_of(out: Path) -> list[Path]:
    """What one analysis writes, in the order `analyze_results` returns it."""
    return [out / "analysis.ipynb", out / "analysis.html", *(out / "tables" / f"{t}.csv" for t in TABLES),
            *(out / "figures" / f for f in FIGURES)]


def test_analyze_writes_and_anchors_every_output_and_repeats_byte_for_byte(study: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    p, results = study
    stage = results / "rt" / "A"
    out = results / "rt" / "analysis"
    before = len(anchors(stage))

    # the human CLI: the q table, the verdicts, the break-even lines and the paths; progress on stderr
    done = subprocess.run([sys.executable, "-m", "harness", "analyze", str(results), "--prereg", str(p)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for shown in ("q_table:", "pass_rate: 0.", "comparisons:\n  - stage A: good vs bad on direct, margin 0.1: diff ",
                  "break_even:\n  - stage A, arm direct: ", f"html: {out / 'analysis.html'}", str(out / "tables" / "q.csv")):
        assert shown in done.stdout, shown
    assert f"running the notebook -> {out / 'analysis.ipynb'}" in done.stderr
    assert "anchoring the notebook and 17 outputs in 1 stage(s)" in done.stderr and "Traceback" not in done.stderr

    # the files: the executed notebook, its HTML, one CSV per table, each figure as PNG and SVG
    assert sorted(f.name for f in (out / "tables").iterdir()) == [f"{t}.csv" for t in TABLES]
    assert sorted(f.name for f in (out / "figures").iterdir()) == list(FIGURES)
    # every anchored sha256 is the file's, in the stage's chained anchors.jsonl; the oracle accepts the anchor
    first = anchors(stage)[-1]
    assert first["reason"] == "analysis" and len(anchors(stage)) == before + 1
    assert first["manifests"] == {output_manifest_name(str(stage), f, "output" if i else "notebook"):
                                  sha256_hex(f.read_bytes()) for i, f in enumerate(files_of(out))}
    assert "output:../analysis/tables/q.csv" in first["manifests"]
    assert run_problems(stage, prereg_dir=p) == []

    # the executed notebook: every cell ran, Validation first, every section shown
    nb = nbformat.read(out / "analysis.ipynb", as_version=4)
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## ")]
    assert headings == ["## What the study asks", "## Validation", "## The q table", "## Paired comparisons", "## Break-even", "## Power",
                        "## Provenance"]
    text = code_text(out / "analysis.ipynb")
    assert "Traceback" not in text
    for shown in ("Validation of study rt", "q table: pass rate", "Paired comparisons", "Break-even of cheap-first",
                  "Sensitivity to a noisy gate", "Power at the registered", "Provenance", "Outputs written",
                  "figure: figures/forest.png, figures/forest.svg"):  # relative: no machine path (issue 13)
        assert shown in text, shown
    html = (out / "analysis.html").read_text()
    assert html.count('src="data:image/png;base64,') == 3 and "Paired comparisons" in html

    # a second analysis (in process: what --json prints; the preregistration found by its freeze's sha256
    # under tmp_path/prereg; another folder)
    again = tmp_path / "again"
    res = analyze_results(results / "rt", out=again, root=tmp_path)
    assert res["ok"] and res["study"] == "rt" and res["prereg"] == str(p) and res["out"] == str(again)
    returned = [res["notebook"], res["html"], *res["tables"], *res["figures"]]
    assert [Path(f["path"]) for f in returned] == files_of(again)
    assert [t["name"] for t in res["tables"]] == list(TABLES)
    second = anchors(stage)[-1]
    assert len(anchors(stage)) == before + 2 and res["anchored"] == [
        {"stage": "A", "folder": str(stage), "anchored": True, "manifests": second["manifests"]}]
    assert second["manifests"] == {output_manifest_name(str(stage), f["path"], "output" if i else "notebook"):
                                   f["sha256"] for i, f in enumerate(returned)}
    for f in returned:
        assert f["sha256"] == sha256_hex(Path(f["path"]).read_bytes()), f["path"]
    assert run_problems(stage, prereg_dir=p) == []
    # what it returns is read back from the tables: one verdict per comparison, one line per cascade
    q = pl.read_csv(again / "tables" / "q.csv")
    assert [r["passes"] for r in res["q_table"]] == q.get_column("passes").to_list()
    comparisons = pl.read_csv(again / "tables" / "comparisons.csv")
    assert len(res["verdicts"]) == comparisons.height == 1
    assert res["verdicts"][0].startswith("stage A: good vs bad on direct, margin 0.1: diff ")
    assert res["verdicts"][0].endswith(f"-> {comparisons.get_column('verdict')[0]}")
    assert len(res["break_even"]) == pl.read_csv(again / "tables" / "breakeven.csv").height == 1

    # byte-identical figures and tables; provenance differs only in anchors.jsonl, which the first one grew
    for name in FIGURES:
        assert (again / "figures" / name).read_bytes() == (out / "figures" / name).read_bytes(), name
    for name in TABLES:
        a, b = (out / "tables" / f"{name}.csv").read_bytes(), (again / "tables" / f"{name}.csv").read_bytes()
        if name != "provenance":
            assert a == b, name
            continue
        changed = [(x, y) for x, y in zip(a.splitlines(), b.splitlines(), strict=True) if x != y]
        assert [x.split(b",")[0] for x, _ in changed] == [b"A:anchors"]


def test_a_broken_stage_is_refused_and_the_executed_notebook_shows_the_refusal(study: tuple[Path, Path]) -> None:
    p, results = study
    stage = results / "rt" / "A"

    # a receipt whose verdict is not its final's, every chain consistent
    rebuild(stage, p, lambda recs: flip_verdict(stage, recs["finals"][0]))
    got = run_proctor("analyze", str(stage), "--prereg", str(p), timeout=300)
    executed = results / "rt" / "analysis" / "analysis.ipynb"
    assert got.code == 3
    assert got.out["refusal"] == "analysis_refused" and got.out["notebook_refusal"] == "report_refused"
    assert got.out["path"] == str(executed) and "[receipt]" in got.out["message"]
    # the executed copy shows the report's refusal, and nothing was scored, exported or drawn
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "Refusal" and errors[0]["evalue"].startswith("report_refused:")
    assert not (results / "rt" / "analysis" / "tables").exists()
    assert not (results / "rt" / "analysis" / "analysis.html").exists()
    # the failed copy is anchored all the same
    last = anchors(stage)[-1]
    assert last["reason"] == "analysis"
    assert last["manifests"] == {"notebook:../analysis/analysis.ipynb": sha256_hex(executed.read_bytes())}


def test_other_refusals_keep_their_code_and_other_errors_are_analysis_failed(study: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    p, results = study
    out = tmp_path / "blocked"
    out.mkdir()
    (out / "figures").write_text("a file where the figures folder goes\n")
    with pytest.raises(Refusal) as caught:
        analyze_results(results, prereg=p, out=out)
    assert caught.value.code == "analysis_refused" and caught.value.details["notebook_refusal"] == "file_unwritable"
    assert caught.value.path == str(out / "analysis.ipynb")
    # a notebook taking the same parameters whose cell raises something other than a refusal
    broken = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})
    params = nbformat.v4.new_code_cell('results = ""\nout = ""\nprereg = ""')
    params.metadata["tags"] = ["parameters"]
    broken.cells = [params, nbformat.v4.new_code_cell('raise ZeroDivisionError("planted in " + out)')]
    for i, cell in enumerate(broken.cells):
        cell["id"] = f"c{i}"
    nbformat.write(broken, tmp_path / "broken.ipynb")
    with pytest.raises(Refusal) as caught:
        analyze_results(results, prereg=p, out=tmp_path / "failed", notebook=tmp_path / "broken.ipynb")
    executed = tmp_path / "failed" / "analysis.ipynb"
    assert caught.value.code == "analysis_failed" and caught.value.path == str(executed)
    assert caught.value.details["ename"] == "ZeroDivisionError"
    # the notebook gets its paths relative to the root (the repository here): no absolute machine path
    assert caught.value.details["evalue"] == f"planted in {os.path.relpath(tmp_path / 'failed', REPO)}"
    last = anchors(results / "rt" / "A")[-1]  # the failed copy is anchored
    assert last["manifests"] == {"notebook:../../../failed/analysis.ipynb": sha256_hex(executed.read_bytes())}


def test_refusals_before_any_kernel_starts(study: tuple[Path, Path], tmp_path: Path) -> None:
    _, results = study
    empty = tmp_path / "empty"
    empty.mkdir()
    got = run_proctor("analyze", str(empty))
    assert got.code == 3 and got.out["refusal"] == "results_not_found"
    # without --prereg the freeze's sha256 is looked for under the repository's prereg/: not there
    got = run_proctor("analyze", str(results))
    assert got.code == 3 and got.out["refusal"] == "prereg_not_found"
    assert not (results / "rt" / "analysis").exists()


def test_the_notebooks_paths_are_taken_from_the_root(study: tuple[Path, Path], tmp_path: Path) -> None:
    p, results = study
    paths = analysis_paths("results", root=tmp_path)  # relative to the root; the prereg found by its freeze
    assert (paths.results, paths.prereg, paths.study) == (str(results), str(p), "rt")
    assert paths.stages == (str(results / "rt" / "A"),) and paths.out == str(results / "rt" / "analysis")
    assert paths.figure("forest") == str(results / "rt" / "analysis" / "figures" / "forest")
    given = analysis_paths("results/rt/A", out="elsewhere", prereg="prereg/rt", root=tmp_path)
    assert (given.out, given.tables) == (str(tmp_path / "elsewhere"), str(tmp_path / "elsewhere" / "tables"))
    with pytest.raises(Refusal) as caught:
        analysis_paths(results, prereg="", root=tmp_path / "results")  # no prereg/ there
    assert caught.value.code == "prereg_not_found"


def test_the_analysis_notebook_parameters() -> None:
    import papermill

    found = papermill.inspect_notebook(str(REPO / "notebooks" / "analysis.ipynb"))
    assert {name: info["default"] for name, info in found.items()} == {
        "results": '"results/demo"', "out": '""', "prereg": '""', "root": '""'}


def test_lines_for_people_and_tables_for_the_notebook() -> None:
    made = {"stage": "A", "a": "x", "b": "y", "arm": "direct", "margin": 0.1, "alpha": 0.05, "n": 30,
            "diff": -0.02, "ci_low": -0.08, "ci_high": 0.04, "tango_p": 0.012, "wald_p": 0.02,
            "method": "tango", "verdict": "equivalent"}
    missing = {"stage": "B", "a": "x", "b": "z", "arm": "direct", "margin": 0.1, "diff": None,
               "note": "system z is not in stage B", "verdict": None}
    assert verdict_lines([made, missing]) == [
        "stage A: x vs y on direct, margin 0.1: diff -0.020, 90% CI [-0.080, 0.040], n 30, p 0.012 (tango) "
        "-> equivalent",
        "stage B: x vs z on direct, margin 0.1: not made (system z is not in stage B)"]
    line = breakeven_lines([{"stage": "A", "arm": "direct", "cheap": "x", "strong": "middle", "q": 0.8,
                             "break_even_q": 0.25, "predicted_savings": 0.55, "composed_pass_rate": 0.9,
                             "strong_pass_rate": 0.85, "gate": "oracle"}])
    # issue 13 item 10: the system escalated to is named, never called "strong" (here it is the middle tier)
    assert line == ["stage A, arm direct: x first, then middle: q 0.800 vs break-even 0.250 -> predicted savings "
                    "+0.550 of middle's cost; composed pass rate 0.900 vs middle alone 0.850 (oracle gate)"]
    table = frame_table("T", pl.DataFrame({"a": ["p"], "cost": [0.0000804], "rate": [0.5], "n": [3]}),
                        columns=["a", "cost", "rate", "absent"])
    assert table.columns == ("a", "cost", "rate")
    assert table.text().splitlines()[3].split() == ["p", "8.04e-05", "0.5000"]


def test_the_html_shows_what_the_study_asks_its_amendments_and_left_out_cells_and_fits_a_browser(
        study: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 13 item 8: what a reader of the evidence sees, checked in the HTML and in headless Chromium."""
    from harness.prereg.freeze import amend
    from tests.support.browser import HEIGHT, WIDTH, layout, png_stats, screenshot

    p, results = study
    (p / "PREREG.md").write_text(PREREG_TEXT + "\n## Deviations\n\nNone so far.\n", encoding="utf-8")
    amend(p, "a section for deviations, after stage A ran")
    amend(p, "stage A ran on a shared machine", note=True)
    out = tmp_path / "read"
    analyze_results(results / "rt", out=out, root=tmp_path)
    html = (out / "analysis.html").read_text(encoding="utf-8")

    # what the study asks: PREREG.md's sections as written (Markdown rendered), and each registered comparison
    assert "Does the <em>bad</em> system keep the good one's pass rate?" in html
    assert "H1: good and bad pass within 0.1 of each other." in html and "not stated in PREREG.md" not in html
    assert "good and bad pass within 0.1 of each other on arm direct (paired TOST at alpha 0.05" in html
    # every amendment with its date, reason and changed files; the cells left out per system and why
    assert "a section for deviations, after stage A ran" in html and "PREREG.md changed" in html
    assert "stage A ran on a shared machine" in html
    left_out = pl.read_csv(out / "tables" / "left_out.csv")
    assert left_out.select("system", "cells", "scored", "exhausted").rows() == [("good", 6, 6, 0), ("bad", 6, 6, 0)]
    assert "Cells left out of scoring, per stage and system" in html
    # the noisy-gate grid is a heat map; its rows are in the CSV only; every table scrolls in its own box
    assert "<th>false_accept</th>" not in html and html.count('src="data:image/png;base64,') == 3
    assert pl.read_csv(out / "tables" / "sensitivity.csv").height == 25
    assert html.count('class="proctor-table" style="overflow-x: auto;') == 11  # every table shown

    # a real browser: a non-blank screenshot, and the page never wider than the window
    shot = screenshot(out / "analysis.html", tmp_path / "analysis.png")
    width, height, variance = png_stats(shot)
    assert (width, height) == (WIDTH, HEIGHT) and variance > 100, variance
    found = layout(out / "analysis.html", tmp_path)
    assert found["scroll"] <= found["client"] and found["body"] <= found["client"], found
