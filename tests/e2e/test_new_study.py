"""notebooks/new_study.ipynb (issue 19): parameters -> a preregistration `prereg check` accepts, with its budget
and power tables; then `freeze`, `plan` and `run` (against the simulator) carry it through to a clean audit.

The notebook runs with papermill through `harness.notebooks.stage.run_papermill` (the `proctor batch` call)
in a checkout laid out under the test's folder; it never freezes (that stays an explicit step).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nbformat

from harness.audit.audit import audit_results
from harness.notebooks.stage import run_papermill
from tests.support.cli import run_proctor
from tests.support.paths import REPO, checkout_at
from tests.support.study import Sim, system

NEW_STUDY = REPO / "notebooks" / "new_study.ipynb"


def outputs(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return ["".join(o.get("text", "")) or str(o.get("data", {}).get("text/plain", ""))
            for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def parameters(**changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "folder": "prereg/ns", "study": "ns", "title": "New study end to end", "question": "Does glm keep flash?",
        "suite": "humaneval", "draw": 6,
        "systems": {"flash": {"model": "sim-flash", "cap_usd": 1.0}, "glm": {"model": "sim-glm", "cap_usd": 1.0}},
        "stages": [{"id": "A", "systems": ["flash", "glm"], "arms": ["direct"], "items": 6, "repeats": 1}],
        "comparisons": [{"a": "flash", "b": "glm", "arm": "direct", "margin": 0.2, "expected_a": 0.8,
                         "expected_b": 0.8, "correlation": 0.5}],
        "budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": 3.0, "ceiling_margin_usd": 0.2,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 2, "attempt_deadline_s": 20, "reruns": 0, "transport_retries": 0,
                "max_output_tokens": 512, "full_repeats": 1},
    }
    out.update(changes)
    return out


def test_new_study_writes_a_checked_preregistration_that_freeze_plan_and_run_carry(tmp_path: Path, sim: Sim) -> None:
    root = checkout_at(tmp_path / "checkout")
    got = run_papermill(NEW_STUDY, tmp_path / "new_study.ipynb", parameters(), cwd=root)
    assert got.error is None, got.error
    folder = root / "prereg" / "ns"
    assert sorted(p.name for p in folder.iterdir()) == ["PREREG.md", "design.toml", "systems.json"]  # not frozen
    shown = "\n".join(outputs(tmp_path / "new_study.ipynb"))
    assert "wrote prereg/ns: design.toml, PREREG.md, systems.json (not frozen)" in shown
    assert str(tmp_path) not in shown  # no machine path in what the notebook shows
    for title in ("prereg check of study ns", "Budget at the reserve $0.01 per item", "Power of each registered"):
        assert title in shown, shown
    # the budget row: 6 items at the reserve, one attempt each at worst (no rerun, no retry), cap $1: worst covered
    assert re.search(r"flash\s+A\s+6\s+0\.0600\s+1\s+0\.0600\s+1\.0000\s+worst", shown), shown
    assert "flash vs glm (direct)" in shown
    assert run_proctor("prereg", "check", str(folder)).code == 0
    frozen = run_proctor("prereg", "freeze", str(folder))
    assert frozen.code == 0, frozen.out
    plan = run_proctor("plan", str(folder), "--scope", "@stages", "--out", str(tmp_path / "plan.jsonl"))
    assert plan.code == 0, plan.out
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.5)])
    results = root / "results"
    ran = run_proctor("run", str(folder), "--stage", "A", "--results", str(results), "--base-url", url, timeout=300)
    assert ran.code == 0, ran.out
    audit = audit_results(results / "ns", prereg=folder)
    assert audit.ok, audit.to_json()["problems"]


def test_new_study_refuses_a_folder_that_holds_a_registration(tmp_path: Path) -> None:
    root = checkout_at(tmp_path / "checkout")
    (root / "prereg" / "ns").mkdir(parents=True)
    (root / "prereg" / "ns" / "design.toml").write_text("kept")
    got = run_papermill(NEW_STUDY, tmp_path / "out.ipynb", parameters(), cwd=root)
    assert got.error is not None and "draft_folder_exists" in str(got.error)
    assert (root / "prereg" / "ns" / "design.toml").read_text() == "kept"


def test_new_study_parameters_are_declared_in_its_parameters_cell() -> None:
    nb = json.loads(NEW_STUDY.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    declared = {line.split("=")[0].strip() for line in "".join(cell["source"]).splitlines()
                if "=" in line and not line.startswith((" ", "#"))}
    assert set(parameters()) | {"seed", "arms", "alpha", "power", "test"} <= declared
    assert nb["metadata"]["kernelspec"]["name"] == "proctor"
