"""Real signals to a real `proctor run` process, and a second invocation while the first holds the lock.

The first SIGINT or SIGTERM stops admission: attempts under way finish and are
saved, the run log gets a `signal` and a stop with cause `interrupt`, exit 1.
A second signal exits at once with 128 + the signal number; what was saved
survives (the logs verify, or show only a torn tail that repair fixes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.audit.oracle import run_problems
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import verify_log
from harness.run.layout import log_seed
from tests.support.paths import REPO
from tests.support.study import Sim, logs, prereg, run_argv, runner_env, system


def wait_for_lines(folder: Path, proc: subprocess.Popen[bytes], n: int, log: str = "attempts",
                   timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    path = folder / f"{log}.jsonl"
    while not (path.exists() and path.read_bytes().count(b"\n") >= n):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the runner made no attempts"
        time.sleep(0.02)


def start(tmp_path: Path, sim: Sim, *, latency: float = 0.6) -> tuple[Path, Path, dict[str, str], subprocess.Popen[bytes]]:
    url = sim([system("sim-flash", 1.0, latency=latency), system("sim-glm", 0.0, latency=latency)],
              latency_scale=1.0)
    p = prereg(tmp_path, items=8)
    results = tmp_path / "results"
    env = runner_env(url)
    proc = subprocess.Popen(run_argv(p, results), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p, results, env, proc


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_first_signal_stops_admission_and_saves_what_is_under_way(tmp_path: Path, sim: Sim, signum: int) -> None:
    p, results, env, proc = start(tmp_path, sim, latency=1.0)
    folder = results / "rt" / "A"
    wait_for_lines(folder, proc, 2, "admission")
    time.sleep(0.3)  # the first items' attempts (1 s each) are in flight
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    summary = json.loads(out)
    assert {s["cause"] for s in summary["stops"]} == {"interrupt"}
    got = logs(folder)
    sig = [e for e in got["run"] if e["event"] == "signal"]
    assert [(e["signum"], e["count"]) for e in sig] == [(int(signum), 1)]
    assert [e["cause"] for e in got["run"] if e["event"] == "stop"] == ["interrupt"]
    at = sig[0]["at"]
    # attempts under way at the signal finished and were saved; none started after it
    assert all(a["started"] <= at for a in got["attempts"])
    assert any(a["ended"] > at for a in got["attempts"]), "no attempt was under way at the signal"
    assert all(a["at"] <= at for a in got["admission"] if a["decision"] == "admit")
    assert got["run"][-1]["event"] == "end" and got["run"][-1]["exit_code"] == 1
    assert run_problems(folder, prereg_dir=p) == []
    # resuming with the same command completes the stage
    again = subprocess.run(run_argv(p, results), cwd=REPO, env=env, capture_output=True, timeout=120)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert run_problems(folder, prereg_dir=p) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_exits_at_once_and_saved_records_survive(tmp_path: Path, sim: Sim, signum: int) -> None:
    p, results, env, proc = start(tmp_path, sim, latency=4.0)
    folder = results / "rt" / "A"
    wait_for_lines(folder, proc, 1)  # one attempt saved (4 s); the next ones are then in flight
    wait_for_lines(folder, proc, 5, "admission")
    time.sleep(0.2)
    saved = (folder / "attempts.jsonl").read_bytes()
    os.kill(proc.pid, signum)
    time.sleep(0.2)
    t = time.monotonic()
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum
    assert time.monotonic() - t < 2.5  # at once: not after the in-flight attempts (4 s) end
    # issue 13 item 10: with --json the stop record is printed (one JSON object), even on the second signal
    record = json.loads(out)
    assert (record["ok"], record["exit_code"], record["stopped"], record["signum"]) == (
        False, 128 + signum, "second_signal", int(signum)), (out, err)
    assert record["folder"] == str(folder) and record["stage"] == "A" and not record["complete"]
    assert {s["cause"] for s in record["stops"]} == {"interrupt"}
    assert (folder / "attempts.jsonl").read_bytes().startswith(saved)
    for name in ("attempts", "finals", "run", "admission", "host", "anchors"):
        path = folder / f"{name}.jsonl"
        if not path.exists():
            continue
        status = verify_log(path, log_seed("rt", "A", name))
        assert status.problem is None or status.problem.kind == "torn_tail", (name, status.problem)
        if status.problem is not None:
            ChainedLog(path, log_seed("rt", "A", name)).repair()
    run = logs(folder)["run"]
    assert [e["count"] for e in run if e["event"] == "signal"] == [1, 2]
    again = subprocess.run(run_argv(p, results), cwd=REPO, env=env, capture_output=True, timeout=180)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert run_problems(folder, prereg_dir=p) == []


def test_a_second_invocation_while_the_first_holds_the_lock_is_refused(tmp_path: Path, sim: Sim) -> None:
    # slow attempts (3 s) keep the first run going while the second starts up on a loaded machine
    p, results, env, proc = start(tmp_path, sim, latency=3.0)
    folder = results / "rt" / "A"
    try:
        wait_for_lines(folder, proc, 1)
        second = subprocess.run(run_argv(p, results), cwd=REPO, env=env, capture_output=True, timeout=60)
        assert second.returncode == 3, (second.stdout, second.stderr)
        assert json.loads(second.stdout)["refusal"] == "invocation_locked"
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert run_problems(folder, prereg_dir=p) == []


_SIGNAL_AT_END = """
import os, signal, sys
from harness.run import runner

original = runner._Engine.sample

def sample(self, reason):
    if reason == "end":
        for _ in range({count}):
            os.kill(os.getpid(), signal.SIGTERM)
    return original(self, reason)

runner._Engine.sample = sample
from harness.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("count", [1, 2])
def test_signals_outside_the_event_loop_are_handled_too(tmp_path: Path, sim: Sim, count: int) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    p = prereg(tmp_path, items=3)
    results = tmp_path / "results"
    argv = [sys.executable, "-c", _SIGNAL_AT_END.format(count=count), *run_argv(p, results)[3:]]
    done = subprocess.run(argv, cwd=REPO, env=runner_env(url), capture_output=True, timeout=120)
    folder = results / "rt" / "A"
    got = logs(folder)
    signals = [e for e in got["run"] if e["event"] == "signal"]
    if count == 1:  # the stage had completed: the signal is logged, the end is written, nothing is lost
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert [e["count"] for e in signals] == [1]
        assert got["run"][-1]["event"] == "end"
        assert run_problems(folder, prereg_dir=p) == []
    else:  # a second signal exits at once with 128 + SIGTERM, as inside the loop, printing the stop record
        assert done.returncode == 128 + int(signal.SIGTERM), (done.stdout, done.stderr)
        assert json.loads(done.stdout)["stopped"] == "second_signal"
        for name in ("attempts", "finals", "run"):
            assert verify_log(folder / f"{name}.jsonl", log_seed("rt", "A", name)).ok
