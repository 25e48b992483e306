"""Benchmark: what the bwrap sandbox costs per dispatch and per verify, against the same run unsandboxed.

Three measurements, bwrap and `--sandbox none` alternating in the same run, medians:

1. one sandboxed spawn: `run_group` of `python -c pass` wrapped by `Sandbox.wrap`
   against the same argv unwrapped (the sandbox's own cost, nothing else);
2. `proctor dispatch --command -- python -c pass` through the CLI, whole
   (the CLI's start, the gate, the journal, the state-folder watch, the spawn);
3. `proctor verify` on the wordfreq task (pytest on a fresh copy with the
   hidden tests laid in), whole.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_sandbox.py -s
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.workers.process import run_group
from harness.workers.sandbox import View, resolve_sandbox, sandbox_env
from tests.support.bench import Row, bench_command, record

REPO = Path(__file__).resolve().parents[2]
SPAWNS = 30
DISPATCHES = 10
VERIFIES = 6


def _cli(*words: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", *words], capture_output=True, text=True, env=env,
                          cwd=REPO, check=False)  # fmt: skip
    took = time.perf_counter() - started
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return took


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def test_sandbox_overhead_per_spawn_dispatch_and_verify() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    try:
        # 1. one spawn
        box, none = resolve_sandbox("bwrap"), resolve_sandbox("none")
        argv = [sys.executable, "-c", "pass"]
        spawn: dict[str, list[float]] = {"bwrap": [], "none": []}
        for _ in range(SPAWNS):
            for sandbox in (box, none):
                env = sandbox_env(os.environ, {}, sandboxed=sandbox.kind == "bwrap")
                wrapped = sandbox.wrap(argv, View(cwd=str(tmp), writable=(str(tmp),)), env)
                started = time.perf_counter()
                result = run_group(wrapped.argv, cwd=str(tmp), env=env, timeout_s=60, output_path=str(tmp / "out"),
                                   sandboxed=wrapped.sandboxed)  # fmt: skip
                spawn[sandbox.kind].append(time.perf_counter() - started)
                assert result.exit_code == 0

        # 2./3. the CLI on a real task
        task_dir = tmp / "task"
        shutil.copytree(REPO / "evals" / "tasks" / "wordfreq", task_dir, ignore=shutil.ignore_patterns("workspace"))
        doc = json.loads((task_dir / "task.json").read_text())
        doc["budget"]["max_dispatches"] = 10 * DISPATCHES
        (task_dir / "task.json").write_text(json.dumps(doc))
        ws = tmp / "ws"
        shutil.copytree(REPO / "evals" / "tasks" / "wordfreq" / "workspace", ws)
        git = ["git", "-C", str(ws), "-c", "user.name=b", "-c", "user.email=b@b.invalid"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "given"], check=True)
        words = ["--workspace", str(ws), "--task", str(task_dir / "task.json"), "--json"]
        assert _cli("init", *words) >= 0
        dispatch: dict[str, list[float]] = {"bwrap": [], "none": []}
        verify: dict[str, list[float]] = {"bwrap": [], "none": []}
        for _ in range(DISPATCHES):
            for kind in ("bwrap", "none"):
                dispatch[kind].append(_cli("dispatch", *words, "--sandbox", kind, "--command", "--", *argv))
        for _ in range(VERIFIES):
            for kind in ("bwrap", "none"):
                verify[kind].append(_cli("verify", *words, "--sandbox", kind))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = (("one spawn (run_group)", spawn, SPAWNS), ("proctor dispatch (CLI)", dispatch, DISPATCHES),
            ("proctor verify (CLI, pytest)", verify, VERIFIES))  # fmt: skip
    print(f"\nbwrap {box.version} ({box.binary}), medians, bwrap and none alternating:")
    for name, runs, n in rows:
        b, u = _median_ms(runs["bwrap"]), _median_ms(runs["none"])
        print(f"  {name:30s} bwrap {b:8.1f} ms   none {u:8.1f} ms   overhead {b - u:+7.1f} ms ({b / u:.2f}x)  n={n}")
    (s_b, d_b, v_b), (s_u, d_u, v_u) = ([_median_ms(runs[kind]) for _, runs, _ in rows] for kind in ("bwrap", "none"))
    record("sandbox", [Row(
        "the bwrap sandbox, medians, alternating with `--sandbox none` in the same run",
        f"one `run_group` spawn {s_b:.1f} ms; `proctor dispatch` (CLI, whole) {d_b:.0f} ms; "
        f"`proctor verify` (wordfreq, pytest) {v_b / 1000:.2f} s", "unsandboxed (`--sandbox none`)",
        f"{s_u:.1f} ms; {d_u:.0f} ms; {v_u / 1000:.2f} s",
        f"{s_b - s_u:+.0f} ms per spawn; {d_b - d_u:+.0f} ms per dispatch ({d_b / d_u:.2f}x); "
        f"{(v_b - v_u) / 1000:+.2f} s per verify ({v_b / v_u:.2f}x)", bench_command("tests/bench/bench_sandbox.py"))])
    assert _median_ms(spawn["bwrap"]) - _median_ms(spawn["none"]) < 500, "a sandbox must not cost half a second"
