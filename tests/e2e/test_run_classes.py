"""Failure classes and the runner's actions on them, end to end over the simulator.

An operator error (auth, billing, quota) pauses a system's lanes until a later
`proctor run ... --resume-paused`; a harness error stops them; inconclusive
failures ending runs in more than five items stop them; a host sampler failing
for five minutes stops the run with cause `sampler`. Every run passes the oracle.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.audit.oracle import run_problems
from tests.support.paths import REPO
from tests.support.study import Sim, logs, prereg, run_argv, runner_env, system


def proctor_run(p: Path, results: Path, url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(run_argv(p, results, *extra), cwd=REPO, env=runner_env(url), capture_output=True,
                          timeout=120)
    return done.returncode, json.loads(done.stdout)


def patched_run(code: str, p: Path, results: Path, url: str) -> tuple[int, dict[str, Any]]:
    """`proctor run` in a subprocess after `code` has monkeypatched the runner."""
    prog = code + "\nfrom harness.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    argv = [sys.executable, "-c", prog, *run_argv(p, results)[3:]]
    done = subprocess.run(argv, cwd=REPO, env=runner_env(url), capture_output=True, timeout=120)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def stops(got: dict[str, list[dict[str, Any]]]) -> list[tuple[str | None, str]]:
    return [(e.get("system"), e["cause"]) for e in got["run"] if e["event"] == "stop"]


def standing_items(got: dict[str, list[dict[str, Any]]], slot: str) -> set[str]:
    finals = [f for f in got["finals"] if f["system"] == slot]
    return {f["item"] for f in finals if f["action"] == "stand"}


def test_an_operator_error_pauses_the_system_until_resume_paused(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0, auth=1.0)])
    p = prereg(tmp_path, items=4)
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    code, _ = proctor_run(p, results, url)
    assert code == 1
    got = logs(folder)
    pauses = [e for e in got["run"] if e["event"] == "pause"]
    assert pauses and {e["system"] for e in pauses} == {"bad"}
    assert {e["error_code"] for e in pauses} == {"auth"}
    paused_at = pauses[0]["at"]
    bad = [e for e in got["run"] if e["event"] == "attempt" and e["system"] == "bad"]
    assert bad and all(a["started"] <= paused_at for a in bad), "an attempt started during the pause"
    assert {f["class"] for f in got["finals"] if f["system"] == "bad"} == {"operator"}
    assert standing_items(got, "good") == {f["item"] for f in got["finals"] if f["system"] == "good"}
    assert len(standing_items(got, "good")) == 4
    assert run_problems(folder, prereg_dir=p) == []
    n_attempts = len(got["attempts"])

    # without --resume-paused: the pause holds, no new attempt
    code, _ = proctor_run(p, results, url)
    assert code == 1
    got = logs(folder)
    assert len(got["attempts"]) == n_attempts
    assert not [e for e in got["run"] if e["event"] == "resume_paused"]
    assert run_problems(folder, prereg_dir=p) == []

    # the operator fixed the key (a simulator without the planted auth failure), then resumes
    fixed = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    code, _ = proctor_run(p, results, fixed, "--resume-paused")
    assert code == 0
    got = logs(folder)
    resumed = [e for e in got["run"] if e["event"] == "resume_paused"]
    assert [e["system"] for e in resumed] == ["bad"]
    assert len(got["attempts"]) > n_attempts
    assert all(a["started"] >= resumed[0]["at"] for a in got["attempts"][n_attempts:])
    assert all(e["started"] >= resumed[0]["at"] for e in got["run"] if e["event"] == "attempt"
               and e["attempts_line"] > n_attempts)
    assert len(standing_items(got, "bad")) == 4
    assert run_problems(folder, prereg_dir=p) == []


def test_inconclusive_failures_in_more_than_five_items_stop_the_system(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0, malformed=1.0)])
    p = prereg(tmp_path, items=10)  # reruns = 2: each item's runs all end inconclusive
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    code, summary = proctor_run(p, results, url)
    assert code == 1
    got = logs(folder)
    assert stops(got) == [("bad", "inconclusive")]
    assert [s["cause"] for s in summary["stops"]] == ["inconclusive"]
    bad_finals = [f for f in got["finals"] if f["system"] == "bad"]
    assert {f["class"] for f in bad_finals} == {"inconclusive"}
    assert {f["error_code"] for f in bad_finals} == {"malformed_response"}
    items_hit = {f["item"] for f in bad_finals}
    assert 5 < len(items_hit) < 10
    assert len(standing_items(got, "good")) == 10
    assert run_problems(folder, prereg_dir=p) == []


_VERIFIER_DOWN = """
import sys
from harness.evals.verify_humaneval import VerifierUnavailable
from harness.run import runner

original = runner._Engine.verify

def verify(self, state):
    if state.request.system == "bad":
        raise VerifierUnavailable("the sandbox is gone (planted)")
    return original(self, state)

runner._Engine.verify = verify
"""


def test_a_harness_error_stops_the_system(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    p = prereg(tmp_path, items=4)
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    code, summary = patched_run(_VERIFIER_DOWN, p, results, url)
    assert code == 1
    got = logs(folder)
    assert stops(got) == [("bad", "harness")]
    assert [s["cause"] for s in summary["stops"]] == ["harness"]
    assert len(standing_items(got, "good")) == 4
    assert run_problems(folder, prereg_dir=p) == []


_SAMPLER_DOWN = """
import sys
from harness.run import host

original = host.host_sample

def host_sample(at, reason, disk_path):
    record = original(at, reason, disk_path)
    if reason == "periodic":
        record.update(load=None, memory=None, disk=None, errors=["load: planted", "memory: planted", "disk: planted"])
    return record

host.host_sample = host_sample
host.SAMPLE_EVERY_S = 0.02   # seconds stand in for the 30 s interval
host.SAMPLER_FAIL_S = 0.3    # and for the five minutes
"""


def test_a_sampler_failing_for_five_minutes_stops_the_run(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0, latency=0.2), system("sim-glm", 0.0, latency=0.2)], latency_scale=1.0)
    p = prereg(tmp_path, items=12)
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    code, summary = patched_run(_SAMPLER_DOWN, p, results, url)
    assert code == 1
    got = logs(folder)
    assert [c for _, c in stops(got)] == ["sampler"]
    assert [s["cause"] for s in summary["stops"]] == ["sampler"]
    failed = [h for h in got["host"] if h["reason"] == "periodic"]
    assert failed and all(h["load"] is None for h in failed)
    assert len(got["finals"]) < 24  # the run stopped before the stage was done
    assert run_problems(folder, prereg_dir=p) == []


def test_proctor_run_refuses_before_any_provider_call_when_the_endpoint_is_down(tmp_path: Path, sim: Sim) -> None:
    """Issue 13 item 1: `proctor run` runs the preflight first, always (the simulator stopped before the run)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()
    p, results = prereg(tmp_path), tmp_path / "results"
    code, out = proctor_run(p, results, dead)
    assert code != 0 and out["refusal"] == "run_preflight_failed", out
    assert [pr["check"] for pr in out["problems"]] == ["endpoint"] and dead in out["message"]
    assert not (results / "rt" / "A" / "attempts.jsonl").exists()  # no attempt, no spend, nothing to score
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    code, out = proctor_run(p, results, url)
    assert code == 0 and out["complete"] is True, out
    assert run_problems(results / "rt" / "A", prereg_dir=p) == []
