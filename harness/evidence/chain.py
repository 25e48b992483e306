"""Chained append-only JSONL logs: the writer (`ChainedLog`: append and repair); `chain_read` reads.

The manual: docs/evidence.md.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, InputRefusal, LogRefusal, Refusal
from harness.evidence.chain_read import (
    REPAIR_HINT,
    RESERVED,
    ChainStatus,
    PathArg,
    check_form,
    check_link,
    read_log,
    refuse_problem,
    scan_fd,
    seed_hash,
    verify_log,
)
from harness.evidence.fsutil import fsync_dir
from harness.evidence.jsonio import canonical_bytes, open_regular, sha256_hex

__all__ = ["ChainedLog"]

_CHUNK: Final = 16 * 1024 * 1024
"""Bytes read per step while counting lines."""
_TAIL_BLOCK: Final = 64 * 1024
"""Bytes read per step while looking backwards for the last line."""


def _write_all(fd: int, data: bytes, path: str) -> None:
    """Append all of `data`, looping on short writes."""
    view = memoryview(data)
    written = 0
    try:
        while written < len(view):
            written += os.write(fd, view[written:])
    except OSError as exc:
        raise LogRefusal(
            Code.LOG_WRITE_FAILED,
            f"append failed after {written} of {len(data)} bytes: {exc.strerror or exc}",
            path,
            written=written,
        ) from None


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], offset + written)


def _pread_exact(fd: int, size: int, offset: int, path: str) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < size:
        part = os.pread(fd, size - got, offset + got)
        if not part:
            raise LogRefusal(Code.LOG_CHANGED, "the log shrank while it was locked", path)
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _count_newlines(fd: int, size: int) -> int:
    count = 0
    offset = 0
    while offset < size:
        data = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not data:
            break
        count += data.count(b"\n")
        offset += len(data)
    return count


# --------------------------------------------------------------------------
# The writer


@dataclass(frozen=True)
class _Tail:
    """What the writer last knew about the end of the file."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    head: str


class ChainedLog:
    """The single writer interface of a chained log at `path` with `seed`.

    Every call takes the exclusive `flock`, so several instances and processes
    may append to one log. The file is created on the first append.
    """

    def __init__(self, path: PathArg, seed: str) -> None:
        if not isinstance(seed, str) or not seed:
            raise LogRefusal(Code.LOG_SEED_INVALID, "a log's seed must be a non-empty string", path)
        self.path = os.fspath(path)
        self.seed = seed
        self._tail: _Tail | None = None
        self._seed_checked: tuple[int, int] | None = None
        self._mutex = threading.Lock()
        self._appended = 0
        self._appended_head: str | None = None

    # ---- opening and the tail

    def _open_for_write(self, *, append: bool) -> tuple[int, bool]:
        """Open the log for writing, creating it only to append; returns (fd, created)."""
        flags = os.O_RDWR | (os.O_APPEND if append else 0)
        while True:
            try:
                return open_regular(self.path, flags), False
            except Refusal as exc:
                if exc.code != Code.FILE_MISSING or not append:
                    raise
            try:
                fd = os.open(
                    self.path,
                    flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o644,
                )
            except FileExistsError:
                continue  # another writer created it first: open theirs
            except FileNotFoundError:
                raise InputRefusal(
                    Code.FOLDER_MISSING, "the log's folder does not exist", self.path
                ) from None
            except PermissionError:
                raise LogRefusal(Code.FILE_UNWRITABLE, "permission denied", self.path) from None
            return fd, True

    def _stat_key(self, st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _refuse_line(
        self, fd: int, size: int, code: Code, lineno: int | None, kind: str, message: str
    ) -> Refusal:
        if lineno is None:
            lineno = _count_newlines(fd, size)  # the last line of a log ending with a newline
        return Refusal(code, f"line {lineno}: {message}", self.path, line=lineno, kind=kind)

    def _head(self, fd: int, st: os.stat_result) -> str | None:
        """The sha256 of the last line, or None for an empty log; refuses a bad tail or seed."""
        tail = self._tail
        if tail is not None and (tail.dev, tail.ino, tail.size, tail.mtime_ns) == self._stat_key(
            st
        ):
            return tail.head
        size = st.st_size
        if size == 0:
            return None
        if _pread_exact(fd, 1, size - 1, self.path) != b"\n":
            lineno = _count_newlines(fd, size) + 1
            raise LogRefusal(
                Code.LOG_TORN_TAIL,
                f"line {lineno} has no newline: a torn tail; before appending, {REPAIR_HINT}",
                self.path,
                line=lineno,
                kind="torn_tail",
            )
        start = self._last_line_start(fd, size)
        last = _pread_exact(fd, size - 1 - start, start, self.path)
        checked = check_form(last)
        if checked.obj is None:
            raise self._refuse_line(
                fd, size, Code.LOG_BROKEN, 1 if start == 0 else None, checked.kind, checked.message
            )
        prev = checked.obj.get("prev")
        if not isinstance(prev, str) or len(prev) != 64:
            raise self._refuse_line(
                fd, size, Code.LOG_BROKEN, 1 if start == 0 else None, "missing_prev", "no prev hash"
            )
        if self._seed_checked != (st.st_dev, st.st_ino):
            self._check_first_line(fd, size, last if start == 0 else None)
            self._seed_checked = (st.st_dev, st.st_ino)
        return sha256_hex(last)

    def _last_line_start(self, fd: int, size: int) -> int:
        """Offset of the last line of a log ending with a newline at `size - 1`."""
        end = size - 1
        block = _TAIL_BLOCK
        while end > 0:
            begin = max(0, end - block)
            data = _pread_exact(fd, end - begin, begin, self.path)
            found = data.rfind(b"\n")
            if found >= 0:
                return begin + found + 1
            end = begin
            block = min(block * 2, _CHUNK)
        return 0

    def _check_first_line(self, fd: int, size: int, first: bytes | None) -> None:
        if first is None:
            offset = 0
            parts: list[bytes] = []
            while True:
                data = _pread_exact(fd, min(_TAIL_BLOCK, size - offset), offset, self.path)
                found = data.find(b"\n")
                if found >= 0:
                    parts.append(data[:found])
                    break
                parts.append(data)
                offset += len(data)
            first = b"".join(parts)
        checked = check_form(first)
        if checked.obj is not None:
            checked = check_link(checked.obj, 1, None, None)
        if checked.obj is None:
            raise LogRefusal(
                Code.LOG_BROKEN, f"line 1: {checked.message}", self.path, line=1, kind=checked.kind
            )
        if checked.obj["seed"] != self.seed:
            raise LogRefusal(
                Code.LOG_SEED_MISMATCH,
                f"the log's seed is {checked.obj['seed']!r}, this writer's is {self.seed!r}",
                self.path,
                line=1,
                kind="seed_mismatch",
            )

    # ---- building lines

    def _prepare(self, record: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(record, Mapping):
            raise LogRefusal(
                Code.LOG_RECORD_INVALID,
                f"a record must be a mapping, not {type(record).__name__}",
                self.path,
            )
        for key in RESERVED:
            if key in record:
                raise LogRefusal(
                    Code.LOG_RECORD_RESERVED,
                    f"a record may not carry {key!r}: the log writes it",
                    self.path,
                )
        return dict(record)

    def _line(self, body: dict[str, Any], head: str | None) -> tuple[bytes, dict[str, Any]]:
        full = dict(body)
        if head is None:
            full["seed"] = self.seed
            full["prev"] = seed_hash(self.seed)
        else:
            full["prev"] = head
        try:
            raw = canonical_bytes(full)
        except Refusal as exc:
            raise LogRefusal(
                Code.LOG_RECORD_INVALID,
                f"not writable as JSON: {exc.message}",
                self.path,
                cause=exc.code,
            ) from None
        except (TypeError, ValueError) as exc:
            raise LogRefusal(Code.LOG_RECORD_INVALID, f"not writable as JSON: {exc}", self.path) from None
        checked = check_form(raw)
        if checked.obj is None:
            raise LogRefusal(
                Code.LOG_RECORD_INVALID, f"would not read back intact: {checked.message}", self.path
            )
        return raw, checked.obj

    # ---- public

    @property
    def appended(self) -> int:
        """Lines this writer appended (in memory: what it wrote, whatever the file now says)."""
        return self._appended

    @property
    def appended_head(self) -> str | None:
        """The sha256 of the last line this writer appended, or None before its first append."""
        return self._appended_head

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Append one record; returns it as written (with `prev`, and `seed` on the first line)."""
        return self.append_many([record])[0]

    def append_many(self, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Append records under one lock with one write and one fsync; returns them as written.

        All records are checked before anything is written. A crash during the
        write can keep a prefix of the batch's whole lines plus a torn tail.
        """
        bodies = [self._prepare(r) for r in records]
        if not bodies:
            return []
        with self._mutex:
            fd, created = self._open_for_write(append=True)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                head = self._head(fd, st)
                lines: list[bytes] = []
                written: list[dict[str, Any]] = []
                for body in bodies:
                    raw, obj = self._line(body, head)
                    lines.append(raw)
                    written.append(obj)
                    head = sha256_hex(raw)
                assert head is not None
                data = b"\n".join(lines) + b"\n"
                self._tail = None
                _write_all(fd, data, self.path)
                self._appended += len(lines)
                self._appended_head = head
                os.fsync(fd)
                if created:
                    fsync_dir(os.path.dirname(os.path.abspath(self.path)))
                after = os.fstat(fd)
                if after.st_size == st.st_size + len(data):
                    self._tail = _Tail(
                        after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns, head
                    )
                return written
            finally:
                os.close(fd)

    def status(self) -> ChainStatus:
        """Verify the whole log (an absent log is an empty, intact one for its writer)."""
        if not os.path.lexists(self.path):
            return ChainStatus(self.path, 0, seed_hash(self.seed), self.seed, None)
        return verify_log(self.path, self.seed)

    def records(self) -> list[dict[str, Any]]:
        """All records of the intact log (none when it does not exist yet)."""
        if not os.path.lexists(self.path):
            return []
        return read_log(self.path, self.seed)

    def repair(self) -> dict[str, Any]:
        """Move a torn tail to a quarantine file and record that; a no-op report when intact.

        Refuses (`log_broken`) when the log has any problem other than a torn
        tail: those need a person, not a repair.
        """
        with self._mutex:
            if not os.path.lexists(self.path):
                return {
                    "path": self.path,
                    "repaired": False,
                    "lines": 0,
                    "head": seed_hash(self.seed),
                }
            fd, _ = self._open_for_write(append=False)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                scan = scan_fd(fd, self.path, self.seed, keep=False)
                status = scan.status()
                problem = scan.problem
                if problem is None:
                    return {
                        "path": self.path,
                        "repaired": False,
                        "lines": status.lines,
                        "head": status.head,
                    }
                if problem.kind != "torn_tail":
                    raise refuse_problem(self.path, problem)
                size = os.fstat(fd).st_size
                torn = _pread_exact(fd, size - scan.intact_bytes, scan.intact_bytes, self.path)
                quarantine = self._quarantine(torn)
                record = {
                    "event": "log_repair",
                    "quarantine": os.path.basename(quarantine),
                    "torn_bytes": len(torn),
                    "torn_sha256": sha256_hex(torn),
                    "line": problem.line,
                }
                raw, obj = self._line(record, scan.head)
                self._tail = None
                line = raw + b"\n"
                # Overwrite the torn bytes in place, then cut any left over: a crash
                # in between leaves a torn tail again, never a silent loss.
                _pwrite_all(fd, line, scan.intact_bytes)
                os.ftruncate(fd, scan.intact_bytes + len(line))
                os.fsync(fd)
                after = os.fstat(fd)
                self._tail = _Tail(
                    after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns, sha256_hex(raw)
                )
                return {
                    "path": self.path,
                    "repaired": True,
                    "lines": problem.line,
                    "head": sha256_hex(raw),
                    "quarantine": quarantine,
                    "torn_bytes": len(torn),
                    "torn_sha256": record["torn_sha256"],
                    "line": problem.line,
                    "record": obj,
                }
            finally:
                os.close(fd)

    def _quarantine(self, torn: bytes) -> str:
        """Write `torn` to a new `<name>.quarantine-<n>` beside the log, durably."""
        folder = os.path.dirname(os.path.abspath(self.path))
        name = os.path.basename(self.path)
        n = 1
        while True:
            target = os.path.join(folder, f"{name}.quarantine-{n}")
            try:
                qfd = os.open(
                    target,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o644,
                )
            except FileExistsError:
                n += 1
                continue
            break
        try:
            _pwrite_all(qfd, torn, 0)
            os.fsync(qfd)
        finally:
            os.close(qfd)
        fsync_dir(folder)
        return target
