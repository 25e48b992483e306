"""The run's verifier pool, seen from the process table of a real `proctor run`.

Every system shares min(lanes, cores) warm verifiers; a worker killed mid-run is
replaced and every answer is still checked; no verify worker outlives the run,
whether it ends, is stopped by a first signal or exits at a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.audit.oracle import run_problems
from harness.evals.suite import load_packet, load_private
from harness.evals.verify_humaneval import WarmVerifier, verify_response
from tests.support.paths import HUMANEVAL, REPO
from tests.support.procs import descendants_with, running
from tests.support.study import Sim, logs, prereg, run_argv, runner_env, system

WORKER = "harness.evals.verify_worker"


def watch(proc: subprocess.Popen[bytes], until: float, *, stop: int | None = None,
          folder: Path | None = None) -> tuple[set[int], dict[int, int], int]:
    """Poll the process table while `proc` runs (or until `until`, or until `folder` holds `stop` finals):
    the verify workers started directly by the run (their outer process: bwrap or python; the
    preflight's, closed before the run, among them), every process of theirs seen (pid -> parent),
    and the most direct workers alive at once."""
    direct: set[int] = set()
    seen: dict[int, int] = {}
    most = 0
    while proc.poll() is None and time.monotonic() < until:
        found = descendants_with(proc.pid, WORKER)
        seen.update(found)
        now = {pid for pid, parent in found.items() if parent == proc.pid}
        direct |= now
        most = max(most, len(now))
        if stop is not None and folder is not None and (folder / "finals.jsonl").exists() \
                and (folder / "finals.jsonl").read_bytes().count(b"\n") >= stop and direct:
            break
        time.sleep(0.01)
    return direct, seen, most


def all_gone(pids: set[int] | dict[int, int], timeout: float = 10.0) -> list[int]:
    """The pids still running after at most `timeout` seconds (a bound on waiting, not a timing check)."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def start(tmp_path: Path, sim: Sim, *, items: int, latency: float, cpus: str | None = None
          ) -> tuple[Path, Path, subprocess.Popen[bytes]]:
    url = sim([system("sim-flash", 1.0, latency=latency), system("sim-glm", 0.5, latency=latency)],
              latency_scale=1.0)
    p = prereg(tmp_path, items=items)  # two systems, two lanes each
    results = tmp_path / "results"
    argv = run_argv(p, results)
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    proc = subprocess.Popen(argv, cwd=REPO, env=runner_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p, results / "rt" / "A", proc


TIMES = ("started", "ended", "started_at", "ended_at")


def checked_everything(folder: Path) -> None:
    """Every delivered answer has a receipt, and each receipt is what one fresh verifier of its own
    writes for the same answer, times aside."""
    got = logs(folder)
    delivered = {(a["run_id"], a["rerun"]): a for a in got["attempts"] if a["outcome"] == "delivered"}
    receipts = {(f["run_id"], f["rerun"]): f["receipt"] for f in got["finals"] if f["receipt"] is not None}
    assert delivered and set(receipts) == set(delivered)
    private, packet = load_private(HUMANEVAL), load_packet(HUMANEVAL / "packet.jsonl")
    manifest = json.loads((HUMANEVAL / "SUITE.json").read_text(encoding="utf-8"))
    with WarmVerifier() as alone:
        for key, name in receipts.items():
            attempt, written = delivered[key], json.loads((folder / name).read_bytes())
            item = private[written["item"]]
            assert item.entry_point is not None and item.test is not None
            _, fresh = verify_response(alone, suite="humaneval", item=written["item"],
                                       prompt=packet.get(written["item"]).prompt, entry_point=item.entry_point,
                                       test=item.test, response_text=attempt["text"] or "",
                                       private_sha256=manifest["private_sha256"])
            fresh.update(run_id=key[0], rerun=key[1], attempt_sha256=written["attempt_sha256"])
            for record in (written, fresh):
                for field in TIMES:
                    record.pop(field)
                record["verdict"].pop("duration_s")
            assert written == fresh, key


@pytest.mark.parametrize("cpus", ["0", None])
def test_every_system_shares_min_lanes_cores_verifiers_and_none_outlives_the_run(
        tmp_path: Path, sim: Sim, cpus: str | None) -> None:
    p, folder, proc = start(tmp_path, sim, items=6, latency=0.05, cpus=cpus)
    direct, seen, most = watch(proc, time.monotonic() + 180)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    cores = 1 if cpus == "0" else len(os.sched_getaffinity(0))
    # four lanes over two systems; one verifier per system would be two at once, whatever the cores
    assert 1 <= most <= min(4, cores), (most, direct)
    if cpus == "0":
        # the run's one (and the preflight's, which can start and end between two polls under load)
        assert most == 1 and 1 <= len(direct) <= 2, direct
    checked_everything(folder)
    assert run_problems(folder, prereg_dir=p) == []
    assert all_gone(seen) == []


def test_a_verifier_killed_mid_run_is_replaced_and_every_answer_is_checked(tmp_path: Path, sim: Sim) -> None:
    p, folder, proc = start(tmp_path, sim, items=8, latency=0.3, cpus="0")
    _, seen, _ = watch(proc, time.monotonic() + 120, stop=1, folder=folder)
    running_now = [pid for pid, parent in descendants_with(proc.pid, WORKER).items() if parent == proc.pid]
    assert len(running_now) == 1, (running_now, proc.poll())  # the run's one verifier (one core)
    victim = running_now[0]
    os.killpg(victim, signal.SIGKILL)  # the worker runs in its own session: the whole sandbox goes
    later, seen_later, most = watch(proc, time.monotonic() + 180)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert victim not in later and len(later) == 1 and most == 1, (victim, later)  # a fresh one took its place
    checked_everything(folder)
    assert run_problems(folder, prereg_dir=p) == []
    assert all_gone({**seen, **seen_later}) == []


@pytest.mark.parametrize("count", [1, 2])
def test_no_verifier_outlives_a_signalled_run(tmp_path: Path, sim: Sim, count: int) -> None:
    p, folder, proc = start(tmp_path, sim, items=8, latency=0.5)
    direct, seen, _ = watch(proc, time.monotonic() + 120, stop=1, folder=folder)
    assert direct, proc.communicate()
    for _ in range(count):
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    # a second signal exits at once: through the handler (128 + 15), or, when the graceful stop had already
    # ended the run and its handlers were gone, by the signal itself (-15); either way no verifier is left
    assert proc.returncode in ((1,) if count == 1 else (128 + int(signal.SIGTERM), -int(signal.SIGTERM))), (out, err)
    if count == 1:
        assert {s["cause"] for s in json.loads(out)["stops"]} == {"interrupt"}
        assert run_problems(folder, prereg_dir=p) == []
    assert all_gone(seen) == []
