"""Benchmark: `proctor run`, whole process, at many lanes and at zero latency (issue 16's targets).

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_lanes.py -s

One frozen one-system preregistration: the 164 HumanEval items x 5 repeats = 820 attempts, 64 lanes,
every answer checked against the hidden tests in the sandbox, every record chained and fsynced.

1. Against `proctor sim serve` answering after a fixed 0.5 s: attempts/s of the whole process (start to
   exit) as a share of the ideal, lanes / latency = 128 attempts/s (target >= 90%), and beside it the
   plan's own bound: a lane runs its items' cells one after another (docs/run.md, "Lanes"), and the
   164 items do not divide evenly among 64 lanes, so the longest lane's cells x the latency is the least
   any runner could take (here 15 x 0.5 s = 7.5 s, 85% of the ideal).
2. Against the simulator at zero latency: attempts/s with checking on this machine's cores (target >= 300),
   beside the peer in the same run: a bare httpx client posting the same 820 request bodies one after
   another and parsing each answer (no checking, no records): the simulator's rate for one plain client.
   Beside it, the machine's busy CPU-seconds over the run (every process and the kernel: the runner, the
   warm verifiers and each check's forked process, the simulator) per attempt, and the rate that much
   work allows at best on this machine's cores (all of them busy all the time, start-up included).

Medians of RUNS (PROCTOR_BENCH_RUNS, default 1) runs each; the two alternate.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from harness.run.attempts import read_plan
from tests.support.bench import (
    Row,
    alternate,
    bare_client,
    bench_command,
    machine_busy_s,
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
    busy: dict[str, list[float]] = {"latency": [], "zero": []}
    with sim_servers(tmp_path) as start:
        slow = start([system("sim-flash", 1.0, latency=LATENCY_S)], latency_scale=1.0)
        fast = start([system("sim-flash", 1.0, latency=LATENCY_S)], latency_scale=0.0)

        def run(url: str) -> float:
            runs["n"] += 1
            results = tmp_path / f"results-{runs['n']}"
            argv = proctor_argv("run", str(prereg), "--stage", "A", "--results", str(results), "--json")
            before = machine_busy_s()
            took, done = timed_process(argv, env=runner_env(url))
            busy["zero" if url == fast else "latency"].append(machine_busy_s() - before)
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
    longest = max(Counter(request.lane for request in plan.requests).values())
    bound_s = longest * LATENCY_S  # the plan's own bound: the longest lane's cells one after another
    rate, peer_rate = ATTEMPTS / zero_s, len(plan.requests) / peer_wall
    work_ms = median(busy["zero"]) / ATTEMPTS * 1000  # the machine's CPU per attempt at zero latency
    at_best = cores / work_ms * 1000
    print(f"\n`proctor run`, whole process, {ATTEMPTS} attempts ({ITEMS} items x {REPEATS} repeats), {LANES} lanes, "
          f"medians of {RUNS}, {cores} cores, load average {load:.1f}")
    print(f"  at {LATENCY_S} s latency: {slow_s:.2f} s, {ATTEMPTS / slow_s:.1f} attempts/s = {share:.0%} of ideal "
          f"({IDEAL:.0f}/s; target >= 90%)  runs {', '.join(f'{s:.2f}' for s in seconds['latency'])}")
    print(f"  the plan's bound: the longest lane has {longest} cells, {bound_s:.2f} s = {ATTEMPTS / bound_s / IDEAL:.0%} of "
          f"ideal; the run took {slow_s / bound_s:.2f}x that bound")
    print(f"  at zero latency:  {zero_s:.2f} s, {rate:.1f} attempts/s with checking (target >= 300)  "
          f"runs {', '.join(f'{s:.2f}' for s in seconds['zero'])}")
    print(f"  the machine's busy CPU at zero latency: {work_ms:.2f} ms per attempt (every process and the kernel); "
          f"on {cores} cores all busy, at best {at_best:.0f} attempts/s")
    print(f"  peer: bare httpx client, the same {len(plan.requests)} bodies one after another: {peer_rate:.1f} requests/s;"
          f" ratio {rate / peer_rate:.2f}x")
    record("lanes", [
        Row(f"{LANES} lanes at {LATENCY_S} s simulated latency, {ATTEMPTS} attempts, `proctor run` whole process, "
            f"median of {RUNS}",
            f"{ATTEMPTS / slow_s:.1f} attempts/s ({slow_s:.2f} s)",
            f"the ideal, lanes / latency; the plan's bound, its longest lane's {longest} cells x the latency",
            f"{IDEAL:.0f} attempts/s; {bound_s:.2f} s ({ATTEMPTS / bound_s / IDEAL:.0%} of ideal)",
            f"{share:.0%} of ideal (target >= 90%); {slow_s / bound_s:.2f}x the plan's bound", COMMAND),
        Row(f"zero-latency throughput with checking, {ATTEMPTS} attempts, {LANES} lanes, {cores} cores",
            f"`proctor run`: {rate:.1f} attempts/s ({zero_s:.2f} s; target >= 300); the machine busy {work_ms:.2f} ms "
            f"of CPU per attempt (runner, verifiers and checks, simulator, kernel): at best {at_best:.0f}/s on "
            f"{cores} cores",
            "bare httpx client, the same bodies one after another, no checking or records",
            f"{peer_rate:.1f} requests/s", f"{rate / peer_rate:.2f}x", COMMAND),
    ])
