"""Agent arms and budgets inside an attempt through the interleaved runner (issue 17 items 3 and 4): an arm names
its worker (`llm-edit` with repair turns beside single shot), and each repo_task attempt's metering proxy gets an
allowance (the system's cap and the ceiling's room at its admission), against a real simulator over loopback HTTP.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.audit.audit import audit_results
from harness.audit.oracle.check import run_problems
from harness.audit.report import build_report
from harness.evidence.chain_read import read_log
from harness.meter.wire import read_wire
from harness.run.layout import log_seed
from harness.run.runner import run_stage
from tests.support.repo_study import repo_prereg
from tests.support.sim import SimServer, sim_systems

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")

ARMS: list[dict[str, Any]] = [{"id": "single", "template": "{prompt}"},
        {"id": "feedback", "template": "{prompt}", "worker": {"kind": "llm-edit", "repair_turns": 3}}]


def _logs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: read_log(folder / f"{name}.jsonl", log_seed("rt", "A", name))
            if (folder / f"{name}.jsonl").exists() else [] for name in ("attempts", "finals", "run")}


def _plan(folder: Path) -> dict[str, dict[str, Any]]:
    return {json.loads(line)["run_id"]: json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}


def test_a_feedback_arm_beside_single_shot_runs_end_to_end(tmp_path: Path, sim_server: SimServer) -> None:
    # a coin-flip cheap system: each request is right or wrong by the simulator's seeded draw, so more turns
    # give more chances; strong is always right (one request, passes)
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.5, "sim-k3": 1.0}), seed=3)
    prereg = repo_prereg(tmp_path, arms=ARMS)
    results = tmp_path / "results"
    summary = run_stage(prereg, "A", results, base_urls={"sim-flash": url, "sim-k3": url})
    assert summary.exit_code == 0 and summary.complete, summary.stops
    folder = results / "rt" / "A"
    logs, plan = _logs(folder), _plan(folder)
    assert len(logs["attempts"]) == len(logs["finals"]) == 16
    passed = {f["run_id"]: f["passed"] for f in logs["finals"]}
    by_arm: dict[tuple[str, str], list[bool]] = {}
    for a in logs["attempts"]:
        cell = plan[a["run_id"]]
        work = a["work"]
        wire = read_wire(folder / work["folder"] / "wire.jsonl")
        assert len(wire) == work["exchanges"] and all(w.sent for w in wire)
        if cell["arm"] == "single":
            assert work["exchanges"] == 1  # the catalog's llm-edit: one request
        else:  # the repair loop: another turn only while the visible tests fail, at most 1 + 3 requests
            assert 1 <= work["exchanges"] <= 4
            if not passed[a["run_id"]]:
                assert work["exchanges"] == 4, work  # a failed feedback attempt used every turn
            if work["exchanges"] > 1:  # a repair turn shows the model the visible tests' failures
                assert json.loads(wire[1].request_body) != json.loads(wire[0].request_body)
        by_arm.setdefault((cell["system"], cell["arm"]), []).append(passed[a["run_id"]])
    assert by_arm[("strong", "single")] == by_arm[("strong", "feedback")] == [True] * 4
    cheap_single, cheap_feedback = sum(by_arm[("cheap", "single")]), sum(by_arm[("cheap", "feedback")])
    assert cheap_single < 4 and cheap_feedback > cheap_single, by_arm  # the feedback arm repairs what one shot missed
    report = build_report(folder, prereg_dir=prereg)
    assert report.summary["problems"] == 0
    assert run_problems(folder, prereg_dir=prereg) == []
    assert audit_results(results / "rt", prereg=prereg).ok


def test_a_tight_cap_ends_an_attempt_budget_stop_inside_it_and_spend_stays_under_the_cap(
        tmp_path: Path, sim_server: SimServer) -> None:
    # cheap is never right, so its feedback arm asks again; its cap is the reserve, so its one attempt's
    # allowance is the reserve: the first request (worst case: the reserve, no output cap) fits, the second
    # cannot once the first is settled, and is answered 402 by the proxy without being sent
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.0, "sim-k3": 1.0}), seed=4)
    reserve = 0.001
    prereg = repo_prereg(tmp_path, arms=ARMS[1:], caps=(reserve, 1.0), reserve=reserve, items=2)
    results = tmp_path / "results"
    summary = run_stage(prereg, "A", results, base_urls={"sim-flash": url, "sim-k3": url})
    folder = results / "rt" / "A"
    logs, plan = _logs(folder), _plan(folder)
    cheap = [a for a in logs["attempts"] if plan[a["run_id"]]["system"] == "cheap"]
    assert [a["error_code"] for a in cheap] == ["budget_stop"], cheap  # the second lane was refused admission
    (stopped,) = cheap
    wire = read_wire(folder / stopped["work"]["folder"] / "wire.jsonl")
    assert [w.sent for w in wire] == [True, False] and wire[1].status == 402  # the stop never left the proxy
    assert stopped["work"]["exchanges"] == 2 and "diff.patch" not in stopped["work"]["files"]
    assert isinstance(stopped["cost_usd"], float) and 0 < stopped["cost_usd"] <= reserve  # metered, counted
    spent = math.fsum(a["cost_usd"] for a in cheap)
    assert spent <= reserve
    final = next(f for f in logs["finals"] if plan[f["run_id"]]["system"] == "cheap")
    assert final["class"] == "ceiling" and final["action"] == "stop"  # classified like a request's budget stop
    assert any(e["event"] == "stop" and e["system"] == "cheap" for e in logs["run"])
    strong = [f for f in logs["finals"] if plan[f["run_id"]]["system"] == "strong"]
    assert len(strong) == 2 and all(f["passed"] for f in strong)
    assert not summary.complete
    assert run_problems(folder, prereg_dir=prereg) == []  # no late cost owed: the worker was waited for


def test_prereg_check_shows_each_arm_worker(tmp_path: Path) -> None:
    from harness.notebooks.display import check_table
    from harness.prereg.check import check_prereg

    report = check_prereg(repo_prereg(tmp_path, arms=ARMS, frozen=False))
    assert report["arms"] == [{"id": "single", "worker": None},
                              {"id": "feedback", "worker": {"kind": "llm-edit", "template": [], "repair_turns": 3}}]
    rows = {r["what"]: r["value"] for r in check_table(report).rows}
    assert rows["arm feedback"] == "worker llm-edit, 3 repair turns" and "arm single" not in rows
