"""Build the repository-task suite from the gated path's task folders (``evals/tasks/*/task.json``).

The manual: docs/evals.md.
"""

from __future__ import annotations

import os
from typing import Any, Final

from harness.errors import Code, EvalRefusal, GateRefusal
from harness.evals.suite import Suite, load_suite
from harness.evals.write import write_suite
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.tree import tree_signature
from harness.gate.task import load_task

__all__ = ["build_tasks", "check_snapshot_clean", "check_task_suite"]

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


_BARE: Final = ("HEAD", "objects", "refs")
_UNSEALED: Final = ("__pycache__", ".pytest_cache")


def check_snapshot_clean(snapshot: str, item: str) -> None:
    """Refuse `suite_snapshot_unclean` for a snapshot that is not a plain sealed tree: a bare git
    repository, a git repository (`.git`, a folder or a gitfile, at any depth: its history, config and
    hooks would become the attempt's baseline, whether its tree is clean, dirty or has untracked files),
    or content the tree signature leaves out (`__pycache__`, `.pytest_cache`, `*.pyc`: copied into every
    workspace unsealed). The runner commits the baseline itself (docs/evals.md)."""

    def unclean(what: str, path: str) -> EvalRefusal:
        return EvalRefusal(Code.SUITE_SNAPSHOT_UNCLEAN, f"item {item!r}: the snapshot {what}", path, item=item)

    if all(os.path.lexists(os.path.join(snapshot, name)) for name in _BARE):
        raise unclean("is a bare git repository, not a tree of files", snapshot)
    for here, dirs, files in os.walk(snapshot):
        for name in sorted([*dirs, *files]):
            path = os.path.join(here, name)
            rel = os.path.relpath(path, snapshot)
            if name == ".git":
                raise unclean(f"holds a git repository ({rel}); give the plain tree: the runner makes the "
                              "baseline commit itself", path)
            if name in _UNSEALED or name.endswith(".pyc"):
                raise unclean(f"holds {rel}, which the seal does not cover (caches are left out of the tree "
                              "signature)", path)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]


def check_task_suite(suite_dir: str | os.PathLike[str]) -> int:
    """Check every item of a `repo_task` suite as the runner will use it; the number of items checked.

    Refuses, naming the item: `suite_snapshot_unclean` (`check_snapshot_clean`), `suite_item_changed` (its snapshot folder is missing or not the packet's
    `workspace_tree`, its task file is not the sealed `task_sha256`, or a hidden test is not the sealed
    sha256 or is missing), `hidden_input_inside_workspace` (a hidden test lies in the snapshot, where
    a worker would read it), and the suite's own refusals (`load_suite`). `prereg check` and `freeze`
    call it for a repo_task suite, so a study is refused before its freeze (docs/evals.md).
    """
    folder = os.path.abspath(os.fspath(suite_dir))
    suite = load_suite(folder)
    root = os.path.dirname(os.path.dirname(folder))

    def changed(item: str, what: str, path: str) -> EvalRefusal:
        return EvalRefusal(Code.SUITE_ITEM_CHANGED, f"item {item!r}: {what}", path, item=item)

    for item in suite.packet:
        record = suite.private[item.item].record
        if item.workspace is None and isinstance(record.get("snapshot"), dict):
            _check_snapshot_item(suite, item.item)
            continue
        if item.workspace is None or not isinstance(record.get("task"), str):
            raise changed(item.item, "not a repository task (no workspace or task file)", folder)
        snapshot = os.path.join(root, item.workspace)
        if not os.path.isdir(snapshot) or os.path.islink(snapshot):
            raise changed(item.item, "the snapshot folder is missing", snapshot)
        check_snapshot_clean(snapshot, item.item)
        if tree_signature(snapshot).digest != item.metadata.get("workspace_tree"):
            raise changed(item.item, "the snapshot is not the tree the suite sealed (workspace_tree)", snapshot)
        task = load_task(os.path.join(root, record["task"]))
        if task.sha256 != record.get("task_sha256"):
            raise changed(item.item, "the task file is not the one the suite sealed (task_sha256)", task.path)
        sealed = {h.get("from"): h.get("sha256") for h in record.get("hidden", []) if isinstance(h, dict)}
        inside = os.path.realpath(snapshot) + os.sep
        for h in task.verifier.hidden:
            source = os.path.join(task.folder, h.source)
            if os.path.realpath(source).startswith(inside):
                raise GateRefusal(Code.HIDDEN_INPUT_INSIDE_WORKSPACE, f"item {item.item!r}: a hidden test lies in "
                                  "the snapshot a worker is given", source, item=item.item)
            if not os.path.isfile(source) or sha256_hex(read_bytes(source)) != sealed.get(_slash(h.source)):
                raise changed(item.item, f"hidden test {h.source} is missing or not the one the suite sealed", source)
    return len(suite.packet)


def _check_snapshot_item(suite: Suite, item: str) -> None:
    """A `snapshot` item (the mutant suite): its tree, visible and hidden tests in the private part, sealed."""
    from harness.evals.mutants import mutant_item

    made = mutant_item(suite, item)
    snap = made.record["snapshot"]
    if not os.path.isdir(made.private_path(snap["tree"])):
        raise EvalRefusal(Code.SUITE_ITEM_CHANGED, f"item {item!r}: the snapshot tree is missing",
                          made.private_path(snap["tree"]), item=item)
    check_snapshot_clean(made.private_path(snap["tree"]), item)
    for entry in [snap["visible"], *made.record.get("hidden", [])]:
        path = made.private_path(entry["from"])
        if not os.path.isfile(path) or ("sha256" in entry and sha256_hex(read_bytes(path)) != entry["sha256"]):
            raise EvalRefusal(Code.SUITE_ITEM_CHANGED, f"item {item!r}: {entry['from']} is missing or not the "
                              "one the suite sealed", path, item=item)
