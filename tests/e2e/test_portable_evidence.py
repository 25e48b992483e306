"""Portable, reproducible evidence (issue 13 item 7), on a real simulator stage and real papermill kernels.

A stage names no folder of the machine that ran it; the same results analysed in two other roots give
byte-identical tables, figures and HTML; `proctor analyze --check` re-executes without writing into the
evidence and names what differs; the audit names an absolute path in new evidence (`absolute_path`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from harness._version import __version__
from harness.audit.audit import audit_results
from harness.evidence.chain_read import read_log
from harness.evidence.portable import machine_paths
from harness.notebooks.analyze import analyze_results
from harness.run.layout import log_seed
from tests.support.cli import run_proctor
from tests.support.study import prereg, sim_servers, system, urls


def _outputs(out: Path) -> list[str]:
    """The HTML, every table and every figure of an analysis folder (paths inside it)."""
    made = [p for p in sorted(out.rglob("*")) if p.is_file() and p.parent.name in ("tables", "figures")]
    return ["analysis.html", *(str(p.relative_to(out)) for p in made)]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A root holding prereg/rt and results/rt/A (a complete simulator stage)."""
    root = tmp_path_factory.mktemp("portable-run")
    with sim_servers(root) as sim:
        url = sim([system("sim-flash", 0.8), system("sim-glm", 0.5)])
        p = prereg(root)
        from harness.run.runner import run_stage

        assert run_stage(p, "A", root / "results", base_urls=urls(url)).exit_code == 0
    yield root


def _copy(ran: Path, root: Path) -> Path:
    shutil.copytree(ran / "prereg", root / "prereg")
    shutil.copytree(ran / "results", root / "results")
    return root


@pytest.fixture(scope="module")
def analysed(ran: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of `ran` in a root of its own, analysed there once (`analyze_results`); tests only read it or copy it."""
    root = _copy(ran, tmp_path_factory.mktemp("portable-analysed"))
    assert analyze_results(root / "results", root=root)["ok"]
    return root


def _tree(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + oct(path.lstat().st_mode).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_a_stage_names_no_machine_folder_and_records_its_provenance(ran: Path) -> None:
    stage = ran / "results" / "rt" / "A"
    assert machine_paths(stage) == ()  # receipts, host samples, run events, wire: no absolute machine path
    start = next(r for r in read_log(stage / "run.jsonl", log_seed("rt", "A", "run")) if r["event"] == "start")
    got = start["provenance"]
    assert got["harness"] == __version__ and (got["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", got["commit"]))
    assert got["dirty"] in (True, False, None)


def test_the_same_results_give_byte_identical_outputs_in_any_root(ran: Path, analysed: Path, tmp_path: Path) -> None:
    roots = [analysed, _copy(ran, tmp_path / "elsewhere" / "deeper" / "two")]  # the first analysed in its own root
    assert analyze_results(roots[1] / "results", root=roots[1])["ok"]
    outs = [root / "results" / "rt" / "analysis" for root in roots]
    assert _outputs(outs[0]) == _outputs(outs[1]) and len(_outputs(outs[0])) >= 13
    for name in _outputs(outs[0]):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    for root, out in zip(roots, outs, strict=True):
        # the executed notebook, its HTML, every table: no folder of this machine (the root included)
        assert machine_paths(root / "results", extra=[str(root)]) == ()
        assert str(root) not in (out / "analysis.ipynb").read_text()
        assert audit_results(root / "results", root=root).ok
    validation = pl.read_csv(outs[0] / "tables" / "validation.csv")
    assert validation.get_column("folder").to_list() == ["A"]
    provenance = {r["name"]: r for r in pl.read_csv(outs[0] / "tables" / "provenance.csv").to_dicts()}
    assert provenance["version:model-proctor"]["version"] == __version__
    assert provenance["checkout:commit"]["kind"] == "checkout" and provenance["checkout:dirty"]["version"] in (
        "clean", "dirty", "unknown")
    assert provenance["A:run:first"]["version"].startswith(f"{__version__} ")


def test_analyze_check_writes_nothing_and_names_what_differs(analysed: Path, tmp_path: Path) -> None:
    root = _copy(analysed, tmp_path)  # analysed in another root: the check re-executes here, after the move
    results = root / "results"
    before = _tree(root)
    got = run_proctor("analyze", str(results), "--prereg", str(root / "prereg" / "rt"), "--check", "--json",
                      timeout=300)
    assert got.code == 0 and got.out["ok"] is True, got.out
    out = results / "rt" / "analysis"
    assert sorted(got.out["compared"]) == sorted(_outputs(out)[1:]) and got.out["differences"] == []  # tables, figures
    assert _tree(root) == before  # nothing written into the evidence (nor the preregistration)

    q = results / "rt" / "analysis" / "tables" / "q.csv"
    data = bytearray(q.read_bytes())
    at = data.index(b"0.", data.index(b"\n"))
    data[at + 2] = ord("9") if data[at + 2] != ord("9") else ord("8")  # one digit of the first row
    q.write_bytes(bytes(data))
    before = _tree(root)
    got = run_proctor("analyze", str(results), "--prereg", str(root / "prereg" / "rt"), "--check", "--json",
                      timeout=300)
    assert got.code == 1 and got.out["ok"] is False
    named = {d["file"]: d["what"] for d in got.out["differences"]}
    assert sorted(named) == ["tables/q.csv"], named
    assert "sha256 is not the anchored one" in named["tables/q.csv"] or "re-execution" in named["tables/q.csv"]
    assert _tree(root) == before


def test_the_audit_names_an_absolute_path_in_new_evidence(ran: Path, tmp_path: Path) -> None:
    root = _copy(ran, tmp_path)
    stage = root / "results" / "rt" / "A"
    (stage / "notes.txt").write_text(f"written in {stage}\n")
    got = audit_results(root / "results", root=root)
    assert [(os.path.basename(p.file), p.line, p.rule) for p in got.problems] == [("notes.txt", 1, "absolute_path")]
    assert str(stage) in got.problems[0].message


def test_evidence_written_before_it_was_portable_is_only_weaker(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage whose start event records no provenance was run before evidence became portable (the runner
    of then, simulated by dropping the field): a machine path in it is a weaker guarantee, not a problem."""
    from harness.run import runner

    original = runner._Engine.event

    def event(self: runner._Engine, name: str, **fields: object) -> dict[str, object]:
        fields.pop("provenance", None)
        return original(self, name, **fields)

    monkeypatch.setattr(runner._Engine, "event", event)
    with sim_servers(tmp_path) as sim:
        url = sim([system("sim-flash", 0.8), system("sim-glm", 0.5)])
        p = prereg(tmp_path)
        assert runner.run_stage(p, "A", tmp_path / "results", base_urls=urls(url)).exit_code == 0
    stage = tmp_path / "results" / "rt" / "A"
    (stage / "notes.txt").write_text(f"written in {stage}\n")
    got = audit_results(tmp_path / "results", root=tmp_path)
    assert got.ok, got.problems
    assert any("name absolute paths of the machine" in w and "notes.txt" in w for w in got.weaker)


def test_an_executed_notebook_records_its_paths_relative_to_the_kernels_folder(tmp_path: Path) -> None:
    import nbformat

    from harness.evidence.jsonio import sha256_hex
    from harness.notebooks.stage import run_papermill

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell('x = "a"', metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell("print(x)")]
    source = tmp_path / "work" / "nb.ipynb"
    source.parent.mkdir()
    nbformat.write(nb, source)
    run = run_papermill(source, tmp_path / "work" / "out" / "nb.ipynb", {"x": "b"}, cwd=tmp_path / "work")
    assert run.error is None and run.sha256 == sha256_hex(Path(run.path).read_bytes())
    meta = nbformat.read(run.path, as_version=4).metadata["papermill"]
    assert (meta["input_path"], meta["output_path"]) == ("nb.ipynb", "out/nb.ipynb")
    assert machine_paths(tmp_path / "work" / "out") == ()


def test_absolute_path_parameters_under_the_repository_reach_the_notebook_relative(tmp_path: Path) -> None:
    """`proctor batch` and the demo pass absolute paths: papermill writes them into the executed copy, so
    those under the repository root go in relative to it (the notebooks take relative paths from there)."""
    import nbformat

    from harness.notebooks.stage import run_papermill

    work = tmp_path / "work"
    (work / "harness").mkdir(parents=True)
    (work / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell('results = ""\nother = ""', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print(results, other)")]
    nbformat.write(nb, work / "nb.ipynb")
    outside = tmp_path / "elsewhere"
    run = run_papermill(work / "nb.ipynb", work / "out" / "nb.ipynb",
                        {"results": work / "results" / "demo", "other": str(outside)}, cwd=work)
    assert run.error is None and run.parameters == {"results": "results/demo", "other": str(outside)}
    executed = nbformat.read(run.path, as_version=4)
    assert executed.metadata["papermill"]["parameters"]["results"] == "results/demo"
    assert 'results = "results/demo"' in executed.cells[1].source
    assert [leak.file for leak in machine_paths(work / "out")] == ["nb.ipynb"]  # the path outside, as given


def test_the_committed_local_gemma_analysis_checks_clean_in_this_checkout() -> None:
    """The committed evidence re-executes to the anchored tables and figures byte for byte, in whatever
    checkout and commit runs it (the provenance's `checkout:` rows name the checkout, so they are not
    compared; the suite packet the design names is copied beside the preregistration)."""
    got = run_proctor("analyze", "--check", "results/local-gemma", timeout=600)
    assert got.code == 0 and got.out["differences"] == [], got.out
    assert "tables/q.csv" in got.out["compared"] and "figures/forest.svg" in got.out["compared"]


def test_the_committed_agents_gemma_analysis_checks_clean_in_this_checkout() -> None:
    """The Gemma repo_task pilot (results/agents-gemma) re-executes to its anchored tables and figures too."""
    got = run_proctor("analyze", "--check", "results/agents-gemma", timeout=600)
    assert got.code == 0 and got.out["differences"] == [], got.out
    assert "tables/q.csv" in got.out["compared"] and "tables/comparisons.csv" in got.out["compared"]
