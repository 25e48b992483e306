"""A real simulator (`proctor sim serve`) over HTTP on loopback for the gated path (the `sim_server` fixture)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO, TASKS


def sim_systems(path: Path, skills: dict[str, float], output_tokens: int = 200) -> Path:
    """A simulator systems file: each named system with `skill`, no latency and `output_tokens` mean."""
    systems = [
        {"name": name, "skill": skill, "latency_s": {"dist": "fixed", "value": 0}, "output_tokens": {"mean": output_tokens}}
        for name, skill in skills.items()
    ]
    path.write_text(json.dumps({"systems": systems}))
    return path


SimServer = Callable[..., str]
"""`sim_server(systems=None, seed=None, tasks=TASKS)`: start a simulator, return its base URL (`.../v1`)."""


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator[SimServer]:
    """Start real simulators (`python -m harness sim serve --port 0 --tasks ... --ready-file F`).

    Each call starts one with `PROCTOR_SIM_LATENCY_SCALE=0`, the bundled
    systems or `systems` (a file), `--seed` when given, and the task folders
    `tasks` (default: the bundled `evals/tasks`, so it answers the gated
    path's `task_id: <id>` prompts with the fix or the unchanged files).
    Returns the base URL to put in `PROCTOR_SIM_URL`. Every simulator gets a
    SIGTERM at teardown.
    """
    procs: list[subprocess.Popen[bytes]] = []

    def start(systems: Path | str | None = None, seed: int | None = None, tasks: Path | str | None = TASKS) -> str:
        ready = tmp_path / f"sim-ready-{len(procs)}.json"
        argv = [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", "--ready-file", str(ready)]
        if tasks is not None:
            argv += ["--tasks", str(tasks)]
        if systems is not None:
            argv += ["--systems", str(systems)]
        if seed is not None:
            argv += ["--seed", str(seed)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
        env["PROCTOR_SIM_LATENCY_SCALE"] = "0"
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the simulator exited {proc.returncode}: {proc.communicate()[1].decode()}")
            assert time.monotonic() < deadline, "the simulator did not get ready in 20 s"
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        return str(info["url"])

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
