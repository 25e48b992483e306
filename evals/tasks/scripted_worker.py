#!/usr/bin/env python3
"""A scripted worker for the bundled demo tasks: it applies a known fix.

A dispatcher runs it with the current directory set to the task workspace and
with these environment variables:

- ``PROCTOR_TASK_ID``: the task id; the task folder is the one beside this
  script whose ``task.json`` has that ``task_id`` (or name it with ``--task-dir``).
- ``PROCTOR_PROMPT_FILE``: a file holding the prompt (optional; only echoed).
- ``PROCTOR_HEARTBEAT``: a path to write progress JSON to (optional), e.g.
  ``{"stage": "editing", "files_done": 1, "files_total": 2}``, replaced atomically.

It copies the task's ``fix/`` files over the workspace files in the task's
scope. With ``--break`` it instead writes an edit that still fails (a marker
comment at the top of each file in scope, added once) so a demo can show a
rejected attempt and escalation.

Stdlib only; it must not import the harness. Exit codes: 0 done, 1 the
workspace does not look like the task's workspace, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

TASKS_DIR = Path(__file__).resolve().parent
BREAK_MARKER = "# scripted worker (--break): an attempted fix that does not fix the bug\n"


class WorkerError(Exception):
    """A problem the worker reports and exits on; ``code`` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def read_task(task_dir: Path) -> dict[str, Any]:
    """Return the parsed ``task.json`` of ``task_dir``."""
    try:
        task = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WorkerError(f"cannot read {task_dir / 'task.json'}: {exc}", 2) from exc
    if not isinstance(task, dict) or not isinstance(task.get("scope"), list):
        raise WorkerError(f"{task_dir / 'task.json'} is not a task object with a scope", 2)
    return task


def find_task_dir(task_id: str) -> Path:
    """Return the folder beside this script whose task.json has ``task_id``."""
    for task_file in sorted(TASKS_DIR.glob("*/task.json")):
        try:
            found = json.loads(task_file.read_text(encoding="utf-8")).get("task_id")
        except (OSError, ValueError, AttributeError):
            continue
        if found == task_id:
            return task_file.parent
    raise WorkerError(f"no task with task_id {task_id!r} under {TASKS_DIR}", 2)


def safe_relative(path: str) -> PurePosixPath:
    """Return ``path`` as a relative path that stays inside the workspace."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise WorkerError(f"scope path {path!r} leaves the workspace", 2)
    return rel


def write_heartbeat(stage: str, done: int, total: int) -> None:
    """Write progress to ``$PROCTOR_HEARTBEAT`` via a temp file and os.replace.

    Progress is advisory: a heartbeat that cannot be written is reported on
    stderr and never stops the work.
    """
    target = os.environ.get("PROCTOR_HEARTBEAT")
    if not target:
        return
    target_path = Path(target)
    body = json.dumps({"stage": stage, "files_done": done, "files_total": total})
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".heartbeat-", dir=target_path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body + "\n")
        os.replace(tmp, target_path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        print(f"scripted_worker: heartbeat not written: {exc}", file=sys.stderr)


def apply(task_dir: Path, workspace: Path, broken: bool) -> list[str]:
    """Edit the workspace files in the task's scope; return the paths written."""
    task = read_task(task_dir)
    scope = [safe_relative(p) for p in task["scope"]]
    for rel in scope:
        if not (workspace / rel).is_file():
            raise WorkerError(f"{rel} is not a file in {workspace}: wrong directory?", 1)
    written = []
    write_heartbeat("starting", 0, len(scope))
    for done, rel in enumerate(scope, start=1):
        dest = workspace / rel
        if broken:
            text = dest.read_text(encoding="utf-8")
            if not text.startswith(BREAK_MARKER):
                dest.write_text(BREAK_MARKER + text, encoding="utf-8")
        else:
            source = task_dir / "fix" / rel
            if not source.is_file():
                raise WorkerError(f"the task has no fixed version of {rel}", 2)
            shutil.copyfile(source, dest)
        written.append(str(rel))
        write_heartbeat("editing", done, len(scope))
    write_heartbeat("done", len(scope), len(scope))
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the worker; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-dir", type=Path, help="the task folder (default: by task id)")
    parser.add_argument(
        "--break",
        dest="broken",
        action="store_true",
        help="write an edit that still fails (for demoing escalation)",
    )
    args = parser.parse_args(argv)
    try:
        if args.task_dir is not None:
            task_dir = args.task_dir.resolve()
        else:
            task_id = os.environ.get("PROCTOR_TASK_ID")
            if not task_id:
                raise WorkerError("set PROCTOR_TASK_ID or pass --task-dir", 2)
            task_dir = find_task_dir(task_id)
        prompt_file = os.environ.get("PROCTOR_PROMPT_FILE")
        if prompt_file:
            try:
                first = Path(prompt_file).read_text(encoding="utf-8").strip().splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise WorkerError(f"cannot read the prompt file {prompt_file}: {exc}", 2) from exc
            print(f"prompt: {first[0] if first else '(empty)'}")
        written = apply(task_dir, Path.cwd(), args.broken)
    except WorkerError as exc:
        print(f"scripted_worker: {exc}", file=sys.stderr)
        return exc.code
    verb = "wrote a still-failing edit to" if args.broken else "applied the fix to"
    print(f"task {task_dir.name}: {verb} {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
