"""The invocation lock: one proctor invocation at a time per state or results folder."""

from __future__ import annotations

import fcntl
import os
from types import TracebackType

from harness.errors import Code, GateRefusal

__all__ = ["InvocationLock", "lock_holder"]


class InvocationLock:
    """A non-blocking exclusive `flock`; a second holder gets `invocation_locked`.

    The kernel drops the lock when the holder dies, so a crash never leaves a
    stale lock behind. The holder's pid is written into the file for people.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:  # a link in its place (ELOOP), a missing folder, no permission
            raise GateRefusal(Code.LOCK_UNAVAILABLE, f"cannot open the lock file: {exc.strerror}", self.path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise GateRefusal(
                Code.INVOCATION_LOCKED,
                f"another proctor invocation holds this lock (pid {holder or 'unknown'})",
                self.path,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> InvocationLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid holding the lock at `path`, or None when it is free; never takes the lock.

    Read from the kernel's `/proc/locks` (matched by device and inode), so
    looking does not make a concurrent invocation fail. Where `/proc/locks`
    cannot be read, the pid written in the file counts while it is alive.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            table = fh.read()
    except OSError:
        return _written_pid_if_alive(path)
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            return int(fields[4])
    return None


def _written_pid_if_alive(path: str | os.PathLike[str]) -> int | None:
    try:
        with open(path, "rb") as fh:
            pid = int(fh.read(64).strip() or 0)
        if pid > 0:
            os.kill(pid, 0)
            return pid
    except (OSError, ValueError):
        pass
    return None
