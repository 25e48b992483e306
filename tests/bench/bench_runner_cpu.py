"""The runner's own CPU per attempt (issue 16 target: at most 1.5 ms beyond the model call and the check).

The simulator answers at zero latency in its own process and the warm verifier
checks answers in its own process, so the CPU time of this process over a
stage is proctor's own work: planning, admission, the transport, metering,
every chained append (fsync waits are not CPU), finals and receipts, and the progress display
`proctor run` shows (`ProgressDisplay`, writing plain lines as to a log). The peer
in the same run is the bare minimum a client does for the same requests: an
httpx post of the same bodies and a JSON parse of each answer.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_runner_cpu.py -s
At 1,640 attempts (164 items x 2 systems x 5 repeats), where per-event work that grows with the
stage shows: PROCTOR_BENCH_ITEMS=164 PROCTOR_BENCH_REPEATS=5 and the same command.
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
from tests.support.bench import Row, bare_client, bench_command, record
from tests.support.study import prereg, sim_servers, system, urls

ITEMS = int(os.environ.get("PROCTOR_BENCH_ITEMS", "60"))
REPEATS = int(os.environ.get("PROCTOR_BENCH_REPEATS", "1"))


def test_runner_cpu_per_attempt(tmp_path: Path) -> None:
    with sim_servers(tmp_path) as start:
        url = start([system("sim-flash", 1.0), system("sim-glm", 0.5)])
        folder = prereg(tmp_path, items=ITEMS, repeats=REPEATS, caps=(1e3, 1e3), overall=3e3)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        display = ProgressDisplay(io.StringIO(), tty=False)
        summary = run_stage(folder, "A", tmp_path / "results", base_urls=urls(url), progress=display)
        display.close()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        assert summary.exit_code == 0, summary.to_json()
        stage = Path(summary.folder)
        attempts = (stage / "attempts.jsonl").read_bytes().count(b"\n")
        plan = read_plan(stage / "plan.jsonl")
        _, peer = bare_client(url, [request.body for request in plan.requests])
    per = cpu / attempts * 1000
    peer_per = peer / len(plan.requests) * 1000
    print(f"\n[runner cpu] {attempts} attempts ({ITEMS} items x 2 systems x {REPEATS} repeats), wall {wall:.2f} s")
    print(f"  proctor run_stage, whole stage:     {per:6.2f} ms CPU per attempt (target <= 1.5 ms beyond the call and the check)")
    print(f"  peer: bare httpx post + json parse: {peer_per:6.2f} ms CPU per request")
    print(f"  ratio proctor/peer: {per / peer_per:.1f}x")
    env = "" if (ITEMS, REPEATS) == (60, 1) else f"PROCTOR_BENCH_ITEMS={ITEMS} PROCTOR_BENCH_REPEATS={REPEATS}"
    record("runner_cpu", [Row(
        f"a whole stage's own CPU per attempt ({attempts} attempts, simulator at zero latency, verifier in its own "
        "process, the progress display)", f"`run_stage`: {per:.2f} ms (target <= 1.5 ms beyond the call and the check)",
        "bare httpx post + JSON parse of the same bodies", f"{peer_per:.2f} ms",
        f"{per / peer_per:.1f}x the bare client", bench_command("tests/bench/bench_runner_cpu.py", env=env))])
    assert per < 50  # a loose floor against a gross regression, not a timing assertion
