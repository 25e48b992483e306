"""`proctor batch`: notebooks run in order with real papermill kernels, stopping at the first failure;
bad batch files refused with their codes before any job runs.

The notebook is a tiny parameterised one written under tmp_path: it appends its
`name` and its working folder to a log (so the order and the cwd of each job are
seen from outside), then raises when `fail` is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from harness.errors import Refusal
from harness.evidence.chain_read import read_log, verify_log
from harness.evidence.jsonio import sha256_hex
from harness.notebooks.batch import load_batch, run_batch
from harness.run.layout import log_seed
from tests.support.cli import run_proctor
from tests.support.paths import REPO
from tests.support.study import prereg


def echo_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3", "language": "python",
                                                           "name": "python3"}})
    params = nbformat.v4.new_code_cell('name = ""\nlog = ""\nfail = False\nprereg = ""\nstage = ""\nresults = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params,
                nbformat.v4.new_code_cell('import os\nwith open(log, "a") as f:\n    f.write(f"{name} {os.getcwd()}\\n")'),
                nbformat.v4.new_code_cell('if fail:\n    raise ValueError(f"planted failure in {name}")\nprint("done", name)')]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i}"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def write_batch(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def batch_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "batch"
    echo_notebook(folder / "nb" / "echo.ipynb")
    (folder / "sub").mkdir()
    return folder


def test_two_jobs_run_in_order_and_a_job_naming_a_stage_is_anchored(batch_dir: Path, tmp_path: Path) -> None:
    p = prereg(tmp_path)
    stage = tmp_path / "results" / "rt" / "A"
    stage.mkdir(parents=True)
    log = tmp_path / "order.log"
    batch = write_batch(batch_dir / "batch.json", {"jobs": [
        {"notebook": "nb/echo.ipynb", "out": "out/1.ipynb", "parameters": {"name": "one", "log": str(log)}},
        {"notebook": "nb/echo.ipynb", "out": "out/2.ipynb", "cwd": "sub",
         "parameters": {"name": "two", "log": str(log), "prereg": str(p), "stage": "A",
                        "results": str(tmp_path / "results")}},
    ]})
    # the human CLI: progress on stderr, one line per job
    done = subprocess.run([sys.executable, "-m", "harness", "batch", str(batch)], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith(("[1/2]", "[2/2]"))]
    assert [ln.rsplit(" ", 2)[0] if ln.endswith(" s") else ln for ln in lines] == [
        "[1/2] nb/echo.ipynb -> out/1.ipynb ...", "[1/2] nb/echo.ipynb -> out/1.ipynb ... ok",
        "[2/2] nb/echo.ipynb -> out/2.ipynb ...", "[2/2] nb/echo.ipynb -> out/2.ipynb ... ok"]
    # in order, each in its working folder (default: the batch file's folder)
    assert log.read_text().splitlines() == [f"one {batch_dir}", f"two {batch_dir / 'sub'}"]
    for n, name in ((1, "one"), (2, "two")):
        out = nbformat.read(batch_dir / "out" / f"{n}.ipynb", as_version=4)
        code = [c for c in out.cells if c.cell_type == "code"]
        assert all(c.execution_count is not None for c in code)
        assert any(f"done {name}" in o.get("text", "") for c in code for o in c.outputs)
    # the second job's parameters name a stage: its executed copy is anchored there
    seed = log_seed("rt", "A", "anchors")
    anchors = read_log(stage / "anchors.jsonl", seed)
    assert verify_log(stage / "anchors.jsonl", seed).ok and len(anchors) == 1
    name = "notebook:" + os.path.relpath(batch_dir / "out" / "2.ipynb", stage)
    assert anchors[0]["reason"] == "notebook"
    assert anchors[0]["manifests"] == {name: sha256_hex((batch_dir / "out" / "2.ipynb").read_bytes())}


def test_a_failing_job_stops_the_batch(batch_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "order.log"
    batch = write_batch(batch_dir / "batch.json", {"jobs": [
        {"notebook": "nb/echo.ipynb", "out": "out/1.ipynb", "parameters": {"name": "one", "log": str(log),
                                                                           "fail": True}},
        {"notebook": "nb/echo.ipynb", "out": "out/2.ipynb", "parameters": {"name": "two", "log": str(log)}},
    ]})
    got = run_proctor("batch", str(batch), timeout=240)
    assert got.code == 1 and got.out["ok"] is False
    failed = got.out["failed"]
    executed = batch_dir / "out" / "1.ipynb"
    assert failed == {"job": 1, "notebook": str(batch_dir / "nb" / "echo.ipynb"), "executed": str(executed),
                      "ename": "ValueError", "evalue": "planted failure in one"}
    assert got.out["jobs"] == [] and "job 1 of 2 failed" in got.out["message"]
    # the second job never ran: no log line, no executed copy
    assert log.read_text().splitlines() == [f"one {batch_dir}"]
    assert not (batch_dir / "out" / "2.ipynb").exists()
    nb = nbformat.read(executed, as_version=4)  # the executed copy keeps the error
    assert any(o.get("ename") == "ValueError" for c in nb.cells for o in c.get("outputs", []))


GOOD: dict[str, Any] = {"notebook": "nb/echo.ipynb", "out": "out/1.ipynb", "parameters": {"name": "x"}}


@pytest.mark.parametrize(("doc", "code", "field"), [
    ("{not json", "invalid_json", None),
    ('{"jobs": [], "jobs": []}', "json_duplicate_key", None),
    ([GOOD], "json_not_object", None),
    ({"jobs": []}, "batch_invalid", "jobs"),
    ({"jobs": GOOD}, "batch_invalid", "jobs"),
    ({"jobs": [GOOD], "extra": 1}, "batch_invalid", "extra"),
    ({"jobs": ["nb/echo.ipynb"]}, "batch_invalid", "jobs[0]"),
    ({"jobs": [{**GOOD, "outt": "x.ipynb"}]}, "batch_invalid", "jobs[0].outt"),
    ({"jobs": [{k: v for k, v in GOOD.items() if k != "out"}]}, "batch_invalid", "jobs[0].out"),
    ({"jobs": [GOOD, {**GOOD, "out": "out/2.ipynb", "parameters": ["name", "x"]}]}, "batch_invalid",
     "jobs[1].parameters"),
    ({"jobs": [{**GOOD, "parameters": {"nmae": "x"}}]}, "batch_invalid", "jobs[0].parameters.nmae"),
    ({"jobs": [{**GOOD, "parameters": {"a-b": 1}}]}, "batch_invalid", "jobs[0].parameters.a-b"),
    ({"jobs": [{**GOOD, "notebook": 7}]}, "batch_invalid", "jobs[0].notebook"),
    ({"jobs": [{**GOOD, "notebook": "nb/missing.ipynb"}]}, "batch_notebook_missing", "jobs[0].notebook"),
    ({"jobs": [{**GOOD, "notebook": "not-a-notebook.json"}]}, "batch_invalid", "jobs[0].notebook"),
    ({"jobs": [{**GOOD, "out": "out/1.json"}]}, "batch_invalid", "jobs[0].out"),
    ({"jobs": [{**GOOD, "out": "nb/echo.ipynb"}]}, "batch_invalid", "jobs[0].out"),
    ({"jobs": [GOOD, {**GOOD, "out": "./out/../out/1.ipynb"}]}, "batch_invalid", "jobs[1].out"),
    ({"jobs": [{**GOOD, "cwd": "no-such-folder"}]}, "batch_invalid", "jobs[0].cwd"),
    ({"jobs": [{**GOOD, "cwd": ""}]}, "batch_invalid", "jobs[0].cwd"),
])
def test_a_bad_batch_file_is_refused_before_any_job_runs(batch_dir: Path, doc: Any, code: str,
                                                         field: str | None) -> None:
    (batch_dir / "not-a-notebook.json").write_text("{}")
    batch = write_batch(batch_dir / "batch.json", doc)
    with pytest.raises(Refusal) as caught:
        run_batch(batch)
    assert caught.value.code == code
    assert caught.value.details.get("field") == field
    assert not (batch_dir / "out").exists()


def test_the_cli_refuses_a_bad_batch_file_with_its_field(batch_dir: Path) -> None:
    batch = write_batch(batch_dir / "batch.json", {"jobs": [GOOD, {**GOOD, "out": "out/2.ipynb", "parameters": []}]})
    got = run_proctor("batch", str(batch))
    assert got.code == 3
    assert got.out["refusal"] == "batch_invalid" and got.out["field"] == "jobs[1].parameters"
    assert got.out["path"] == str(batch)
    missing = run_proctor("batch", str(batch_dir / "none.json"))
    assert missing.code == 3 and missing.out["refusal"] == "file_missing"


def test_load_batch_takes_relative_paths_from_the_batch_files_folder(batch_dir: Path, tmp_path: Path) -> None:
    batch = write_batch(batch_dir / "batch.json", {"jobs": [GOOD, {**GOOD, "out": "../elsewhere/2.ipynb",
                                                                   "cwd": "sub"}]})
    jobs = load_batch(batch)
    assert [(j.number, j.notebook, j.out, j.cwd) for j in jobs] == [
        (1, str(batch_dir / "nb" / "echo.ipynb"), str(batch_dir / "out" / "1.ipynb"), str(batch_dir)),
        (2, str(batch_dir / "nb" / "echo.ipynb"), str(tmp_path / "elsewhere" / "2.ipynb"), str(batch_dir / "sub")),
    ]
    assert jobs[1].shown == "nb/echo.ipynb -> ../elsewhere/2.ipynb"
