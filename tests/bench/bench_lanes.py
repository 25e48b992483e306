"""Benchmark: `proctor run`, whole process, at many lanes and at zero latency (issue 16's targets).

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_lanes.py -s

One frozen one-system preregistration: the 164 HumanEval items x 5 repeats = 820 attempts, 64 lanes,
every answer checked against the hidden tests in the sandbox, every record chained and fsynced.

1. Against `proctor sim serve` answering after a fixed 0.5 s: attempts/s of the whole process (start to
   exit) as a share of the ideal, lanes / latency = 128 attempts/s (target >= 90%).
2. Against the simulator at zero latency: attempts/s with checking on this machine's cores (target >= 300),
   beside the peer in the same run: a bare httpx client posting the same 820 request bodies one after
   another and parsing each answer (no checking, no records): the simulator's rate for one plain client.

Medians of RUNS (PROCTOR_BENCH_RUNS, default 1) runs each; the two alternate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.run.attempts import read_plan
from tests.support.bench import (
    Row,
    alternate,
    bare_client,
    bench_command,
    median,
    one_system_prereg,
    proctor_argv,
    record,
    timed_process,
)
from tests.support.study import runner_env, sim_servers, system

pytestmark = pytest.mark.bench

RUNS = int(os.environ.get("PROCTOR_BENCH_RUNS", "1"))
LANES, LATENCY_S, ITEMS, REPEATS = 64, 0.5, 164, 5
ATTEMPTS = ITEMS * REPEATS
IDEAL = LANES / LATENCY_S
COMMAND = bench_command("tests/bench/bench_lanes.py")


def test_lanes_and_zero_latency_throughput(tmp_path: Path) -> None:
    prereg = one_system_prereg(tmp_path, items=ITEMS, repeats=REPEATS, lanes=LANES)
    runs = {"n": 0}
    with sim_servers(tmp_path) as start:
        slow = start([system("sim-flash", 1.0, latency=LATENCY_S)], latency_scale=1.0)
        fast = start([system("sim-flash", 1.0, latency=LATENCY_S)], latency_scale=0.0)

        def run(url: str) -> float:
            runs["n"] += 1
            results = tmp_path / f"results-{runs['n']}"
            argv = proctor_argv("run", str(prereg), "--stage", "A", "--results", str(results), "--json")
            took, done = timed_process(argv, env=runner_env(url))
            stage = results / "bench" / "A"
            attempts = (stage / "attempts.jsonl").read_bytes().count(b"\n")
            assert attempts == ATTEMPTS, done.stdout[-2000:]
            return took

        seconds = alternate(RUNS, {"latency": lambda: run(slow), "zero": lambda: run(fast)})
        plan = read_plan(tmp_path / "results-1" / "bench" / "A" / "plan.jsonl")
        peer_wall, _ = bare_client(fast, [request.body for request in plan.requests])

    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    slow_s, zero_s = median(seconds["latency"]), median(seconds["zero"])
    share = ATTEMPTS / slow_s / IDEAL
    rate, peer_rate = ATTEMPTS / zero_s, len(plan.requests) / peer_wall
    print(f"\n`proctor run`, whole process, {ATTEMPTS} attempts ({ITEMS} items x {REPEATS} repeats), {LANES} lanes, "
          f"medians of {RUNS}, {cores} cores, load average {load:.1f}")
    print(f"  at {LATENCY_S} s latency: {slow_s:.2f} s, {ATTEMPTS / slow_s:.1f} attempts/s = {share:.0%} of ideal "
          f"({IDEAL:.0f}/s; target >= 90%)  runs {', '.join(f'{s:.2f}' for s in seconds['latency'])}")
    print(f"  at zero latency:  {zero_s:.2f} s, {rate:.1f} attempts/s with checking (target >= 300)  "
          f"runs {', '.join(f'{s:.2f}' for s in seconds['zero'])}")
    print(f"  peer: bare httpx client, the same {len(plan.requests)} bodies one after another: {peer_rate:.1f} requests/s;"
          f" ratio {rate / peer_rate:.2f}x")
    record("lanes", [
        Row(f"{LANES} lanes at {LATENCY_S} s simulated latency, {ATTEMPTS} attempts, `proctor run` whole process, "
            f"median of {RUNS}",
            f"{ATTEMPTS / slow_s:.1f} attempts/s ({slow_s:.2f} s)", "the ideal, lanes / latency",
            f"{IDEAL:.0f} attempts/s", f"{share:.0%} of ideal (target >= 90%)", COMMAND),
        Row(f"zero-latency throughput with checking, {ATTEMPTS} attempts, {LANES} lanes, {cores} cores",
            f"`proctor run`: {rate:.1f} attempts/s ({zero_s:.2f} s; target >= 300)",
            "bare httpx client, the same bodies one after another, no checking or records",
            f"{peer_rate:.1f} requests/s", f"{rate / peer_rate:.2f}x", COMMAND),
    ])
