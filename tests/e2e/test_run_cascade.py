"""Live cascade arms through the interleaved runner (issue 17 item 5): cheap first, gated by the visible tests on a
fresh copy, escalated to strong with the evidence packet; every step metered at its own system's price, the
report, oracle and audit clean; the analysis puts the live cascade beside the composed one with the measured v.
Real mutant tasks, a real simulator over loopback HTTP, the real sandbox."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from harness.analysis.cascade import live_cascades
from harness.analysis.study import analyze_study
from harness.audit.audit import audit_results
from harness.audit.oracle.check import run_problems
from harness.audit.report import build_report
from harness.evidence.chain_read import read_log
from harness.meter.cost import meter, total_cost
from harness.meter.pricing import BUNDLED_PRICING, load_pricing
from harness.meter.wire import read_wire
from harness.run.layout import log_seed
from harness.run.runner import run_stage
from tests.support.paths import REPO
from tests.support.repo_study import MUTANTS, mutant_sim, repo_prereg
from tests.support.sim import SimServer, sim_systems
from tests.support.study import run_argv, runner_env

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")

ARMS: list[dict[str, Any]] = [{"id": "single", "template": "{prompt}"},
                              {"id": "cascade", "template": "{prompt}", "cascade": ["cheap", "strong"]}]
ITEMS = 4


def _logs(folder: Path, study: str, stage: str) -> dict[str, list[dict[str, Any]]]:
    return {name: read_log(folder / f"{name}.jsonl", log_seed(study, stage, name)) for name in ("attempts", "finals")}


@pytest.mark.timeout(1200)  # 12 gated-path attempts, each a sandboxed worker and pytest runs: slow on a loaded 2-core box
def test_a_live_cascade_escalates_on_a_failed_gate_and_books_each_step_at_its_price(tmp_path: Path) -> None:
    # cheap never fixes anything (it returns the mutated file), strong always does: a cascade attempt passes
    # exactly when its gate caught cheap's failure and escalated; a gate the visible tests cannot fail (the
    # mutation is seen only by the hidden tests) is a false pass and the attempt fails
    prereg = repo_prereg(tmp_path, arms=ARMS, suite=MUTANTS, items=ITEMS, deadline=120)
    results = tmp_path / "results"
    with mutant_sim(tmp_path, {"sim-flash": 0.0, "sim-k3": 1.0}) as url:
        summary = run_stage(prereg, "A", results, base_urls={"sim-flash": url, "sim-k3": url})
    assert summary.exit_code == 0 and summary.complete, summary.stops
    folder = results / "rt" / "A"
    logs = _logs(folder, "rt", "A")
    plan = {json.loads(x)["run_id"]: json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    cascades = [a for a in logs["attempts"] if plan[a["run_id"]]["arm"] == "cascade"]
    assert len(cascades) == ITEMS and {plan[a["run_id"]]["system"] for a in cascades} == {"cheap"}
    passed = {f["run_id"]: f["passed"] for f in logs["finals"]}
    prices = load_pricing(str(BUNDLED_PRICING))
    escalated = 0
    for a in cascades:
        work = a["work"]
        steps = work["cascade"]["steps"]
        assert work["cascade"]["systems"] == ["cheap", "strong"] and steps[0]["system"] == "cheap"
        gate = steps[0]["gate"]
        assert gate is not None and gate["duration_s"] > 0
        assert "gate.s1.output" in work["files"]
        if gate["passed"]:
            assert len(steps) == 1 and passed[a["run_id"]] is False  # a false pass: strong never ran
            continue
        escalated += 1
        assert [s["system"] for s in steps] == ["cheap", "strong"] and steps[1]["gate"] is None
        assert passed[a["run_id"]] is True
        # each step's wire at its own system's price; the attempt's cost is their sum
        costs = []
        for step, key in zip(steps, ("sim-flash", "sim-k3"), strict=True):
            wire = read_wire(folder / work["folder"] / step["wire"])
            assert len(wire) == step["exchanges"] == 1
            cost = total_cost(meter(w.usage, prices.get(key)) for w in wire).total
            assert cost is not None and math.isclose(cost, step["cost_usd"])
            costs.append(cost)
        assert math.isclose(a["cost_usd"], math.fsum(costs)) and costs[1] > costs[0]
        strong_prompt = json.loads(read_wire(folder / work["folder"] / "wire.s2.jsonl")[0].request_body)
        assert "Evidence from an earlier attempt" in json.dumps(strong_prompt)  # the evidence packet
    assert 0 < escalated < ITEMS, "the draw should hold mutations the visible tests see and ones they do not"
    report = build_report(folder, prereg_dir=prereg)
    assert report.summary["problems"] == 0
    assert run_problems(folder, prereg_dir=prereg) == []
    assert audit_results(results / "rt", prereg=prereg).ok
    analysis = analyze_study(results, prereg=prereg)
    (row,) = live_cascades(analysis).to_dicts()
    assert row["n"] == ITEMS and row["escalated"] == escalated and row["composed_from"] == "single"
    assert row["live_pass_rate"] == escalated / ITEMS and row["gate_false_pass"] == ITEMS - escalated
    assert row["composed_pass_rate"] == 1.0 and row["strong_pass_rate"] == 1.0  # the oracle gate never errs
    assert row["v_usd"] == 0.0 and row["v_s"] > 0 and row["break_even_q_measured"] is not None
    # the repo-task break-even takes v from the same records: measured, $0, the gates' seconds per attempt
    standing = {f["run_id"]: f["attempt_line"] for f in logs["finals"]}
    gate_s = [s["gate"]["duration_s"] for a in cascades for s in a["work"]["cascade"]["steps"] if s["gate"]
              and logs["attempts"][standing[a["run_id"]] - 1] is a]
    assert analysis.repo is not None
    (single,) = analysis.repo.breakeven.filter(pl.col("arm") == "single").to_dicts()
    assert (single["v_source"], single["v"]) == ("measured", 0.0)
    assert single["v_s"] == pytest.approx(math.fsum(gate_s) / ITEMS) == pytest.approx(row["v_s"])
    # the oracle meters each step's own wire: a changed strong-step wire log (one record dropped) is caught
    stepped = next(a for a in cascades if len(a["work"]["cascade"]["steps"]) == 2)
    wire = folder / stepped["work"]["folder"] / "wire.s2.jsonl"
    wire.write_bytes(b"".join(wire.read_bytes().splitlines(keepends=True)[:-1]))
    problems = run_problems(folder, prereg_dir=prereg)
    assert any(p.rule == "work" and "wire.s2.jsonl" in p.file for p in problems), problems


AGENTS_DEMO = REPO / "prereg" / "agents-demo"


@pytest.mark.timeout(900)
def test_the_agents_demo_smoke_stage_runs_clean(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with mutant_sim(tmp_path, {"sim-flash": 0.45, "sim-glm": 0.7, "sim-k3": 0.92}) as url:
        summary = run_stage(AGENTS_DEMO, "smoke", results,
                            base_urls={"sim-flash": url, "sim-glm": url, "sim-k3": url})
    assert summary.exit_code == 0 and summary.complete, summary.stops
    folder = results / "agents-demo" / "smoke"
    logs = _logs(folder, "agents-demo", "smoke")
    plan = [json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]]
    assert sorted((c["system"], c["arm"]) for c in plan) == sorted(
        [("cheap", "single-shot")] * 2 + [("strong", "single-shot")] * 2 + [("cheap", "cascade")] * 2)
    assert len(logs["finals"]) == len(plan)
    assert build_report(folder, prereg_dir=AGENTS_DEMO).summary["problems"] == 0
    assert run_problems(folder, prereg_dir=AGENTS_DEMO) == []
    assert audit_results(results / "agents-demo", prereg=AGENTS_DEMO).ok
    (row,) = live_cascades(analyze_study(results, prereg=AGENTS_DEMO)).to_dicts()
    assert row["arm"] == "cascade" and row["n"] == 2 and row["composed_from"] == "single-shot"


def _dry_spend(prereg: Path, results: Path, url: str) -> dict[str, float]:
    """Each system's spend as `proctor run --dry-run` counts it from the files (the ledger a resume starts from)."""
    done = subprocess.run(run_argv(prereg, results, "--dry-run"), cwd=REPO, env=runner_env(url), capture_output=True,
                          timeout=120)
    return {s["system"]: float(s["spend_usd"]) for s in json.loads(done.stdout)["progress"]["systems"]}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strong_cap", [1.0, 0.005])
def test_each_cascade_step_is_booked_to_and_admitted_by_its_own_system_s_cap(
        tmp_path: Path, sim_server: SimServer, strong_cap: float) -> None:
    """The cheap system's cap ($0.003) holds its own steps but not one strong request (~$0.01 at the output cap):
    the strong step is admitted by the strong system's cap and the ceiling, not by what the cheap system's cap
    leaves, and its spend is the strong system's (the runner's, the ledger's and the oracle's). A strong system
    whose cap has no room for a request ($0.005) ends the cascade's attempt `budget_stop` at its first request,
    booked to nobody ($0: never sent). The bundled tasks: cheap returns the files unchanged, so the visible tests
    fail and every cascade escalates."""
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.0, "sim-k3": 1.0}), seed=3)
    prereg = repo_prereg(tmp_path, arms=ARMS, items=1, caps=(0.003, strong_cap), reserve=0.001)
    results = tmp_path / "results"
    run_stage(prereg, "A", results, base_urls={"sim-flash": url, "sim-k3": url})
    folder = results / "rt" / "A"
    logs = _logs(folder, "rt", "A")
    plan = {json.loads(x)["run_id"]: json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    (cascade,) = [a for a in logs["attempts"] if plan[a["run_id"]]["arm"] == "cascade"]
    steps = cascade["work"]["cascade"]["steps"]
    assert [s["system"] for s in steps] == ["cheap", "strong"] and steps[0]["gate"]["passed"] is False
    booked: dict[str, list[float]] = {"cheap": [], "strong": []}
    for a in logs["attempts"]:
        system = plan[a["run_id"]]["system"]
        if plan[a["run_id"]]["arm"] == "cascade":
            for s in a["work"]["cascade"]["steps"]:
                booked[s["system"]].append(s["cost_usd"])
        else:
            booked[system].append(a["cost_usd"] if a["cost_usd"] != "unknown" else 0.001)
    if strong_cap == 1.0:
        # the strong step ran to its end and passed, costing more than the whole cheap cap
        assert cascade["outcome"] == "delivered", cascade
        assert steps[1]["budget_stop"] is False and steps[1]["cost_usd"] > 0.003
        assert {f["run_id"]: f["passed"] for f in logs["finals"]}[cascade["run_id"]] is True
    else:
        # the strong system at its cap: the strong step's first request is a budget stop, never sent
        assert cascade["outcome"] == "error" and cascade["error_code"] == "budget_stop", cascade
        assert steps[1]["budget_stop"] is True and steps[1]["cost_usd"] == 0.0
    # each system's spend is its own cells and its own cascade steps: the cheap cap was never crossed
    spend = _dry_spend(prereg, results, url)
    for system in ("cheap", "strong"):
        assert math.isclose(spend[system], math.fsum(booked[system]), rel_tol=1e-9, abs_tol=1e-12), (system, spend)
    assert spend["cheap"] <= 0.003
    # the oracle replays every admission against the spend it implies, each step on its own system
    assert run_problems(folder, prereg_dir=prereg) == []
    assert build_report(folder, prereg_dir=prereg).summary["problems"] == 0
    assert audit_results(results / "rt", prereg=prereg).ok
