"""The invocation lock: one proctor invocation at a time per state or results folder."""

from __future__ import annotations

import fcntl
import os
from types import TracebackType

from harness.errors import Refusal

__all__ = ["InvocationLock"]


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
            raise Refusal("lock_unavailable", f"cannot open the lock file: {exc.strerror}", self.path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise Refusal(
                "invocation_locked",
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
