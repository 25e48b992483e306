"""Shared fixtures: real git workspaces made from the bundled tasks, the real CLI in a subprocess, and
a real simulator (`proctor sim serve`) over HTTP on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI replays the same examples every run (a red CI must be reproducible); a developer's run explores.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "evals" / "tasks"
WORKER = TASKS / "scripted_worker.py"


@dataclass
class CliResult:
    """One `proctor ... --json` run: exit code, the single JSON object, stderr."""

    code: int
    out: dict[str, Any]
    stderr: str
    stdout: str


def run_proctor(*words: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    """Run the real CLI with --json (placed before any `--command`), parse its one JSON object."""
    items = list(words)
    cut = items.index("--command") if "--command" in items else len(items)
    argv = [sys.executable, "-m", "harness", *items[:cut], "--json", *items[cut:]]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    full_env.update(env or {})
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be exactly one JSON object, got: {done.stdout!r} / {done.stderr!r}"
    return CliResult(done.returncode, json.loads(lines[0]), done.stderr, done.stdout)


def git_repo(path: Path) -> Path:
    """Make `path` a git repository with everything in it committed."""
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "given"], check=True)
    return path


@dataclass
class TaskSetup:
    """A bundled task copied to a temp folder: its task file, hidden files and a git workspace."""

    root: Path
    task: Path
    workspace: Path

    def words(self) -> list[str]:
        return ["--workspace", str(self.workspace), "--task", str(self.task)]

    def edit_task(self, change: Callable[[dict[str, Any]], None]) -> None:
        doc = json.loads(self.task.read_text())
        change(doc)
        self.task.write_text(json.dumps(doc, indent=2))

    def worker(self, *extra: str) -> list[str]:
        """The scripted worker's argv (it fixes the task)."""
        return [sys.executable, str(WORKER), "--task-dir", str(self.root / "task"), *extra]


@pytest.fixture
def task_setup(tmp_path: Path) -> Callable[..., TaskSetup]:
    """Copy a bundled task (task.json, hidden/, fix/) and make its workspace a git repository."""

    def make(name: str = "wordfreq") -> TaskSetup:
        task_dir = tmp_path / "task"
        shutil.copytree(TASKS / name, task_dir, ignore=shutil.ignore_patterns("workspace", "__pycache__"))
        ws = tmp_path / "ws"
        shutil.copytree(TASKS / name / "workspace", ws, ignore=shutil.ignore_patterns("__pycache__"))
        git_repo(ws)
        return TaskSetup(root=tmp_path, task=task_dir / "task.json", workspace=ws)

    return make


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


def alive_with(token: str) -> list[int]:
    """Live (non-zombie) processes on the host whose command line holds `token`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and stat[stat.rfind(b")") + 2 :].split()[0] != b"Z":
            found.append(int(name))
    return found
