"""Build the repository-task suite from the gated path's task folders (``evals/tasks/*/task.json``).

The manual: docs/evals.md.
"""

from __future__ import annotations

import os
from typing import Any, Final

from harness.errors import Code, EvalRefusal
from harness.evals.write import write_suite
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.tree import tree_signature
from harness.gate.task import load_task

__all__ = ["build_tasks"]

SUITE_VERSION: Final = 1


def _slash(path: str) -> str:
    return path.replace(os.sep, "/")


def _files(folder: str) -> list[str]:
    found: list[str] = []
    for top, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found.extend(os.path.join(top, n) for n in names if not n.endswith(".pyc"))
    return sorted(found)


def build_tasks(out: str | os.PathLike[str], *, tasks_dir: str | os.PathLike[str] = "evals/tasks") -> dict[str, Any]:
    """Build the task suite into `out` from every ``<tasks_dir>/*/task.json``."""
    folder = os.path.abspath(os.fspath(tasks_dir))
    if not os.path.isdir(folder):
        raise EvalRefusal(Code.SUITE_SOURCE_MISSING, "not a folder of task folders", folder)
    root = os.path.dirname(os.path.dirname(folder))
    names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, "task.json")))
    if not names:
        raise EvalRefusal(Code.SUITE_SOURCE_MISSING, "no <name>/task.json under the folder", folder)
    packet: list[dict[str, Any]] = []
    private: list[dict[str, Any]] = []
    pins: list[list[str]] = []
    for name in names:
        task = load_task(os.path.join(folder, name, "task.json"))
        workspace = os.path.join(task.folder, "workspace")
        if not os.path.isdir(workspace):
            raise EvalRefusal(Code.SUITE_SOURCE_MISSING, "the task has no workspace/ folder", task.folder)
        hidden = []
        for h in task.verifier.hidden:
            source = os.path.join(task.folder, h.source)
            hidden.append({"from": _slash(h.source), "to": h.to, "sha256": sha256_hex(read_bytes(source))})
        fix_dir = os.path.join(task.folder, "fix")
        fix = [
            {"path": _slash(os.path.relpath(p, fix_dir)), "sha256": sha256_hex(read_bytes(p))}
            for p in (_files(fix_dir) if os.path.isdir(fix_dir) else [])
        ]
        task_rel = _slash(os.path.relpath(task.path, root))
        pins.append([task_rel, task.sha256])
        packet.append(
            {
                "item": task.task_id,
                "prompt": task.prompt,
                "workspace": _slash(os.path.relpath(workspace, root)),
                "metadata": {
                    "task_folder": name,
                    "features": list(task.features),
                    "scope": list(task.scope),
                    "workspace_tree": tree_signature(workspace).digest,
                },
            }
        )
        private.append(
            {
                "item": task.task_id,
                "task": task_rel,
                "task_sha256": task.sha256,
                "verifier": {"argv": list(task.verifier.argv), "seal": list(task.verifier.seal)},
                "hidden": hidden,
                "fix": fix,
            }
        )
    return write_suite(
        out,
        suite="tasks",
        kind="repo_task",
        version=SUITE_VERSION,
        source={
            "package": None,
            "version": None,
            "file": _slash(os.path.relpath(folder, root)),
            "sha256": sha256_hex(canonical_bytes(pins)),
        },
        packet=packet,
        private=private,
    )
