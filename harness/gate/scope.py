"""What the worker may change (the task's `scope`), and what the tree signature leaves out.

verify and accept compare the workspace with the baseline tree recorded at
init and refuse `scope_violation` for any entry outside scope that was added,
changed or removed (content, kind, executable bit, link target). Before
either signs or checks the tree, they remove what the signature excludes
(bytecode caches, `.pytest_cache/`) and journal the removal, so nothing the
signature does not cover can change what the accepted workspace runs.

The manual: docs/gated-path.md ("Scope" and "The tree signature").
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Mapping, Sequence

from harness.errors import Code, GateRefusal
from harness.evidence.layout import remove_entry
from harness.evidence.tree import scan_tree_excluded
from harness.evidence.tree_entry import TreeEntry, display_path
from harness.gate.guards import changed_since
from harness.gate.workspace import Gate
from harness.records.journal import PurgeEvent

__all__ = ["check_scope", "in_scope", "out_of_scope_changes", "scan_purged"]


def _ancestors(path: bytes) -> list[bytes]:
    """`path` and every folder above it, itself first."""
    found = [path]
    while b"/" in path:
        path = path.rsplit(b"/", 1)[0]
        found.append(path)
    return found


def _normal(item: str) -> str:
    """A scope entry as a plain relative path: `./a//b/` is `a/b`, `.` the whole workspace."""
    return posixpath.normpath(item)


def in_scope(path: bytes, scope: Sequence[str]) -> bool:
    """True when a scope entry names `path`: the file itself, a folder above it, or an fnmatch glob
    (`*` crosses `/`) matching it or a folder above it."""
    chain = _ancestors(path)
    for item in map(_normal, scope):
        if item == ".":
            return True  # the whole workspace
        pattern = os.fsencode(item)
        if any(ch in item for ch in "*?["):
            if any(fnmatch.fnmatchcase(p, pattern) for p in chain):
                return True
        elif pattern in chain:
            return True
    return False


def _holds_scope(path: bytes, scope: Sequence[str]) -> bool:
    """True when the folder `path` lies above a literal scope entry (made to hold a new in-scope file)."""
    prefix = path + b"/"
    return any(os.fsencode(item).startswith(prefix) for item in map(_normal, scope) if not any(ch in item for ch in "*?["))


def out_of_scope_changes(
    baseline: Mapping[bytes, TreeEntry], current: Mapping[bytes, TreeEntry], scope: Sequence[str]
) -> list[str]:
    """Paths outside `scope` that appeared, vanished or changed (content, kind, mode, link) since init.

    A folder that appeared or vanished is allowed when it is in scope, lies above a literal
    scope entry, or holds (or held) an in-scope entry; an empty new folder elsewhere is not.
    """
    scoped = [p for p in {*baseline, *current} if in_scope(p, scope)]
    found = []
    for path in sorted({*baseline, *current}):
        if not changed_since(baseline, current, path) or in_scope(path, scope):
            continue
        before, after = baseline.get(path), current.get(path)
        kinds = {e.kind for e in (before, after) if e is not None}
        if kinds == {"dir"} and (
            _holds_scope(path, scope) or any(p.startswith(path + b"/") for p in scoped)
        ):
            continue
        found.append(display_path(path))
    return found


def check_scope(
    gate: Gate, baseline: Mapping[bytes, TreeEntry], current: Mapping[bytes, TreeEntry], where: str
) -> None:
    """Refuse `scope_violation` naming every path outside the task's scope that changed since init."""
    outside = out_of_scope_changes(baseline, current, gate.task.scope)
    if outside:
        shown = ", ".join(outside[:20]) + (f" and {len(outside) - 20} more" if len(outside) > 20 else "")
        raise GateRefusal(
            Code.SCOPE_VIOLATION,
            f"changes outside the task's scope ({', '.join(gate.task.scope)}) since init: {shown}",
            where,
            paths=outside,
            scope=list(gate.task.scope),
        )


def scan_purged(gate: Gate, action: str) -> dict[bytes, TreeEntry]:
    """Scan the workspace, removing first what the tree signature excludes (journaled as `purge`).

    A bytecode cache is never evidence: Python would run an unchecked-hash `.pyc`
    in place of the verified source, so none survives a verify or an accept.
    """
    excludes = tuple(gate.pin["excludes"])
    current, excluded = scan_tree_excluded(gate.workspace, excludes)
    if excluded:
        root = os.fsencode(gate.workspace)
        for rel in excluded:
            remove_entry(posixpath.join(root, rel))
        gate.record(PurgeEvent(action=action, paths=tuple(display_path(p) for p in excluded)))
    return current
