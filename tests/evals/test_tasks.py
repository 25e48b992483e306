"""The bundled demo tasks under evals/tasks: each bug is real and each fix works.

For every task folder: task.json is a strict JSON object of the documented
shape; in a copy of the workspace the verifier fails (with and without the
hidden tests) and, after the scripted worker runs, passes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import TASKS

TASKS_DIR = TASKS
WORKER = TASKS_DIR / "scripted_worker.py"
TASK_DIRS = sorted(p.parent for p in TASKS_DIR.glob("*/task.json"))
FEATURES = {
    "localized",
    "bounded",
    "known_location",
    "objective_acceptance",
    "multi_module",
    "unfamiliar_repo",
    "substantial_refactor",
    "open_ended",
    "research_engineering",
    "marathon",
}
FORBIDDEN_IN_WORKSPACE = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini")
BUDGET_KEYS = {"max_dispatches", "max_stagnant", "timeout_s", "verify_timeout_s"}
RUN_TIMEOUT_S = 60


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise ValueError(f"duplicate keys: {sorted(dupes)}")
    return dict(pairs)


def _reject_constant(name: str) -> object:
    raise ValueError(f"non-finite number {name}")


def load_task(task_dir: Path) -> dict[str, Any]:
    raw = (task_dir / "task.json").read_bytes()
    task = json.loads(
        raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
    )
    assert isinstance(task, dict)
    return task


def make_copy(task_dir: Path, dest: Path, *, hidden: bool) -> Path:
    task = load_task(task_dir)
    work = dest / "ws"
    shutil.copytree(
        task_dir / "workspace", work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    if hidden:
        for entry in task["verifier"]["hidden"]:
            target = work / entry["to"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(task_dir / entry["from"], target)
    return work


def run_verifier(
    task: dict[str, Any], work: Path, *, only: str | None = None, plugins: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the task's verifier argv in ``work``; ``only`` narrows it to one test file.

    Installed pytest plugins (hypothesis, xdist, ...) cost about half a second of
    start-up per run and the tasks use none, so most runs skip them; the final
    check of each task runs the argv with them, as proctor would.
    """
    argv = [sys.executable if a == "{python}" else a for a in task["verifier"]["argv"]]
    if only is not None:
        argv = [only if a == "tests" else a for a in argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if not plugins:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        argv, cwd=work, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def run_worker(task: dict[str, Any], work: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    prompt_file = work.parent / "prompt.txt"
    prompt_file.write_text(task["prompt"], encoding="utf-8")
    env = dict(os.environ)
    env.update(
        PROCTOR_TASK_ID=task["task_id"],
        PROCTOR_PROMPT_FILE=str(prompt_file),
        PROCTOR_HEARTBEAT=str(work.parent / "heartbeat.json"),
    )
    return subprocess.run(
        [sys.executable, str(WORKER), *extra],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def test_there_are_four_tasks_with_unique_ids() -> None:
    ids = [load_task(d)["task_id"] for d in TASK_DIRS]
    assert len(ids) == 4
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda p: p.name)
def test_task_file_shape(task_dir: Path) -> None:
    task = load_task(task_dir)
    assert set(task) == {"task_id", "prompt", "features", "scope", "verifier", "budget"}
    assert isinstance(task["task_id"], str) and task["task_id"]
    assert isinstance(task["prompt"], str) and len(task["prompt"]) > 80
    assert task["features"] and set(task["features"]) <= FEATURES
    assert len(set(task["features"])) == len(task["features"])

    workspace = task_dir / "workspace"
    assert task["scope"]
    for rel in task["scope"]:
        assert (workspace / rel).is_file(), rel
        assert (task_dir / "fix" / rel).is_file(), rel
    fixed = {p.relative_to(task_dir / "fix").as_posix() for p in (task_dir / "fix").rglob("*.py")}
    assert fixed == set(task["scope"])

    verifier = task["verifier"]
    assert set(verifier) == {"argv", "seal", "hidden"}
    assert verifier["argv"][0] == "{python}"
    assert all(isinstance(a, str) for a in verifier["argv"])
    assert verifier["seal"] and all((workspace / s).is_file() for s in verifier["seal"])
    for entry in verifier["hidden"]:
        assert set(entry) == {"from", "to"}
        assert (task_dir / entry["from"]).is_file()
        assert not (workspace / entry["to"]).exists(), "hidden tests must not be in the workspace"

    budget = task["budget"]
    assert set(budget) == BUDGET_KEYS
    for key in BUDGET_KEYS:
        assert type(budget[key]) is int and budget[key] > 0, key

    present = {p.name for p in workspace.rglob("*")}
    assert not present & set(FORBIDDEN_IN_WORKSPACE)


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda p: p.name)
def test_verifier_fails_before_and_passes_after_the_fix(task_dir: Path, tmp_path: Path) -> None:
    task = load_task(task_dir)
    work = make_copy(task_dir, tmp_path, hidden=True)
    visible = task["verifier"]["seal"][0]

    before = run_verifier(task, work)
    assert before.returncode == 1, before.stdout + before.stderr
    assert run_verifier(task, work, only=visible).returncode == 1
    hidden_paths = [entry["to"] for entry in task["verifier"]["hidden"]]
    for path in hidden_paths:
        assert run_verifier(task, work, only=path).returncode == 1, path

    worker = run_worker(task, work)
    assert worker.returncode == 0, worker.stderr
    heartbeat = json.loads((tmp_path / "heartbeat.json").read_text(encoding="utf-8"))
    total = len(task["scope"])
    assert heartbeat == {"stage": "done", "files_done": total, "files_total": total}

    assert run_verifier(task, work, only=visible).returncode == 0
    after = run_verifier(task, work, plugins=True)
    assert after.returncode == 0, after.stdout + after.stderr


def test_break_mode_edits_but_still_fails(tmp_path: Path) -> None:
    task_dir = TASK_DIRS[0]
    task = load_task(task_dir)
    work = make_copy(task_dir, tmp_path, hidden=True)
    worker = run_worker(task, work, "--break")
    assert worker.returncode == 0, worker.stderr
    for rel in task["scope"]:
        assert (work / rel).read_bytes() != (task_dir / "workspace" / rel).read_bytes()
    assert run_verifier(task, work).returncode == 1


def test_worker_refuses_unknown_task_and_wrong_directory(tmp_path: Path) -> None:
    task = dict(load_task(TASK_DIRS[0]))
    task["task_id"] = "no-such-task"
    assert run_worker(task, _empty(tmp_path)).returncode == 2
    task = load_task(TASK_DIRS[0])
    assert run_worker(task, _empty(tmp_path)).returncode == 1


def _empty(tmp_path: Path) -> Path:
    work = tmp_path / "empty"
    work.mkdir(exist_ok=True)
    return work
