"""The runner's own CPU per attempt (issue 16 target: at most 1.5 ms beyond the model call and the check).

The simulator answers at zero latency in its own process and the warm verifier
checks answers in its own process, so the CPU time of this process over a
stage is proctor's own work: planning, admission, the transport, metering,
every chained append (fsync waits are not CPU, the kernel's work in fsync is),
finals and receipts, and the progress display `proctor run` shows
(`ProgressDisplay`, writing plain lines as to a log). The peer in the same run
is the bare minimum a client does for the same requests: an httpx post of the
same bodies and a JSON parse of each answer.

Two stage sizes run alternately (ITEMS items x 2 systems, 1 and LARGE_REPEATS repeats), medians of RUNS:
the whole stage's CPU divided by its attempts (the stage's own set-up included), and the CPU each further
attempt adds (the difference of the two sizes over the difference of their attempts: the set-up cancels),
which is what the target bounds.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_runner_cpu.py -s
(PROCTOR_BENCH_ITEMS, default 60; PROCTOR_BENCH_REPEATS, the larger size's repeats, default 4;
PROCTOR_BENCH_RUNS, default 3).
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests.support`

from harness.cli.progress import ProgressDisplay
from harness.run.attempts import read_plan
from harness.run.runner import run_stage
from tests.support.bench import Row, alternate, bare_client, bench_command, median, record
from tests.support.study import prereg, sim_servers, system, urls

ITEMS = int(os.environ.get("PROCTOR_BENCH_ITEMS", "60"))
LARGE_REPEATS = int(os.environ.get("PROCTOR_BENCH_REPEATS", "4"))
RUNS = int(os.environ.get("PROCTOR_BENCH_RUNS", "3"))


def test_runner_cpu_per_attempt(tmp_path: Path) -> None:
    assert LARGE_REPEATS > 1, "the larger stage needs more repeats than the smaller one"
    made = {"n": 0}
    attempts: dict[int, int] = {}
    bodies: list[bytes] = []
    with sim_servers(tmp_path) as start:
        url = start([system("sim-flash", 1.0), system("sim-glm", 0.5)])

        def stage(repeats: int) -> float:
            made["n"] += 1
            root = tmp_path / f"run-{made['n']}"
            folder = prereg(root, items=ITEMS, repeats=repeats, caps=(1e3, 1e3), overall=3e3)
            display = ProgressDisplay(io.StringIO(), tty=False)
            cpu0 = time.process_time()
            summary = run_stage(folder, "A", root / "results", base_urls=urls(url), progress=display)
            display.close()
            cpu = time.process_time() - cpu0
            assert summary.exit_code == 0, summary.to_json()
            attempts[repeats] = (Path(summary.folder) / "attempts.jsonl").read_bytes().count(b"\n")
            if not bodies:
                bodies.extend(request.body for request in read_plan(Path(summary.folder) / "plan.jsonl").requests)
            return cpu

        cpu = alternate(RUNS, {"small": lambda: stage(1), "large": lambda: stage(LARGE_REPEATS)})
        _, peer = bare_client(url, bodies)
    small, large = median(cpu["small"]), median(cpu["large"])
    whole = large / attempts[LARGE_REPEATS] * 1000
    marginal = (large - small) / (attempts[LARGE_REPEATS] - attempts[1]) * 1000
    peer_per = peer / len(bodies) * 1000
    beyond = marginal - peer_per
    print(f"\n[runner cpu] {ITEMS} items x 2 systems x 1 and {LARGE_REPEATS} repeats ({attempts[1]} and "
          f"{attempts[LARGE_REPEATS]} attempts), medians of {RUNS}, load average {os.getloadavg()[0]:.1f}")
    print(f"  whole stage, set-up included:     {whole:6.2f} ms CPU per attempt (CPU s: small "
          f"{', '.join(f'{c:.3f}' for c in cpu['small'])}; large {', '.join(f'{c:.3f}' for c in cpu['large'])})")
    print(f"  each further attempt:             {marginal:6.2f} ms CPU")
    print(f"  peer: bare httpx post + json parse: {peer_per:6.2f} ms CPU per request")
    print(f"  beyond the bare client: {beyond:.2f} ms per attempt (target <= 1.5 ms); ratio {marginal / peer_per:.1f}x")
    env = "" if (ITEMS, LARGE_REPEATS) == (60, 4) else f"PROCTOR_BENCH_ITEMS={ITEMS} PROCTOR_BENCH_REPEATS={LARGE_REPEATS}"
    record("runner_cpu", [Row(
        f"the runner's own CPU per attempt (stages of {attempts[1]} and {attempts[LARGE_REPEATS]} attempts, alternating, "
        f"medians of {RUNS}; simulator at zero latency, verifier in its own process, the progress display)",
        f"each further attempt: {marginal:.2f} ms, {beyond:.2f} ms beyond the bare client (target <= 1.5 ms); "
        f"the whole stage with its set-up: {whole:.2f} ms",
        "bare httpx post + JSON parse of the same bodies", f"{peer_per:.2f} ms",
        f"{marginal / peer_per:.1f}x the bare client", bench_command("tests/bench/bench_runner_cpu.py", env=env))])
    assert marginal < 50  # a loose floor against a gross regression, not a timing assertion
