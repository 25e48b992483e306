"""The README's notebook commands, run as written (issue 13 item 6).

The commands are parsed out of README.md (the sh block that runs notebooks/run_study.ipynb), so
this test fails when the README drifts. Each way (`proctor batch`, or papermill then `proctor
anchor-notebook`) runs in its own copy of the repository's layout (pyproject.toml, harness/,
evals/ linked; notebooks/ and prereg/demo copied), against the simulator: the stage's files
land in results/demo/A/, the executed copy beside them, anchored, and the oracle and the audit
accept the whole.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.audit.audit import audit_results
from harness.audit.oracle import run_problems
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import sha256_hex
from harness.run.layout import log_seed
from tests.support.paths import REPO, checkout_at
from tests.support.study import Sim, system

DOCUMENTED = REPO / "docs" / "notebooks.md"


def readme_commands() -> list[str]:
    """The command lines (comments dropped) of README.md's sh block that runs notebooks/run_study.ipynb."""
    blocks = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "notebooks/run_study.ipynb" in b]
    assert len(found) == 1, "README.md: one sh block runs notebooks/run_study.ipynb"
    return [line.split("  #")[0].strip() for line in found[0].splitlines() if line.strip()]


def the_way(way: str) -> list[str]:
    lines = readme_commands()
    if way == "batch":
        return [line for line in lines if line.startswith("proctor batch ")]
    return [line for line in lines if not line.startswith("proctor batch ")]


def repository_copy(root: Path) -> Path:
    checkout_at(root)
    shutil.copytree(REPO / "notebooks", root / "notebooks")
    shutil.copytree(REPO / "prereg" / "demo", root / "prereg" / "demo")
    return root


def test_the_readme_shows_both_ways_and_the_manual_agrees() -> None:
    assert [line.split()[0:2] for line in the_way("batch")] == [["proctor", "batch"]]
    papermill = the_way("papermill")
    assert [line.split()[0] for line in papermill] == ["mkdir", "papermill", "proctor"]
    manual = DOCUMENTED.read_text(encoding="utf-8")
    for line in (*the_way("batch"), *papermill[1:]):
        assert line in manual, f"docs/notebooks.md does not show the README's command {line!r}"


@pytest.mark.parametrize("way", ["batch", "papermill"])
def test_the_readme_commands_run_as_written(tmp_path: Path, sim: Sim, way: str) -> None:
    url = sim([system("sim-flash", 0.5), system("sim-glm", 0.7), system("sim-k3", 0.9)])
    root = repository_copy(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env["PROCTOR_SIM_URL"] = url
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for line in the_way(way):
        done = subprocess.run(["bash", "-c", line], cwd=root, env=env, capture_output=True, timeout=600)
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-4000:])
    folder = root / "results" / "demo" / "A"
    assert sorted(p.name for p in (root / "results").iterdir()) == ["demo"]
    assert sorted(p.name for p in (root / "results" / "demo").iterdir()) == ["A"]  # not results/demo/demo/A
    executed = folder / "run_study.ipynb"
    assert executed.is_file() and (folder / "attempts.jsonl").is_file()
    got = {name: read_log(folder / f"{name}.jsonl", log_seed("demo", "A", name)) for name in ("run", "anchors")}
    assert got["run"][-1]["event"] == "end" and got["run"][-1]["complete"]
    notebook = [a for a in got["anchors"] if a["reason"] == "notebook"]
    assert notebook[-1]["manifests"] == {"notebook:run_study.ipynb": sha256_hex(executed.read_bytes())}
    assert run_problems(folder, prereg_dir=root / "prereg" / "demo") == []
    audit = audit_results(root / "results" / "demo", prereg=root / "prereg" / "demo")
    assert audit.ok, audit.to_json()["problems"]
