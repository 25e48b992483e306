"""Laying tree entries out on disk without ever writing through a link a worker planted.

The manual: docs/evidence.md.
"""

from __future__ import annotations

import os
import shutil
from typing import AnyStr

from harness.errors import Code, GateRefusal
from harness.evidence.tree_entry import TreeEntry

__all__ = ["lay_entry", "real_parents", "remove_entry"]


def remove_entry(path: AnyStr) -> None:
    """Remove whatever stands at `path`: a folder with its contents, a file, a link (never followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def real_parents(root: AnyStr, relative: AnyStr) -> AnyStr:
    """Make every folder above `relative` (a '/'-separated path) a real folder; returns the full path."""
    here = root
    for part in relative.split(b"/" if isinstance(relative, bytes) else "/")[:-1]:
        here = os.path.join(here, part)
        if os.path.islink(here) or (os.path.lexists(here) and not os.path.isdir(here)):
            remove_entry(here)
        if not os.path.lexists(here):
            os.mkdir(here)
    return os.path.join(root, relative)


def lay_entry(target: bytes, entry: TreeEntry, data: bytes | None = None, mode: int | None = None) -> None:
    """Create one non-folder entry at `target` (which must not exist): a file with `data`, a link, a FIFO."""
    if entry.kind == "file":
        if mode is None:
            mode = 0o755 if entry.executable else 0o644
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            view = memoryview(data or b"")
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    elif entry.kind == "link" and entry.target is not None:
        os.symlink(entry.target, target)
    elif entry.kind == "fifo":
        os.mkfifo(target)
    else:
        raise GateRefusal(Code.UNSUPPORTED_SPECIAL_FILE, f"cannot lay out a {entry.kind}", target.decode("utf-8", "backslashreplace"))
