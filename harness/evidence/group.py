"""Group commit of chained logs: lines staged in memory, one writer thread, one write and one fsync per
log per flush.

The manual: docs/evidence.md (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness.errors import Code, LogRefusal, Refusal
from harness.evidence.chain import ChainedLog, _write_all
from harness.evidence.chain_read import PathArg, check_form, seed_hash
from harness.evidence.fsutil import fsync_dir
from harness.evidence.jsonio import (
    MAX_DEPTH,
    canonical_bytes,
    open_regular,
    sha256_hex,
)

__all__ = ["GroupLog", "GroupWriter"]

_IN_FLIGHT = 8
"""Most fsyncs of one log left in flight at once (each started after its group's write, so each
covers every group written before it); concurrent fsyncs overlap in the kernel and the disk."""


@dataclass
class _FileOp:
    """A whole file written (not yet fsynced) under a temporary name, renamed into place by the flush."""

    fd: int
    tmp: str
    target: str


@dataclass
class _Segment:
    """Staged work flushed together: files first, then each log's lines in the logs' order."""

    files: list[_FileOp] = field(default_factory=list)
    lines: dict[int, list[bytes]] = field(default_factory=dict)
    last: int = 0


class GroupLog:
    """One chained log written through a `GroupWriter` (the only writer of the file while it runs).

    `stage` returns the records as they will be written (`prev`, and `seed` on the first line);
    they are durable once the writer's ticket for them is (`GroupWriter.wait`, `GroupWriter.settle`).
    """

    def __init__(self, writer: GroupWriter, index: int, path: PathArg, seed: str) -> None:
        self._writer = writer
        self._index = index
        self._chain = ChainedLog(path, seed)  # refuses a bad seed; reads the tail as every writer does
        self.path = self._chain.path
        self.seed = seed
        self._opened = False
        self._fd: int | None = None
        self._head: str | None = None  # the staged head (in memory)
        self._size = 0  # bytes on disk after the last flush
        self._appended = 0
        self._appended_head: str | None = None
        self._appended_line = b""
        self.ticket = 0
        """The ticket of this log's last stage (`GroupWriter.wait(log.ticket)`)."""

    @property
    def appended(self) -> int:
        """Lines staged through this writer (in memory)."""
        return self._appended

    @property
    def appended_head(self) -> str | None:
        """The sha256 of the last line staged, or None before the first."""
        return self._appended_head

    @property
    def appended_line(self) -> bytes:
        """The canonical bytes (no newline) of the last line staged, b"" before the first: its sha256 is
        `appended_head` (a caller that needs a line's bytes or hash never encodes it again)."""
        return self._appended_line

    def stage(self, record: Mapping[str, Any], *, barrier: bool = False) -> dict[str, Any]:
        """Stage one record; returns it as it will be written. `barrier`: later stages flush after it."""
        return self._writer._stage(self, [record], barrier)[0]

    def stage_many(self, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Stage records in order (all checked before any is staged); returns them as they will be written."""
        return self._writer._stage(self, list(records), False)

    # ---- called by the writer under its lock

    def _open(self) -> None:
        """Read the tail of an existing log (torn tail, seed and form refused as `ChainedLog` does)."""
        try:
            fd = open_regular(self.path, os.O_RDWR | os.O_APPEND)
        except Refusal as exc:
            if exc.code != Code.FILE_MISSING:
                raise
            self._opened = True  # created by the first flush
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            head = self._chain._head(fd, st)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._size, self._head = fd, st.st_size, head
        self._opened = True

    def _lines(self, records: list[Mapping[str, Any]]) -> tuple[list[bytes], list[dict[str, Any]]]:
        bodies = [self._chain._prepare(r) for r in records]
        head = self._head
        lines: list[bytes] = []
        out: list[dict[str, Any]] = []
        for body in bodies:
            if head is None:
                body["seed"] = self.seed
                body["prev"] = seed_hash(self.seed)
            else:
                body["prev"] = head
            try:
                raw = canonical_bytes(body)
            except Refusal as exc:
                raise LogRefusal(Code.LOG_RECORD_INVALID, f"not writable as JSON: {exc.message}", self.path,
                                 cause=exc.code) from None
            except (TypeError, ValueError) as exc:
                raise LogRefusal(Code.LOG_RECORD_INVALID, f"not writable as JSON: {exc}", self.path) from None
            if not _plain(body, 1):  # a key that is not a string, or deep nesting: read it back to be sure
                checked = check_form(raw)
                if checked.obj is None:
                    raise LogRefusal(Code.LOG_RECORD_INVALID, f"would not read back intact: {checked.message}",
                                     self.path)
            lines.append(raw)
            out.append(body)
            head = sha256_hex(raw)
        self._head = head
        self._appended += len(lines)
        self._appended_head = head
        if lines:
            self._appended_line = lines[-1]
        return lines, out

    def _write(self, lines: list[bytes]) -> None:
        """Append `lines` with one write (under the log's `flock`), refusing a file another writer changed."""
        created = False
        if self._fd is None:
            self._fd, created = self._chain._open_for_write(append=True)
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = os.fstat(fd)
            if st.st_size != self._size:
                raise LogRefusal(Code.LOG_CHANGED, f"another writer changed the log between flushes (its size "
                                 f"is {st.st_size}, this writer's {self._size})", self.path)
            data = b"\n".join(lines) + b"\n"
            _write_all(fd, data, self.path)
            self._size += len(data)
            if created:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _sync(self, fsync: Callable[[int], None]) -> None:
        """One fsync of everything written so far."""
        assert self._fd is not None
        try:
            fsync(self._fd)
        except OSError as exc:
            raise LogRefusal(Code.LOG_WRITE_FAILED, f"fsync failed: {exc.strerror or exc}", self.path) from None

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class GroupWriter:
    """Group commit for a set of chained logs (and the files their lines name).

    Records are staged under one lock (the chain head kept in memory); a single writer
    thread takes everything staged while the previous flush was on the disk and writes
    it: files first (fsync, rename, fsync of their folders), then each log's pending
    lines in the order the logs were opened, each with one write and one fsync. A ticket
    (a number, rising with every stage) is durable once every flush up to it is done. A
    failed flush fails every waiter, now and later, with the same refusal
    (`log_write_failed`, or `log_changed` when another writer appended). The manual:
    docs/evidence.md.
    """

    def __init__(self, *, fsync: Callable[[int], None] = os.fsync, name: str = "proctor-group") -> None:
        self._fsync = fsync
        self._name = name
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # waiters: a flush ended
        self._work = threading.Condition(lock)  # the writer thread: something was staged
        self._logs: list[GroupLog] = []
        self._pending: list[_Segment] = []
        self._open: _Segment | None = None  # the segment stages join (None after a barrier or a take)
        self._staged = 0
        self._durable = 0
        self._error: Refusal | None = None
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._files = 0
        self._syncer: ThreadPoolExecutor | None = None  # fsyncs of a group's last log left in flight
        self._inflight: deque[tuple[int, Future[None]]] = deque()  # oldest first, all of one log
        self._kick: asyncio.AbstractEventLoop | None = None  # a loop whose wake-up of the writer is scheduled
        self._woken = False  # the writer may take what is staged (set by every wake-up, cleared by a take)
        self.flushes = 0
        """Flushes done (each: one fsync per log with lines, per file and per folder of files)."""

    # ---- staging

    def log(self, path: PathArg, seed: str) -> GroupLog:
        """Open (lazily) the chained log at `path`; logs flush in the order they were opened."""
        with self._cond:
            out = GroupLog(self, len(self._logs), path, seed)
            self._logs.append(out)
            return out

    def _segment_locked(self) -> _Segment:
        self._check_locked()
        if self._open is None:
            self._open = _Segment()
            self._pending.append(self._open)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return self._open

    def _check_locked(self) -> None:
        if self._error is not None:
            raise self._refusal()
        if self._closed:
            raise LogRefusal(Code.LOG_WRITE_FAILED, "the group writer is closed")

    def _stage(self, log: GroupLog, records: list[Mapping[str, Any]], barrier: bool) -> list[dict[str, Any]]:
        if not records:
            return []
        with self._cond:
            self._check_locked()
            if not log._opened:
                log._open()
            lines, out = log._lines(records)
            segment = self._segment_locked()
            segment.lines.setdefault(log._index, []).extend(lines)
            self._staged += 1
            segment.last = log.ticket = self._staged
            if barrier:
                self._open = None
            self._notify_locked()
            return out

    def stage_file(self, path: PathArg, data: bytes, *, mode: int = 0o600) -> int:
        """Write `data` to a temporary file now and stage its rename to `path` (made durable, as
        `atomic_write` makes it, before any line staged after it); returns its ticket."""
        target = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(target))
        with self._cond:
            self._check_locked()
            self._files += 1
            n = self._files
        tmp = os.path.join(folder, f".{os.path.basename(target)}.g{n}.tmp-{os.getpid()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:  # a leftover of an earlier process with this pid: removed (no unlink per file)
            os.unlink(tmp)
            fd = os.open(tmp, flags, mode)
        try:
            _write_all(fd, data, tmp)
            with self._cond:
                segment = self._segment_locked()
                segment.files.append(_FileOp(fd, tmp, target))
                self._staged += 1
                segment.last = self._staged
                self._notify_locked()
                return self._staged
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise

    def _notify_locked(self) -> None:
        """Wake the writer thread for what was just staged: at once from a thread without a running event
        loop; from a loop's thread, once at the end of the loop's current iteration, so that every stage of
        one iteration (all the lanes it resumed) is one flush (docs/evidence.md, group commit)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._wake_locked()
            return
        if self._kick is loop:
            return  # this iteration's wake-up is already scheduled
        if self._kick is not None:  # another loop's is pending: no deferral shared across loops
            self._wake_locked()
            return
        self._kick = loop
        loop.call_soon(self._kicked)

    def _kicked(self) -> None:
        """The end of a loop iteration that staged: wake the writer for all of it."""
        with self._cond:
            self._kick = None
            self._wake_locked()

    def _wake_locked(self) -> None:
        self._woken = True
        self._work.notify()

    @property
    def staged(self) -> int:
        """The ticket of the last stage: waiting for it waits for everything staged so far."""
        with self._cond:
            return self._staged

    @property
    def durable(self) -> int:
        """The last ticket known durable."""
        with self._cond:
            return self._durable

    # ---- waiting

    def _refusal(self) -> Refusal:
        err = self._error
        assert err is not None
        return LogRefusal(err.code, err.message, err.path, **err.details)

    def wait(self, ticket: int | None = None) -> None:
        """Block until `ticket` (default: everything staged so far) is durable; a failed flush is raised."""
        with self._cond:
            want = self._staged if ticket is None else ticket
            if self._kick is not None and self._durable < want:  # a deferred wake-up: blocking here, do it now
                self._wake_locked()
            while self._durable < want:
                if self._error is not None:
                    raise self._refusal()
                self._cond.wait()


    async def settle(self, ticket: int | None = None) -> None:
        """`wait` for an event loop: awaits `ticket` (default: everything staged so far)."""
        loop = asyncio.get_running_loop()
        with self._cond:
            want = self._staged if ticket is None else ticket
            if self._durable >= want:
                return
            if self._error is not None:
                raise self._refusal()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((want, loop, future))
        await future

    # ---- the writer thread

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            for _, future in self._inflight:  # each one's own completion publishes it (or its failure)
                with contextlib.suppress(Exception):
                    future.result()
            if self._syncer is not None:
                self._syncer.shutdown(wait=True)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._pending and self._woken) and not self._closed:
                    self._work.wait()
                if not self._pending:
                    return
                batch, self._pending, self._open, self._woken = self._pending, [], None, False
            try:
                for segment in batch:
                    self._flush(segment)
            except Refusal as exc:
                self._fail(exc if exc.code in (Code.LOG_WRITE_FAILED, Code.LOG_CHANGED) else LogRefusal(
                    Code.LOG_WRITE_FAILED, f"{exc.code}: {exc.message}", exc.path))
                return
            except OSError as exc:
                self._fail(LogRefusal(Code.LOG_WRITE_FAILED, f"flush failed: {exc.strerror or exc}", exc.filename))
                return
            finally:
                with self._cond:
                    self.flushes += 1

    def _publish(self, last: int) -> None:
        """Tickets up to `last` are durable."""
        with self._cond:
            if self._error is not None or last <= self._durable:
                return
            self._durable = last
            self._cond.notify_all()
            done = [w for w in self._waiters if w[0] <= last]
            if done:
                self._waiters = [w for w in self._waiters if w[0] > last]
        _wake(done, None)

    def _fail(self, error: Refusal) -> None:
        """A failed flush: every waiter past the durable tickets, and every later stage, is refused."""
        with self._cond:
            if self._error is not None:
                return
            self._error = error
            for segment in self._pending:  # staged during the failed flush: never written
                for op in segment.files:
                    self._discard(op)
            self._pending, self._open = [], None
            self._cond.notify_all()
            self._work.notify()
            done, self._waiters = self._waiters, []
        _wake(done, self._refusal)

    def _synced(self, log: GroupLog, last: int) -> None:
        """The deferred fsync of a group's last log (on the syncer thread)."""
        try:
            log._sync(self._fsync)
        except Refusal as exc:
            self._fail(exc)
            raise
        self._publish(last)

    def _settle_inflight(self, keep: int) -> None:
        """Wait for the oldest fsyncs in flight until at most `keep` are (and drop those done)."""
        while self._inflight and (len(self._inflight) > keep or self._inflight[0][1].done()):
            _, future = self._inflight.popleft()
            future.result()  # a failure was published by `_synced`: raised here, ends the writer

    def _flush(self, segment: _Segment) -> None:
        """Write one group. Its last log's fsync may be left in flight (on a syncer thread) while the
        next groups write that same log: up to `_IN_FLIGHT` fsyncs in flight, each covering every
        group written before it started. A group that writes files, or another log first, waits for
        them all: its own publication must not overtake an fsync of another log."""
        order = sorted(segment.lines)
        if self._inflight and (segment.files or not order or order[0] != self._inflight[0][0]):
            self._settle_inflight(0)
        self._settle_inflight(_IN_FLIGHT)
        folders: list[str] = []
        try:
            while segment.files:
                op = segment.files[0]
                try:
                    self._fsync(op.fd)
                except OSError as exc:
                    raise LogRefusal(Code.LOG_WRITE_FAILED, f"fsync failed: {exc.strerror or exc}", op.target) from None
                os.close(op.fd)
                segment.files.pop(0)
                os.replace(op.tmp, op.target)
                folder = os.path.dirname(os.path.abspath(op.target))
                if folder not in folders:
                    folders.append(folder)
        finally:
            for op in segment.files:
                self._discard(op)
        for folder in folders:
            fsync_dir(folder)
        for n, index in enumerate(order):
            log = self._logs[index]
            log._write(segment.lines[index])
            if n == len(order) - 1 and (not self._inflight or self._inflight[0][0] == index):
                self._settle_inflight(_IN_FLIGHT - 1)
                if self._syncer is None:
                    self._syncer = ThreadPoolExecutor(_IN_FLIGHT, thread_name_prefix=f"{self._name}-fsync")
                self._inflight.append((index, self._syncer.submit(self._synced, log, segment.last)))
                return
            log._sync(self._fsync)
        self._publish(segment.last)

    @staticmethod
    def _discard(op: _FileOp) -> None:
        with contextlib.suppress(OSError):
            os.close(op.fd)
        with contextlib.suppress(OSError):
            os.unlink(op.tmp)

    def close(self) -> None:
        """Flush what is staged, stop the thread and close the files; a failed flush is raised."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._work.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        for log in self._logs:
            log._close()
        with self._cond:
            if self._error is not None:
                raise self._refusal()

    def __enter__(self) -> GroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any, depth: int) -> bool:
    """Whether `value` has only string keys and nests at most `MAX_DEPTH` deep (then its canonical
    bytes read back as they are: the encoder's output needs no re-parse)."""
    kind = type(value)
    if kind is dict and depth <= MAX_DEPTH:  # the common case: no isinstance per key and per atom
        atoms = _ATOMS
        for k, v in value.items():
            if type(k) is not str and not isinstance(k, str):
                return False
            if type(v) not in atoms and not _plain(v, depth + 1):
                return False
        return True
    if (kind is list or kind is tuple) and depth <= MAX_DEPTH:
        return all(type(v) in _ATOMS or _plain(v, depth + 1) for v in value)
    if kind in _ATOMS:
        return True
    if isinstance(value, dict):
        if depth > MAX_DEPTH:
            return False
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        if depth > MAX_DEPTH:
            return False
        return all(_plain(v, depth + 1) for v in value)
    return True


def _wake(done: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]],
          error: Callable[[], Refusal] | None) -> None:
    """Settle the waiters' futures: one wake-up per event loop (its self-pipe written once), not one per waiter."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for _, loop, future in done:
        by_loop.setdefault(loop, []).append(future)
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there any more
            loop.call_soon_threadsafe(_settle_futures, futures, error)


def _settle_futures(futures: list[asyncio.Future[None]], error: Callable[[], Refusal] | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error())  # each waiter its own refusal
