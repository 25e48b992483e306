"""The notebooks: every one is parameterised and committed without outputs, and
`run_study.ipynb` runs a stage under papermill against the real simulator.

The study is tiny (3 HumanEval items, 2 simulated systems, 1 stage) and is
frozen with `harness.prereg.freeze.freeze` under tmp_path. The simulator is
started without the HumanEval answers, so every delivered answer fails its
hidden tests: the run still completes (a failed answer stands as a result).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from papermill.exceptions import PapermillExecutionError

from harness.audit.oracle import run_problems
from harness.errors import Refusal
from harness.evidence.chain_read import read_log, verify_log
from harness.evidence.jsonio import sha256_hex
from harness.evidence.lock import InvocationLock
from harness.evidence.paths import repo_root, resolve
from harness.notebooks.display import Table
from harness.notebooks.stage import (
    StageIncomplete,
    execute_notebook,
    require_complete,
    run_with_progress,
    study_base_urls,
)
from harness.prereg.freeze import freeze
from harness.run.layout import log_seed
from harness.run.summary import RunProgress, RunSummary
from tests.support.paths import REPO
from tests.support.sim import SimServer, sim_systems

NOTEBOOKS = REPO / "notebooks"
RUN_STUDY = NOTEBOOKS / "run_study.ipynb"
HUMANEVAL = REPO / "evals" / "humaneval"
PACKET_SHA = json.loads((HUMANEVAL / "SUITE.json").read_text())["packet_sha256"]

DESIGN = f"""\
[study]
id = "nb"
seed = 7
title = "notebook test"

[suite]
name = "humaneval"
packet = "{HUMANEVAL / "packet.jsonl"}"
packet_sha256 = "{PACKET_SHA}"

[draw]
items = 3

[[systems]]
slot = "cheap"
provider = "sim"
model = "sim-flash"
setting = "default"
pricing_key = "sim-flash"
cap_usd = 1.0

[[systems]]
slot = "strong"
provider = "sim"
model = "sim-k3"
setting = "default"
pricing_key = "sim-k3"
cap_usd = 1.0

[[arms]]
id = "direct"
template = "Complete this function in one ```python block.\\n\\n{{prompt}}"

[[stages]]
id = "A"
systems = ["cheap", "strong"]
arms = ["direct"]
items = 3
repeats = 1

[budgets]
reserve_per_item_usd = 0.01
overall_cap_usd = 3.0
ceiling_margin_usd = 0.2
spend_before_usd = 0.0

[run]
lanes_per_system = 2
attempt_deadline_s = 20
reruns = 2
transport_retries = 0
max_output_tokens = 256
full_repeats = 1

[analysis]
alpha = 0.05
power = 0.8
test = "paired_tost"
clustering = "item"

[[analysis.comparisons]]
a = "cheap"
b = "strong"
arm = "direct"
margin = 0.2
expected_a = 0.6
expected_b = 0.65
correlation = 0.5
"""


def make_prereg(root: Path, *, frozen: bool = True) -> Path:
    folder = root / "prereg" / "nb"
    folder.mkdir(parents=True)
    (folder / "design.toml").write_text(DESIGN)
    (folder / "PREREG.md").write_text("# notebook test\n\nRegistered before running.\n")
    systems = [{"slot": s, "provider": "sim", "model": m, "setting": "default"}
               for s, m in (("cheap", "sim-flash"), ("strong", "sim-k3"))]
    (folder / "systems.json").write_text(json.dumps({"study": "nb", "systems": systems}))
    if frozen:
        freeze(folder)
    return folder


def outputs_text(cell: Any) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(out["text"])
        parts.append(out.get("data", {}).get("text/plain", ""))
        parts += out.get("traceback", [])
    return "\n".join(parts)


# --------------------------------------------------------------------------
# Static checks


def test_every_notebook_is_parameterised_and_committed_without_outputs() -> None:
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert RUN_STUDY in notebooks
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and tagged[0].cell_type == "code", path
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path}: clear the outputs"


def test_run_study_parameters() -> None:
    import papermill

    found = papermill.inspect_notebook(str(RUN_STUDY))
    defaults = {name: info["default"] for name, info in found.items()}
    # issue 13 item 6: `results` is the results root (the stage goes to <results>/<study>/<stage>)
    assert defaults == {"prereg": '"prereg/demo"', "stage": '"A"', "results": '"results"',
                        "dry_run": "False", "base_url": '""', "engine": '"local"', "address": '""'}


def test_paths_resolve_from_the_repository_root(tmp_path: Path) -> None:
    assert repo_root(REPO / "notebooks") == REPO
    assert resolve("prereg/demo", REPO) == str(REPO / "prereg" / "demo")
    assert resolve(tmp_path, REPO) == str(tmp_path)


def test_table_renders_text_and_html() -> None:
    table = Table("T", ({"a": 1, "b": 0.5, "c": None}, {"a": "x<y", "b": ["p", "q"], "c": "z"}))
    assert table.text().splitlines() == ["T", "a    b       c", "---  ------  -", "1    0.5000  -", "x<y  p, q    z"]
    assert "x&lt;y" in table._repr_html_()
    assert Table("E", ()).text() == "E\n(none)"


# --------------------------------------------------------------------------
# papermill against the simulator


def test_run_study_notebook_runs_a_stage_and_anchors_its_executed_copy(
    tmp_path: Path, sim_server: SimServer
) -> None:
    url = sim_server(sim_systems(tmp_path / "systems.json", {"sim-flash": 1.0, "sim-k3": 1.0}, output_tokens=50))
    prereg = make_prereg(tmp_path)
    results = tmp_path / "results"
    folder = results / "nb" / "A"
    out = folder / "run_study.executed.ipynb"
    params = {"prereg": str(prereg), "stage": "A", "results": str(results), "base_url": url}

    got = execute_notebook(RUN_STUDY, out, params, cwd=REPO)

    assert got["ok"] and got["notebook"] == str(out)
    assert got["sha256"] == sha256_hex(out.read_bytes())
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    text = "\n".join(outputs_text(c) for c in code)
    assert "Preflight of study nb stage A: ok" in text
    assert "Summary (run) of study nb stage A: complete, exit code 0" in text
    for column in ("items", "finals", "passes", "spend_usd", "stops"):
        assert column in text
    summary = text[text.index("Summary (run)"):].splitlines()
    assert summary[1].split() == ["system", "items", "standing", "finals", "passes", "attempts", "spend_usd",
                                  "cap_usd", "state", "stops"]
    for row, system in zip(summary[3:5], ("cheap", "strong"), strict=True):
        # the simulator has no HumanEval answers: every answer is delivered, fails its tests and stands
        assert row.split()[:5] == [system, "3", "3/3", "3", "0"]
        assert row.split()[-2:] == ["done", "-"]
    assert "Anchors of study nb stage A: last anchor (end)" in text
    assert "attempts.jsonl" in text and "plan.jsonl" in text
    assert "Error" not in text and "Traceback" not in text

    seed = log_seed("nb", "A", "anchors")
    anchors = read_log(folder / "anchors.jsonl", seed)
    assert verify_log(folder / "anchors.jsonl", seed).ok
    assert anchors[-2]["reason"] == "end"
    last = anchors[-1]
    assert last == got["anchor"]
    assert last["reason"] == "notebook" and last["at"] >= anchors[-2]["at"]
    assert last["manifests"] == {"notebook:run_study.executed.ipynb": got["sha256"]}
    finals = read_log(folder / "finals.jsonl", log_seed("nb", "A", "finals"))
    assert last["logs"]["finals"]["lines"] == len(finals) == 6
    assert run_problems(results, prereg_dir=prereg) == []  # the runner's oracle accepts the notebook's anchor


def test_run_with_progress_shows_tables_and_raises_refusals(tmp_path: Path, sim_server: SimServer) -> None:
    url = sim_server(sim_systems(tmp_path / "systems.json", {"sim-flash": 1.0, "sim-k3": 1.0}, output_tokens=20))
    prereg = make_prereg(tmp_path)
    shown: list[Table] = []
    summary = run_with_progress(prereg, "A", tmp_path / "results", show=shown.append,
                                base_urls=study_base_urls(prereg, url), every_s=0.01)
    assert summary.exit_code == 0 and summary.mode == "run"
    assert shown and all(isinstance(t, Table) for t in shown)
    assert [r["standing"] for r in shown[-1].rows] == ["3/3", "3/3"]
    require_complete(summary)  # complete: nothing raised
    with InvocationLock(tmp_path / "results" / "nb" / "A" / ".invocation.lock"), pytest.raises(Refusal) as caught:
        run_with_progress(prereg, "A", tmp_path / "results", show=shown.append, base_urls=None)
    assert caught.value.code == "invocation_locked"


def test_require_complete_raises_for_an_incomplete_run_only() -> None:
    progress = RunProgress("s", "A", 0.0, 1.0, False, ())
    stopped = RunSummary(False, 1, "run", "s", "A", "", False, progress,
                         stops=({"system": "x", "cause": "ceiling", "detail": ""},))
    with pytest.raises(StageIncomplete, match="x: ceiling"):
        require_complete(stopped)
    require_complete(dataclasses.replace(stopped, mode="dry_run"))


def test_dry_run_lists_cells_and_writes_nothing(tmp_path: Path) -> None:
    prereg = make_prereg(tmp_path)
    results = tmp_path / "results"
    out = tmp_path / "dry.ipynb"
    params = {"prereg": str(prereg), "stage": "A", "results": str(results), "dry_run": True,
              "base_url": "http://127.0.0.1:9/v1"}
    got = execute_notebook(RUN_STUDY, out, params, cwd=REPO)
    assert got["anchor"] is None
    text = "\n".join(outputs_text(c) for c in nbformat.read(out, as_version=4).cells if c.cell_type == "code")
    assert "Cells of study nb stage A (dry_run)" in text
    assert "rerun 0 attempt 1" in text
    assert "endpoint" in text  # the preflight's unreachable endpoint is shown, not raised
    assert not results.exists()


def test_a_real_run_stops_at_a_failed_preflight_before_any_call(tmp_path: Path) -> None:
    prereg = make_prereg(tmp_path)
    results = tmp_path / "results"
    out = tmp_path / "stopped.ipynb"
    params = {"prereg": str(prereg), "stage": "A", "results": str(results), "base_url": "http://127.0.0.1:9/v1"}
    with pytest.raises(PapermillExecutionError) as caught:
        execute_notebook(RUN_STUDY, out, params, cwd=REPO)
    assert caught.value.ename == "PreflightFailed"
    assert "endpoint" in caught.value.evalue and "nothing was run" in caught.value.evalue
    assert not list(results.rglob("attempts.jsonl"))  # no provider was called


def test_a_refusal_makes_papermill_fail(tmp_path: Path) -> None:
    prereg = make_prereg(tmp_path, frozen=False)
    out = tmp_path / "refused.ipynb"
    params = {"prereg": str(prereg), "stage": "A", "results": str(tmp_path / "results"),
              "base_url": "http://127.0.0.1:9/v1"}
    with pytest.raises(PapermillExecutionError) as caught:
        execute_notebook(RUN_STUDY, out, params, cwd=REPO)
    assert caught.value.ename == "Refusal"
    assert "prereg_not_frozen" in caught.value.evalue or "frozen" in caught.value.evalue
    nb = nbformat.read(out, as_version=4)  # the executed copy is saved with the error in it
    assert any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    assert not (tmp_path / "results").exists()
