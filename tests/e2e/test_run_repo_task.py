"""A `repo_task` suite through the interleaved runner (issue 17 items 1 and 2): each attempt is one run of the
gated path (a fresh git workspace from the item's snapshot, init, one sandboxed dispatch of the catalog's
`llm-edit` worker through the metering proxy, verify on a fresh copy), against a real simulator over
loopback HTTP that answers the bundled tasks (evals/tasks) with their fix or the unchanged files.

Then the report, the oracle (`work`: files, wire, metered cost, verdict), the audit, the analysis, and a
real `kill -9` of `proctor run` while an attempt's worker runs, resumed with the same command, and a bounded loop
of kills at seeded random moments (nothing left running, nothing lost, nothing counted twice).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from harness.audit.audit import audit_results
from harness.audit.oracle.check import run_problems
from harness.audit.report import build_report
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.evidence.portable import machine_paths
from harness.meter.cost import meter, total_cost
from harness.meter.pricing import BUNDLED_PRICING, load_pricing
from harness.meter.wire import read_wire
from harness.run.layout import log_seed
from harness.run.rules import cost_for_spend
from harness.run.runner import run_stage
from tests.support.cli import run_proctor
from tests.support.crash import crash_gap
from tests.support.paths import REPO
from tests.support.procs import alive_with
from tests.support.repo_study import MUTANTS, mutant_sim, repo_prereg
from tests.support.sim import SimServer, sim_systems
from tests.support.study import logs as study_logs
from tests.support.study import prereg as completion_prereg
from tests.support.study import run_argv, runner_env, sim_servers, wait_in_flight
from tests.support.study import system as study_system
from tests.support.study import urls as study_urls

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")


def _logs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: read_log(folder / f"{name}.jsonl", log_seed("rt", "A", name))
            if (folder / f"{name}.jsonl").exists() else [] for name in ("attempts", "finals", "run")}


def _urls(url: str) -> dict[str, str]:
    return {"sim-flash": url, "sim-k3": url}


def test_a_repo_task_stage_runs_through_the_gated_path_and_checks_whole(tmp_path: Path, sim_server: SimServer) -> None:
    # cheap never answers with the fix, strong always does: the verdicts are the gate's, not luck
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.0, "sim-k3": 1.0}), seed=3)
    prereg = repo_prereg(tmp_path)
    results = tmp_path / "results"
    summary = run_stage(prereg, "A", results, base_urls=_urls(url))
    assert summary.exit_code == 0 and summary.complete, summary.stops
    folder = results / "rt" / "A"
    logs = _logs(folder)
    assert len(logs["attempts"]) == len(logs["finals"]) == 8
    # the lanes run attempts at once (each attempt's processes swept on their own): some overlap in time
    spans = sorted((a["started"], a["ended"]) for a in logs["attempts"])
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans
    plan = {json.loads(line)["run_id"]: json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    price = load_pricing(BUNDLED_PRICING)
    for attempt in logs["attempts"]:
        assert attempt["outcome"] == "delivered" and attempt["http_status"] is None
        work = attempt["work"]
        assert work["exchanges"] == 1 and set(work["files"]) == {"diff.patch", "verify.json", "wire.jsonl"}
        wire = read_wire(folder / work["folder"] / "wire.jsonl")
        system = plan[attempt["run_id"]]["system"]
        metered = total_cost(meter(w.usage, price.get("sim-flash" if system == "cheap" else "sim-k3")) for w in wire)
        assert metered.total is not None and attempt["cost_usd"] == metered.total > 0  # the worker's wire, metered
        # the worker got the plan's prompt for the arm, and its model id is the system's
        assert json.loads(wire[0].request_body)["model"] == ("sim-flash" if system == "cheap" else "sim-k3")
    by_run = {f["run_id"]: f for f in logs["finals"]}
    for rid, final in by_run.items():
        receipt = json.loads((folder / final["receipt"]).read_text())
        assert receipt["schema"] == "proctor-task-receipt.v1" and receipt["passed"] is final["passed"]
        assert receipt["attempt_sha256"] == final["attempt_sha256"] and receipt["sandbox"]["kind"] == "bwrap"
        diff = (folder / receipt["work"] / "diff.patch").read_text()
        if plan[rid]["system"] == "strong":
            assert final["passed"] is True and receipt["results"]["ok"] is True
            assert diff.startswith("--- a/") and "+++ b/" in diff  # the fix, archived as a diff
        else:
            assert final["passed"] is False and diff == ""  # the unchanged files: nothing to archive
    report = build_report(folder, prereg_dir=prereg)
    assert report.summary["problems"] == 0 and report.summary["passed"] == 4
    scored = {s: report.frame.filter(report.frame["system"] == s)["passed"].to_list() for s in ("cheap", "strong")}
    assert scored == {"cheap": [False] * 4, "strong": [True] * 4}
    assert run_problems(folder, prereg_dir=prereg) == []
    audit = audit_results(results / "rt", prereg=prereg)
    assert audit.ok, audit.to_json()
    assert not any("no check covers" in w for w in audit.weaker), audit.weaker
    assert machine_paths(results, extra=[str(tmp_path)]) == ()

    # the oracle checks repo-task attempts as strictly as completions: a changed diff, a cost that is not the
    # wire's metered sum, and a final whose verdict is not the work's are each named
    work = folder / logs["attempts"][0]["work"]["folder"]
    original = (work / "diff.patch").read_bytes()
    (work / "diff.patch").write_bytes(original + b"\n")
    assert {p.rule for p in run_problems(folder, prereg_dir=prereg)} == {"work"}
    (work / "diff.patch").write_bytes(original)
    assert run_problems(folder, prereg_dir=prereg) == []


def test_a_wrong_cost_or_verdict_is_named_by_the_oracle(tmp_path: Path, sim_server: SimServer) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 1.0, "sim-k3": 1.0}), seed=5)
    prereg = repo_prereg(tmp_path, items=1)
    results = tmp_path / "results"
    assert run_stage(prereg, "A", results, base_urls=_urls(url)).exit_code == 0
    folder = results / "rt" / "A"
    for field, value in (("cost_usd", 0.5), ("passed", False)):
        copy = tmp_path / f"copy-{field}"
        shutil.copytree(folder, copy)
        _rewrite_chain(copy, "attempts" if field == "cost_usd" else "finals", field, value)
        rules = {p.rule for p in run_problems(copy, prereg_dir=prereg)}
        assert "work" in rules, (field, rules)


def _rewrite_chain(folder: Path, log: str, field: str, value: Any) -> None:
    """Rewrite every record's `field` and recompute the whole chain (a forger with the seed), so only the
    rules, never the chain, can tell."""
    from harness.evidence.chain import ChainedLog

    path = folder / f"{log}.jsonl"
    records = read_log(path, log_seed("rt", "A", log))
    path.unlink()
    out = ChainedLog(str(path), log_seed("rt", "A", log))
    for rec in records:
        body = {k: v for k, v in rec.items() if k not in ("prev", "seed")}
        body[field] = value
        out.append(body)


def test_kill_9_while_a_worker_runs_resumes_without_loss(tmp_path: Path, sim_server: SimServer) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 1.0, "sim-k3": 1.0}), seed=7)
    prereg = repo_prereg(tmp_path, items=2)
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    env = {**runner_env(url), "PROCTOR_SIM_URL": url}
    argv = run_argv(prereg, results)
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    wait_in_flight(folder, proc)
    time.sleep(1.0)  # into the attempt's set-up or its worker (an attempt here takes seconds)
    wait_in_flight(folder, proc)  # at once if one still is; else until the next one starts
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    before = _logs(folder)
    lost = [e for e in before["run"] if e["event"] == "intent"]
    assert len(lost) > len(before["attempts"])  # an attempt under way when killed
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    after = _logs(folder)
    codes = [a.get("error_code") for a in after["attempts"]]
    assert "runner_lost" in codes
    # the lost attempt costs the reserve; every other attempt's cost is its wire's
    assert all(a["cost_usd"] == "unknown" for a in after["attempts"] if a.get("error_code") == "runner_lost")
    assert sum(1 for f in after["finals"] if f["action"] == "stand") == 4
    assert run_problems(folder, prereg_dir=prereg) == []
    # then the study's commands, as an operator runs them: the report, the analysis, the audit
    report = run_proctor("report", "--prereg", str(prereg), str(folder))
    assert report.code == 0 and report.out["passed"] == 4, report.out
    analysis = run_proctor("analyze", "--prereg", str(prereg), str(results / "rt"), timeout=600)
    assert analysis.code == 0, analysis.out
    q = (results / "rt" / "analysis" / "tables" / "q.csv").read_text()
    assert "cheap" in q and "strong" in q
    audit = run_proctor("audit", "--prereg", str(prereg), str(results / "rt"))
    assert audit.code == 0 and audit.out["ok"] is True, audit.out


def _kill_gaps(p: Any) -> bool:
    """What a kill -9 may leave until the next invocation (tests/support/crash.py `crash_gap`), and a work file an
    attempt cut off was writing: a temporary file of its atomic write."""
    return crash_gap(p) or (p.rule == "work" and ".tmp-" in os.path.basename(p.file))


def spend_from_files(folder: Path, reserve: float) -> float:
    """The stage's spend from its files alone: every attempt record's cost and every late cost (unknown: the
    reserve)."""
    got = _logs(folder)
    parts = [cost_for_spend(a["cost_usd"], reserve) for a in got["attempts"]]
    parts += [cost_for_spend(e["cost_usd"], reserve) for e in got["run"] if e["event"] == "late_cost"]
    return math.fsum(parts)


def _leftover(token: str) -> list[int]:
    """The attempt processes (reapers, sandboxes, workers, gate and verify runs) still alive whose command
    line names the runner's temporary folder, after waiting up to 10 s for their parent-death signals."""
    deadline = time.monotonic() + 10
    while alive_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive_with(token)


def test_kill_9_at_random_moments_then_resume_loses_nothing(tmp_path: Path, sim_server: SimServer) -> None:
    """Issue 17's done-when for repository tasks: `proctor run` (a real subprocess) killed with SIGKILL to its
    process group at seeded random moments over the stage's run, resumed each time with the same command, then
    run to its end. After every kill: nothing of the attempt is left running, the oracle finds only crash gaps,
    what the runner counts is what the files hold, no delivered attempt is lost. At the end: every planned cell
    stands exactly once, every final is bound to its receipt, each attempt's spend is its wire's (the cheap
    arm's repair turn makes two requests per attempt), the report, the oracle and `proctor audit` are clean."""
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.0, "sim-k3": 1.0}), seed=11)
    arm = {"id": "fix", "template": "{prompt}", "worker": {"kind": "llm-edit", "repair_turns": 1}}
    prereg = repo_prereg(tmp_path, items=2, retries=3, arms=[arm])
    # the runner's temporary folders (every attempt process's command line names it), short enough for the
    # metering proxy's Unix socket path
    scratch = Path(tempfile.mkdtemp(prefix="rtk-", dir="/tmp"))
    try:
        _soak(prereg, scratch, url)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _soak(prereg: Path, scratch: Path, url: str) -> None:
    rng = random.Random(20261202)
    results = prereg.parent.parent / "results"
    folder = results / "rt" / "A"
    env = {**runner_env(url), "TMPDIR": str(scratch)}
    argv = run_argv(prereg, results)
    reserve = 0.01
    kills, delivered_seen = 0, set[str]()
    t0 = time.monotonic()
    for _ in range(4):
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        wait_in_flight(folder, proc, intents=1 + sum(1 for e in _logs(folder)["run"] if e["event"] == "intent"))
        # within an attempt's first 1.5 s (one takes a second or two: set-up, worker, verify), so that the stage
        # does not end before the rounds have killed it three times
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        out, err = proc.communicate(timeout=30)
        assert proc.returncode in (-signal.SIGKILL, 0), (proc.returncode, out, err)
        assert _leftover(str(scratch)) == [], "an attempt's process outlived the killed runner"
        problems = [x for x in run_problems(folder, prereg_dir=prereg) if not _kill_gaps(x)]
        assert problems == [], [str(x) for x in problems]
        dry = json.loads(subprocess.run(run_argv(prereg, results, "--dry-run"), cwd=REPO, env=env,
                                        capture_output=True, timeout=60).stdout)
        assert math.isclose(dry["progress"]["total_usd"], spend_from_files(folder, reserve), rel_tol=1e-9,
                            abs_tol=1e-12), dry
        now = {json.dumps(a, sort_keys=True) for a in _logs(folder)["attempts"] if a["outcome"] == "delivered"}
        assert delivered_seen <= now, "a delivered attempt was lost"
        delivered_seen = now
        if proc.returncode == 0:
            break
    assert kills >= 3, f"only {kills} of the rounds were killed mid-stage"
    final = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=300)
    assert final.returncode == 0, (final.stdout, final.stderr)
    assert _leftover(str(scratch)) == []
    assert run_problems(folder, prereg_dir=prereg) == []
    got = _logs(folder)
    plan = {json.loads(x)["run_id"]: json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    # every planned cell stands exactly once
    standing = [f["run_id"] for f in got["finals"] if f["action"] == "stand"]
    assert sorted(standing) == sorted(plan), (standing, sorted(plan))
    keys = [(a["run_id"], a["rerun"], a["attempt"]) for a in got["attempts"]]
    assert len(keys) == len(set(keys)), "an attempt recorded twice"
    assert any(a.get("error_code") == "runner_lost" for a in got["attempts"]), "no kill landed inside an attempt"
    # every final is bound to its receipt, and its receipt to the attempt it judged
    shas = [sha256_hex(canonical_bytes(a)) for a in got["attempts"]]
    for f in got["finals"]:
        assert f["attempt_sha256"] == shas[f["attempt_line"] - 1], f
        if f.get("receipt") is not None:
            data = (folder / f["receipt"]).read_bytes()
            receipt = json.loads(data)
            assert receipt["attempt_sha256"] == f["attempt_sha256"] and receipt["passed"] is f["passed"], f
            assert receipt["run_id"] == f["run_id"] and receipt["rerun"] == f["rerun"], f
    assert {(plan[f["run_id"]]["system"], f["passed"]) for f in got["finals"] if f["action"] == "stand"} == {
        ("cheap", False), ("strong", True)}
    # spend conserved across the requests of each attempt: the attempt's cost is its wire metered, and the
    # cheap arm's attempts (a failed edit, then a repair turn) made more than one request
    price = load_pricing(BUNDLED_PRICING)
    for a in got["attempts"]:
        if a["outcome"] != "delivered":
            continue
        wire = read_wire(folder / a["work"]["folder"] / "wire.jsonl")
        system = plan[a["run_id"]]["system"]
        metered = total_cost(meter(w.usage, price.get("sim-flash" if system == "cheap" else "sim-k3")) for w in wire)
        assert metered.total is not None and math.isclose(a["cost_usd"], metered.total), a
        assert len(wire) == a["work"]["exchanges"] >= (2 if system == "cheap" else 1), a
    assert math.isclose(json.loads(final.stdout)["progress"]["total_usd"], spend_from_files(folder, reserve),
                        rel_tol=1e-9, abs_tol=1e-12)
    assert build_report(folder, prereg_dir=prereg).summary["problems"] == 0
    audit = run_proctor("audit", "--prereg", str(prereg), str(results / "rt"))
    assert audit.code == 0 and audit.out["ok"] is True, audit.out
    print(f"repo-task kill soak: {kills} kills, {len(got['attempts'])} attempts, {time.monotonic() - t0:.1f} s")


def test_a_worker_whose_provider_fails_is_a_provider_failure_retried_then_exhausted(
        tmp_path: Path, sim_server: SimServer) -> None:
    systems = tmp_path / "systems.json"
    down = {"rate_limited": 0.0, "server_error": 1.0, "timeout": 0.0}
    systems.write_text(json.dumps({"systems": [
        {"name": n, "skill": 1.0, "latency_s": {"dist": "fixed", "value": 0}, "output_tokens": {"mean": 50},
         **({"failures": down} if n == "sim-flash" else {})} for n in ("sim-flash", "sim-k3")]}))
    url = sim_server(systems=systems, seed=9)
    prereg = repo_prereg(tmp_path, items=1, retries=1)
    summary = run_stage(prereg, "A", tmp_path / "results", base_urls=_urls(url))
    folder = tmp_path / "results" / "rt" / "A"
    logs = _logs(folder)
    plan = {json.loads(line)["run_id"]: json.loads(line)["system"]
            for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    cheap = [a for a in logs["attempts"] if plan[a["run_id"]] == "cheap"]
    # llm-edit exits 75; the attempt is the request's provider error: a transport retry, then a rerun
    assert [a["error_code"] for a in cheap] == ["server_error"] * 4
    assert all(a["work"]["exit_code"] == 75 and a["work"]["exchanges"] >= 1 for a in cheap)
    # a 500 carries no usage: unknown, counted as the reserve (as a completion attempt's would be)
    assert all(a["cost_usd"] == "unknown" and "verify.json" not in a["work"]["files"] for a in cheap)
    finals = {f["system"]: f for f in logs["finals"]}
    assert finals["cheap"]["class"] == "provider" and finals["cheap"]["action"] == "stand"  # exhausted
    assert finals["strong"]["passed"] is True
    assert summary.exit_code == 1 and not summary.complete  # an exhausted cell is never scored
    assert run_problems(folder, prereg_dir=prereg) == []


@pytest.mark.parametrize("kind", ["context_length", "quota", "rate_limited"])
def test_a_provider_error_inside_an_attempt_is_classed_as_a_completion_s(
        tmp_path: Path, sim_server: SimServer, kind: str) -> None:
    """The same planted upstream error (a 400 `context_length_exceeded`, a 429 `insufficient_quota`, a 429
    `rate_limit_exceeded`) ends a repo_task attempt with the code and failure class it gives a completion
    attempt: read from the recorded body, not from the metering proxy's status-only code (issue 17)."""
    failing = {"rate_limited": 0.0, "server_error": 0.0, "timeout": 0.0, kind: 1.0}
    systems = tmp_path / "systems.json"
    systems.write_text(json.dumps({"systems": [
        {"name": n, "skill": 1.0, "latency_s": {"dist": "fixed", "value": 0}, "output_tokens": {"mean": 50},
         **({"failures": failing} if n == "sim-flash" else {})} for n in ("sim-flash", "sim-k3")]}))
    repo = tmp_path / "repo"
    repo.mkdir()
    prereg = repo_prereg(repo, items=1, retries=1)
    run_stage(prereg, "A", repo / "results", base_urls=_urls(sim_server(systems=systems, seed=9)))
    folder = repo / "results" / "rt" / "A"
    logs = _logs(folder)
    plan = {json.loads(line)["run_id"]: json.loads(line)["system"]
            for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    cheap = [a for a in logs["attempts"] if plan[a["run_id"]] == "cheap"]
    assert cheap and all(a["work"]["exit_code"] == 75 for a in cheap)
    for attempt in cheap:  # the proxy's own record of the last exchange says only what its status says
        wire = read_wire(folder / attempt["work"]["folder"] / "wire.jsonl")
        assert wire[-1].error_code == {"context_length": "bad_request"}.get(kind, "rate_limited")
    repo_final = next(f for f in logs["finals"] if plan[f["run_id"]] == "cheap")

    # the same failure answering a completion (HumanEval) stage of the same system
    completion = tmp_path / "completion"
    completion.mkdir()
    with sim_servers(completion) as start:
        url = start([study_system("sim-flash", 1.0, **{kind: 1.0}), study_system("sim-glm", 1.0)])
        done = completion_prereg(completion, items=1, retries=1)
        run_stage(done, "A", completion / "results", base_urls=study_urls(url))
    other = study_logs(completion / "results" / "rt" / "A")
    good = {a["run_id"] for a in other["attempts"] if a.get("error_code") is not None}
    codes = {a["error_code"] for a in other["attempts"] if a["run_id"] in good}
    assert {a["error_code"] for a in cheap} == codes == {kind}
    completion_final = next(f for f in other["finals"] if f["run_id"] in good)
    assert repo_final["class"] == completion_final["class"]
    assert repo_final["action"] == completion_final["action"]
    assert run_problems(folder, prereg_dir=prereg) == []


def test_the_mutant_suite_runs_through_the_same_kind(tmp_path: Path) -> None:
    # a `snapshot` item: its workspace (a git baseline) and task laid out from the suite's private part
    prereg = repo_prereg(tmp_path, suite=MUTANTS, items=2)
    with mutant_sim(tmp_path, {"sim-flash": 0.0, "sim-k3": 1.0}) as url:
        summary = run_stage(prereg, "A", tmp_path / "results", base_urls=_urls(url))
    assert summary.exit_code == 0 and summary.complete, summary.stops
    folder = tmp_path / "results" / "rt" / "A"
    logs = _logs(folder)
    plan = {json.loads(line)["run_id"]: json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    verdicts = sorted((plan[f["run_id"]]["system"], f["passed"]) for f in logs["finals"])
    assert verdicts == [("cheap", False), ("cheap", False), ("strong", True), ("strong", True)]
    for attempt in logs["attempts"]:
        diff = (folder / attempt["work"]["folder"] / "diff.patch").read_text()
        # strong answers the reference fix: the diff undoes the one mutated line; cheap leaves it mutated
        assert (diff.count("\n-") == 1) if plan[attempt["run_id"]]["system"] == "strong" else diff == ""
    assert run_problems(folder, prereg_dir=prereg) == []
    assert audit_results(tmp_path / "results" / "rt", prereg=prereg).ok


def test_a_node_s_result_is_checked_and_metered_by_the_driver(tmp_path: Path, sim_server: SimServer) -> None:
    """The ray engine's driver side of a repository-task attempt (`node_work`), on a real attempt's record and
    files: the spend is the driver's metering of the wire bytes (never the node's figure), and a result for
    another attempt, with a file outside a work folder, with a verdict its receipt contradicts or without the
    cascade the order named is a
    `harness_error` that still costs what was metered."""
    import dataclasses

    from harness.run.attempts import read_plan
    from harness.run.kinds.repo_task import CascadeSystem, WorkOrder, node_work

    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 1.0, "sim-k3": 1.0}), seed=5)
    prereg = repo_prereg(tmp_path, items=1)
    assert run_stage(prereg, "A", tmp_path / "results", base_urls=_urls(url)).exit_code == 0
    folder = tmp_path / "results" / "rt" / "A"
    attempt = next(a for a in _logs(folder)["attempts"] if a["outcome"] == "delivered")
    files = {name: (folder / attempt["work"]["folder"] / name).read_bytes() for name in attempt["work"]["files"]}
    cell = next(c for c in read_plan(folder / "plan.jsonl").requests if c.run_id == attempt["run_id"])
    price = load_pricing(BUNDLED_PRICING).get("sim-flash" if cell.system == "cheap" else "sim-k3")
    order = WorkOrder(cell=cell, rerun=attempt["rerun"], attempt=attempt["attempt"], started=attempt["started"],
                      task_path=None, snapshot="unused", snapshot_tree="", catalog_path="unused", upstream=url,
                      price=price, deadline_s=60, stage_folder=str(tmp_path / "driver"))
    def same(a: dict[str, Any], b: dict[str, Any]) -> bool:  # the attempt's fields but its end, stamped later
        keys = set(a) - {"ended", "latency_s", "kind"}
        assert keys <= set(b), keys - set(b)
        return {k: a[k] for k in keys} == {k: b[k] for k in keys}

    kept = node_work(order, dict(attempt), files, "n1")
    assert same(kept, attempt)  # an honest node's result is the local attempt's record
    assert (tmp_path / "driver" / attempt["work"]["folder"] / "diff.patch").read_bytes() == files["diff.patch"]
    assert same(node_work(order, {**attempt, "cost_usd": 99.0, "tokens": None}, files, "n1"), attempt)  # metered here

    for bad, given, why in (({**attempt, "attempt": attempt["attempt"] + 1}, files, "names attempt"),
                     (attempt, {**files, "../escape": b"x"}, "not a work folder's"),
                     ({**attempt, "work": {**attempt["work"], "passed": not attempt["work"]["passed"]}}, files,
                      "verdict is not its receipt's"),
                     (attempt, files, "cascade is not the order's")):  # ordered as a cascade, came back as one step
        asked = order if why != "cascade is not the order's" else dataclasses.replace(order, cascade=(
            CascadeSystem(cell.system, cell.model, url, price), CascadeSystem("strong", "sim-k3", url, price)))
        record = node_work(dataclasses.replace(asked, stage_folder=str(tmp_path / why[:5])), dict(bad), given, "n1")
        assert record["outcome"] == "error" and record["error_code"] == "harness_error", record
        assert why in record["error_message"] and "node n1" in record["error_message"]
        assert record["cost_usd"] == attempt["cost_usd"] > 0 and record["work"]["files"] == {}
        assert not (tmp_path / "escape").exists() and not (tmp_path / why[:5] / "work" / "escape").exists()
