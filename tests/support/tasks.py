"""Real git workspaces made from the bundled tasks (the `task_setup` fixture)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import TASKS, WORKER


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
