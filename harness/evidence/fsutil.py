"""Durable file writes: temp file, fsync, rename, fsync the folder.

The manual: docs/evidence.md.
"""

from __future__ import annotations

import contextlib
import os
import stat

from harness.errors import Code, GateRefusal

__all__ = ["OUTPUT_CAP", "atomic_write", "cap_output", "ensure_private_dir", "fsync_dir"]

OUTPUT_CAP = 8 << 20
"""The bytes of a worker's or verifier's output that are kept: the head; the rest is cut and the cut recorded."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder so that a created or renamed entry in it survives a crash."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data` so a reader sees the old bytes or the new, never a mix."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    # A temp file left by a crashed process with the same pid must not be reused:
    # it keeps its old mode, and it may be a link or a hard link to another file.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, target)
    fsync_dir(folder)


def ensure_private_dir(path: str | os.PathLike[str]) -> str:
    """Create `path` (and parents) with mode 0700; refuse a non-folder or a link in its place."""
    # Without the trailing slash: lstat("link/") would follow the link.
    target = os.fspath(path).rstrip(os.sep) or os.sep
    try:
        st = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):  # ENOTDIR: a parent is a file, refused below
        parent = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(parent):
            ensure_private_dir(parent)
        try:
            os.mkdir(target, 0o700)
        except FileExistsError:
            pass
        else:
            fsync_dir(parent)
        st = os.lstat(target)
    if not stat.S_ISDIR(st.st_mode):
        raise GateRefusal(Code.STATE_DIR_INVALID, "expected a private folder, found something else", target)
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(target, 0o700)
    return target


def cap_output(path: str | os.PathLike[str], limit: int = OUTPUT_CAP) -> tuple[int, int | None]:
    """Cut the output file at `path` to its first `limit` bytes: (bytes kept, bytes it had if it was cut).

    A run's output is the proctor's own file, but a run may write without bound;
    cutting it (and recording that) keeps every later check from failing on its size.
    """
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size <= limit:
            return size, None
        os.ftruncate(fd, limit)
        return limit, size
    finally:
        os.close(fd)
