"""A live cascade arm applies the gated path's switch rule (issue 17 item 9, `harness.gate.decision.decide_next`):
after a failed visible gate with a localized defect (most visible tests pass, one fails, a new fingerprint) the SAME
system repairs in the same workspace with only the failing tests' evidence, and is gated again; a broad failure
escalates to the next system as before. Real mutant tasks, a real simulator over loopback HTTP, the real sandbox;
the report, the oracle (which replays the rule on the recorded gates) and the audit pass."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.cascade import live_cascades
from harness.analysis.study import analyze_study
from harness.audit.audit import audit_results
from harness.audit.oracle.check import run_problems
from harness.audit.report import build_report
from harness.evidence.chain_read import read_log
from harness.gate.decision import BROAD_SUCCESS_MIN_TESTS, LOCALIZED_MAX_FAILING
from harness.meter.wire import read_wire
from harness.prereg.order import draw
from harness.records.work import step_wire
from harness.run.layout import log_seed
from harness.run.runner import run_stage
from tests.support.oracle import Records, rebuild
from tests.support.repo_study import MUTANTS, mutant_sim, repo_prereg

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")

ARMS: list[dict[str, Any]] = [{"id": "single", "template": "{prompt}"},
                              {"id": "cascade", "template": "{prompt}", "cascade": ["cheap", "strong"],
                               "targeted_repair": True}]
LOCALIZED = "toolz-0.12.1-m02"
"""An off-by-one the visible tests see in one test function of nine: the mutated file is a localized defect, and
cheap's targeted repair fixes it."""
UNREPAIRED = "inflection-0.5.1-m09"
"""A comparison mutation the visible tests see in one test function of six (localized), which cheap's repair
does not fix: the same fingerprint again, so the rule stops repairing and the cascade escalates."""
BROAD = "toolz-0.12.1-m04"
"""cheap answers with a module that cannot be imported: every visible test fails, a broad failure: escalated."""
FAILING_TEST = {LOCALIZED: "toolz/tests/test_functoolz_visible.py::test_thread_first",
                UNREPAIRED: "test_inflection_visible.py::test_tableize"}
"""The visible test each localized item's mutation fails (the targeted-repair section names it: `### <id>`)."""


def _seed_drawing(items: set[str]) -> int:
    """A study seed whose draw is exactly `items` (the mutant packet's ids)."""
    ids = [json.loads(line)["item"] for line in (MUTANTS / "private" / "items.jsonl").read_text().splitlines()]
    return next(s for s in range(1, 1_000_000) if set(draw(s, ids, len(items))) == items)


def _answers(tmp: Path) -> Path:
    """The suite's answers (for cheap, whose skill is 0, its wrong answer; for strong the fix), with:
    BROAD's wrong answer a module that raises on import; a prompt holding LOCALIZED's targeted-repair section
    answered with the fix (correct, or with a trailing comment: cheap repairs it either way); one holding
    UNREPAIRED's answered with its mutated file again. A longer match wins, so the repair sections' win."""
    lines = [json.loads(x) for x in (MUTANTS / "private" / "sim_answers.jsonl").read_text().splitlines()]
    by_item = {doc["match"].removeprefix("task_id: "): doc for doc in lines}
    module = json.loads(next(x for x in (MUTANTS / "private" / "items.jsonl").read_text().splitlines()
                             if json.loads(x)["item"] == BROAD))["fix"][0]["path"]
    by_item[BROAD]["wrong"] = [f"<<<FILE {module}\nraise ImportError('broken by the cheap system')\n>>>END\n"]
    fixed = by_item[LOCALIZED]["answer"]
    assert fixed.rstrip().endswith(">>>END")
    variant = fixed.rstrip()[: -len(">>>END")] + "# repaired after the targeted repair section\n>>>END\n"
    lines.append({"match": f"### {FAILING_TEST[LOCALIZED]}", "answer": fixed, "wrong": [variant]})
    lines.append({"match": f"### {FAILING_TEST[UNREPAIRED]}", "answer": by_item[UNREPAIRED]["answer"],
                  "wrong": by_item[UNREPAIRED]["wrong"][:1]})
    path = tmp / "answers.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    return path


def _logs(folder: Path, study: str, stage: str) -> dict[str, list[dict[str, Any]]]:
    return {name: read_log(folder / f"{name}.jsonl", log_seed(study, stage, name)) for name in ("attempts", "finals")}


@pytest.mark.timeout(900)
def test_a_localized_defect_is_repaired_by_the_same_system_and_a_broad_failure_escalates(tmp_path: Path) -> None:
    prereg = repo_prereg(tmp_path, arms=ARMS, suite=MUTANTS, items=3, deadline=120,
                         seed=_seed_drawing({LOCALIZED, UNREPAIRED, BROAD}))
    results = tmp_path / "results"
    with mutant_sim(tmp_path, {"sim-flash": 0.0, "sim-k3": 1.0}, _answers(tmp_path)) as url:
        summary = run_stage(prereg, "A", results, base_urls={"sim-flash": url, "sim-k3": url})
    assert summary.exit_code == 0 and summary.complete, summary.stops
    folder = results / "rt" / "A"
    logs = _logs(folder, "rt", "A")
    plan = {json.loads(x)["run_id"]: json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    cascades = {plan[a["run_id"]]["item"]: a for a in logs["attempts"] if plan[a["run_id"]]["arm"] == "cascade"}
    assert set(cascades) == {LOCALIZED, UNREPAIRED, BROAD}
    passed = {f["run_id"]: f["passed"] for f in logs["finals"]}

    def classes(item: str) -> list[tuple[str, str]]:
        return [(s["system"], s["switch_class"]) for s in cascades[item]["work"]["cascade"]["steps"]]

    def prompt(item: str, step: int) -> str:
        work = cascades[item]["work"]
        return json.dumps(json.loads(read_wire(folder / work["folder"] / step_wire(step))[0].request_body))

    # localized: cheap's gate fails one visible test of many, cheap repairs with only that test's evidence
    a = cascades[LOCALIZED]
    steps = a["work"]["cascade"]["steps"]
    assert classes(LOCALIZED) == [("cheap", "first"), ("cheap", "localized_defect")]
    first = steps[0]["gate"]
    assert first["passed"] is False and first["fingerprint"] and first["tests_failing"] == [FAILING_TEST[LOCALIZED]]
    assert first["tests_expected"] >= BROAD_SUCCESS_MIN_TESTS
    assert steps[1]["gate"]["passed"] is True and passed[a["run_id"]] is True
    repair = prompt(LOCALIZED, 2)
    assert "Targeted repair" in repair and "Evidence from an earlier attempt" not in repair
    assert "test_thread_first" in repair and "test_thread_last" not in repair  # only the failing test's section
    assert math.isclose(a["cost_usd"], math.fsum(s["cost_usd"] for s in steps))
    assert "gate.s2.output" in a["work"]["files"] and "wire.s2.jsonl" in a["work"]["files"]

    # localized, but the repair leaves the same failure: the fingerprint was seen, so the cascade escalates
    # (the task's three dispatches: cheap, its repair, strong)
    u = cascades[UNREPAIRED]
    steps = u["work"]["cascade"]["steps"]
    assert classes(UNREPAIRED) == [("cheap", "first"), ("cheap", "localized_defect"), ("strong", "escalation")]
    assert steps[0]["gate"]["fingerprint"] == steps[1]["gate"]["fingerprint"] is not None
    assert steps[2]["gate"] is None and passed[u["run_id"]] is True
    assert "Evidence from an earlier attempt" in prompt(UNREPAIRED, 3)

    # broad: every visible test fails, the rule finds nothing to repair, the cascade escalates to strong at once
    b = cascades[BROAD]
    steps = b["work"]["cascade"]["steps"]
    assert classes(BROAD) == [("cheap", "first"), ("strong", "escalation")]
    gate = steps[0]["gate"]
    assert gate["passed"] is False and len(gate["tests_failing"]) == gate["tests_expected"] > LOCALIZED_MAX_FAILING
    assert passed[b["run_id"]] is True

    assert build_report(folder, prereg_dir=prereg).summary["problems"] == 0
    assert run_problems(folder, prereg_dir=prereg) == []
    assert audit_results(results / "rt", prereg=prereg).ok
    (row,) = live_cascades(analyze_study(results, prereg=prereg)).to_dicts()
    assert row["n"] == 3 and row["escalated"] == 2 and row["live_pass_rate"] == 1.0
    # b is the cheap system's whole spend (its first dispatch and its repairs), s the strong steps'
    cheap = [math.fsum(s["cost_usd"] for s in c["work"]["cascade"]["steps"] if s["system"] == "cheap")
             for c in cascades.values()]
    strong = [s["cost_usd"] for c in cascades.values() for s in c["work"]["cascade"]["steps"] if s["system"] == "strong"]
    assert row["b_live"] == pytest.approx(math.fsum(cheap) / 3)
    assert row["s_live"] == pytest.approx(math.fsum(strong) / 2)
    assert row["v_s"] == pytest.approx(math.fsum(s["gate"]["duration_s"] for c in cascades.values()
                                                 for s in c["work"]["cascade"]["steps"] if s["gate"]) / 3)

    # the oracle replays the rule on the recorded gates: a repair its gate does not justify (three visible tests
    # failing is no localized defect) is caught, and so is a step whose class is not its place in the cascade
    def broaden(recs: Records) -> None:
        (mine,) = [r for r in recs["attempts"] if r["run_id"] == u["run_id"]]
        mine["work"]["cascade"]["steps"][0]["gate"]["tests_failing"] = ["t.py::a", "t.py::b", "t.py::c"]
        mine["work"]["cascade"]["steps"][2]["switch_class"] = "localized_defect"

    rebuild(folder, prereg, broaden)
    problems = [p for p in run_problems(folder, prereg_dir=prereg) if p.rule == "work"]
    assert any("found no localized defect" in p.message for p in problems), problems
    assert any("cascade step 3 (strong) has switch_class 'localized_defect'" in p.message for p in problems), problems
