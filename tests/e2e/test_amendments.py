"""Amendments coexist with completed stages (issue 13, item 4): real simulator runs, real amendments.

A stage ran under the freeze its plan header names (`frozen_sha256`). An amendment
that does not change what it ran (the text, a later stage, an added note) keeps it
valid: the report is ok, the audit intact, `proctor run` resumes it. One that does
(a system's model) is refused for that stage, naming it. Every test works on its
own copy of a preregistration built in a tmp folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.study import analyze_study
from harness.audit.audit import audit_results
from harness.audit.report import build_report
from harness.errors import Refusal
from harness.prereg.freeze import amend
from harness.prereg.frozen import check_frozen
from harness.run.runner import run_stage
from tests.support.design import write_design
from tests.support.paths import REPO
from tests.support.study import Sim, prereg, runner_env, system, urls


def _design(p: Path) -> dict[str, Any]:
    return tomllib.loads((p / "design.toml").read_text())


def _ran(sim: Sim, tmp_path: Path) -> tuple[Path, Path, str, str]:
    url = sim([system("sim-flash", 0.9), system("sim-glm", 0.4)])
    p = prereg(tmp_path, items=4)
    results = tmp_path / "results"
    assert run_stage(p, "A", results, base_urls=urls(url)).exit_code == 0
    return p, results, url, check_frozen(p).frozen_sha256


def test_text_and_later_stage_amendments_keep_a_completed_stage(sim: Sim, tmp_path: Path) -> None:
    p, results, url, first = _ran(sim, tmp_path)
    folder = results / "rt" / "A"
    (p / "PREREG.md").write_text("# runner test\n\nRegistered before running. Clarified after stage A.\n")
    amend(p, "clarify the text after stage A")
    design = _design(p)
    design["stages"].append({"id": "B", "systems": ["good"], "arms": ["direct"], "items": 2, "repeats": 1})
    write_design(p, design)
    amend(p, "add a later stage B")
    frozen = check_frozen(p)
    # the report: ok (before the change: plan_changed and anchor problems)
    report = build_report(folder, prereg_dir=p)
    assert report.summary["problems"] == 0 and [a["amendment"] for a in report.summary["amendments"]] == [1, 2]
    # the audit: intact, and the preregistration found by the stage's (earlier) freeze
    found = audit_results(results, root=tmp_path)
    assert found.ok, found.problems
    assert found.prereg == str(p) and found.frozen_sha256 == frozen.frozen_sha256
    assert frozen.freezes()[0] == first and frozen.freezes()[-1] == frozen.frozen_sha256 != first
    # the run: resumes the completed stage (nothing to do) instead of refusing run_plan_changed
    out = subprocess.run([sys.executable, "-m", "harness", "run", str(p), "--stage", "A", "--results", str(results),
                          "--json"], cwd=REPO, env=runner_env(url), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["complete"] is True
    assert (folder / "plan.jsonl").read_text().count(first) == 1  # the stage keeps the plan it ran
    # a note, then the later stage runs under the current freeze; the study audits and analyses whole across freezes
    amend(p, "the operator ran stage A from a laptop", note=True)
    frozen = check_frozen(p)
    assert run_stage(p, "B", results, base_urls=urls(url)).exit_code == 0
    assert build_report(folder, prereg_dir=p).summary["problems"] == 0
    whole = audit_results(results / "rt", root=tmp_path)
    assert whole.ok, whole.problems
    analysis = analyze_study(results / "rt", root=tmp_path)
    rows = analysis.amendments.to_dicts()
    assert [(r["amendment"], r["kind"], r["changed"], r["stages_before"]) for r in rows] == [
        (1, "files", "PREREG.md changed", "A"), (2, "files", "design.toml changed", "A"), (3, "note", "", "A")]
    assert [r["reason"] for r in rows][2] == "the operator ran stage A from a laptop"
    assert all(r["at"] for r in rows) and rows[-1]["frozen_sha256"] == frozen.frozen_sha256


def test_an_amendment_changing_a_system_of_a_completed_stage_is_refused_naming_it(sim: Sim, tmp_path: Path) -> None:
    p, results, url, _ = _ran(sim, tmp_path)
    folder = results / "rt" / "A"
    design = _design(p)
    design["systems"][1].update(model="sim-flash", pricing_key="sim-flash")
    write_design(p, design)
    amend(p, "swap the weak system's model")
    with pytest.raises(Refusal) as caught:
        run_stage(p, "A", results, base_urls=urls(url))
    assert caught.value.code == "amendment_changes_stage" and caught.value.details["stage"] == "A"
    assert "stage 'A'" in caught.value.message and "amendment 1 changes" in caught.value.message
    assert "model" in caught.value.message
    checked = run_stage(p, "A", results, base_urls=urls(url), preflight=True)  # the preflight names it too
    assert checked.exit_code == 1
    assert [(q["check"], q["refusal"]) for q in checked.problems] == [("plan", "amendment_changes_stage")]
    out = subprocess.run([sys.executable, "-m", "harness", "run", str(p), "--stage", "A", "--results", str(results),
                          "--json"], cwd=REPO, env=runner_env(url), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "amendment_changes_stage" in out.stdout + out.stderr
    with pytest.raises(Refusal) as refused:
        build_report(folder, prereg_dir=p)
    problems = refused.value.details["problems"]
    assert any(q["rule"] == "amendment_changes_stage" and "stage 'A'" in q["message"] for q in problems)
    found = audit_results(results, root=tmp_path)
    assert not found.ok
    assert any(q.rule == "amendment_changes_stage" for q in found.problems)


def test_a_note_amendment_changes_no_file_and_is_chained(tmp_path: Path) -> None:
    p = prereg(tmp_path)
    before = check_frozen(p).frozen_sha256
    out = subprocess.run([sys.executable, "-m", "harness", "prereg", "amend", str(p), "--note",
                          "stage A ran at night", "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["amendment"]
    assert got["changed"] == [] and got["note"] is True and got["reason"] == "stage A ran at night"
    frozen = check_frozen(p)
    assert frozen.freezes() == (before, frozen.frozen_sha256) and before != frozen.frozen_sha256
    assert frozen.amendments[0].note and frozen.amendments[0].changed == ()
    line = json.loads((p / "AMENDMENTS.jsonl").read_text().splitlines()[0])
    assert line["note"] is True and line["changed"] == []
    # a note with a changed file is refused (that is an amendment with --reason)
    (p / "PREREG.md").write_text("# runner test\n\nChanged.\n")
    with pytest.raises(Refusal) as caught:
        amend(p, "only a note", note=True)
    assert caught.value.code == "amendment_note_changes_files" and caught.value.details["changed"] == ["PREREG.md"]
    both = subprocess.run([sys.executable, "-m", "harness", "prereg", "amend", str(p), "--note", "x", "--reason", "y"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2
