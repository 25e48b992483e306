"""Chained append-only JSONL logs (DESIGN.md, "Chained logs").

Each line is one JSON object in canonical form (`canonical_bytes`) carrying
`prev`: the sha256 hex of the previous line's bytes without its newline. The
first line's `prev` is `seed_hash(seed)` and the first line also carries
`"seed"`, so a log names its study and itself and can be verified alone.

Writers take an exclusive `flock` on the log, append whole lines with
`O_APPEND`, and fsync after every append (and the folder when they create the
file). A last line without a newline is a torn tail: readers report it with its
line number, writers refuse to append after it until `ChainedLog.repair` has
moved the torn bytes to a quarantine file and recorded that it did.

Verification is fast on large logs: lines are read in big chunks, hashed with
hashlib, parsed as one JSON array per chunk, and each line is compared with the
canonical encoding of the object parsed from it. Any chunk where that fast path
disagrees is re-checked line by line with the strict reader, which names the
first bad line and its kind.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import hashlib
import json
import json.encoder
import operator
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final

from harness.errors import Code, InputRefusal, LogRefusal, Refusal
from harness.evidence.fsutil import fsync_dir
from harness.evidence.jsonio import MAX_DEPTH, canonical_bytes, file_kind, loads_strict, sha256_hex

__all__ = [
    "PROBLEM_KINDS",
    "ChainProblem",
    "ChainStatus",
    "ChainedLog",
    "read_log",
    "seed_hash",
    "verify_log",
]

PROBLEM_KINDS: Final = (
    "torn_tail",
    "invalid_json",
    "not_canonical",
    "missing_prev",
    "broken_prev",
    "seed_mismatch",
    "not_object",
)
"""Every `ChainProblem.kind`."""

_CHUNK: Final = 16 * 1024 * 1024
"""Bytes read per step while verifying (a longer line is read whole)."""

_TAIL_BLOCK: Final = 64 * 1024
"""Bytes read per step while looking backwards for the last line."""

_LOCK_WAIT_S: Final = 30.0
"""How long a reader waits for a writer's exclusive lock before refusing."""

_RESERVED: Final = ("prev", "seed")

PathArg = str | os.PathLike[str]


def seed_hash(seed: str) -> str:
    """The `prev` of a log's first line: sha256 hex of the UTF-8 seed string."""
    return sha256_hex(seed.encode("utf-8"))


@dataclass(frozen=True)
class ChainProblem:
    """The first thing wrong with a log: 1-based line, kind (see PROBLEM_KINDS), message."""

    line: int
    kind: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """The problem as a JSON-safe object."""
        return {"line": self.line, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class ChainStatus:
    """What verifying a log found.

    `lines` counts the intact lines before any problem; `head` is the sha256
    of the last intact line (the seed hash when there is none, or "" when the
    log is empty and no seed was given).
    """

    path: str
    lines: int
    head: str
    seed: str | None
    problem: ChainProblem | None

    @property
    def ok(self) -> bool:
        """True when the whole log is intact."""
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        """The status as a JSON-safe object."""
        return {
            "path": self.path,
            "ok": self.ok,
            "lines": self.lines,
            "head": self.head,
            "seed": self.seed,
            "problem": None if self.problem is None else self.problem.to_json(),
        }


# --------------------------------------------------------------------------
# Canonical encoding of a parsed line


def _make_encode() -> Callable[[Any], str]:
    """The canonical JSON text of an object, as `canonical_bytes` writes it (as str).

    The C encoder is built once when available (the standard library builds
    it again on every call); a self-check guards against a changed signature.
    """
    enc = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    slow: Callable[[Any], str] = enc.encode
    maker: Any = getattr(json.encoder, "c_make_encoder", None)
    if maker is None:
        return slow
    try:
        c_encode = maker(
            None, enc.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
        )
    except Exception:  # a changed private signature: use the public encoder
        return slow

    def fast(obj: Any) -> str:
        return "".join(c_encode(obj, 0))

    sample = {"b": [1, 2.5, None, True, 'é\u2028"\\\n', "\ud800"], "a": {"z": -0.0, "y": 10**30}}
    try:
        if fast(sample) != slow(sample):
            return slow
    except Exception:
        return slow
    try:
        fast({"x": float("nan")})
    except ValueError:  # allow_nan=False is honoured, as canonical_bytes requires
        return fast
    except Exception:
        return slow
    return slow


_encode: Final = _make_encode()


# --------------------------------------------------------------------------
# Checking one line


@dataclass
class _Line:
    """One line checked on its own: the object, or the problem with it."""

    obj: dict[str, Any] | None
    kind: str = ""
    message: str = ""


def _check_form(raw: bytes) -> _Line:
    """Check that `raw` (one line without its newline) is a canonical JSON object."""
    try:
        value = loads_strict(raw, expect_object=False)
    except Refusal as exc:
        return _Line(None, "invalid_json", exc.message)
    if not isinstance(value, dict):
        return _Line(None, "not_object", f"a JSON {type(value).__name__}, not an object")
    try:
        canonical = _encode(value)
    except ValueError as exc:
        return _Line(None, "not_canonical", f"cannot be written canonically: {exc}")
    if canonical != raw.decode("utf-8"):
        return _Line(
            None,
            "not_canonical",
            "not in canonical form (sorted keys, compact separators, minimal escapes)",
        )
    return _Line(value)


def _check_link(obj: dict[str, Any], lineno: int, head: str | None, want_seed: str | None) -> _Line:
    """Check `seed` and `prev` of a well-formed line; `head` is None for the first line."""
    if head is None:
        seed = obj.get("seed")
        if not isinstance(seed, str):
            return _Line(None, "seed_mismatch", "the first line carries no seed string")
        if want_seed is not None and seed != want_seed:
            return _Line(None, "seed_mismatch", f"seed is {seed!r}, expected {want_seed!r}")
        expected = seed_hash(seed)
    else:
        if "seed" in obj:
            return _Line(
                None, "seed_mismatch", f"line {lineno} carries a seed; only the first line may"
            )
        expected = head
    if "prev" not in obj:
        return _Line(None, "missing_prev", "no prev field")
    prev = obj["prev"]
    if prev != expected:
        what = "the seed hash" if head is None else "the previous line's sha256"
        return _Line(None, "broken_prev", f"prev is {str(prev)[:80]!r}, expected {what} {expected}")
    return _Line(obj)


# --------------------------------------------------------------------------
# Scanning a whole log


@dataclass
class _Scan:
    path: str
    seed: str | None
    lines: int = 0
    head: str | None = None  # None until the first intact line
    intact_bytes: int = 0
    problem: ChainProblem | None = None
    records: list[dict[str, Any]] | None = field(default=None)

    def status(self) -> ChainStatus:
        if self.head is not None:
            head = self.head
        elif self.seed is not None:
            head = seed_hash(self.seed)
        else:
            head = ""
        return ChainStatus(self.path, self.lines, head, self.seed, self.problem)


_get_prev: Final = operator.itemgetter("prev")
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"{[\n")
_TOO_MANY_BRACKETS: Final = re.compile(rb"[^\n]{%d}" % (MAX_DEPTH + 1))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many acyclic dicts (it rescans them all otherwise)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _fast_block(
    block: bytes, head: str, keep: list[dict[str, Any]] | None
) -> tuple[int, str] | None:
    """Verify a block of whole lines after the first; None when anything looks off.

    Correct by construction: every line must equal the canonical encoding of
    the object parsed from it, so a batch parse cannot hide a bad line.
    """
    braw = block.split(b"\n")
    braw.pop()  # the block ends with a newline
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        return None
    slines = text.split("\n")
    slines.pop()
    if len(slines) != len(braw):  # cannot happen for valid UTF-8; cheap to guard
        return None
    if _TOO_MANY_BRACKETS.search(block.translate(None, _NOT_BRACKETS)):
        return None  # a line may nest deeper than MAX_DEPTH: let the strict reader decide
    try:
        objs = json.loads("[" + ",".join(slines) + "]")
    except (ValueError, RecursionError):
        return None
    if len(objs) != len(slines) or set(map(type, objs)) != {dict}:
        return None
    try:
        if list(map(_encode, objs)) != slines:
            return None
        prevs = list(map(_get_prev, objs))
    except (ValueError, KeyError):
        return None
    sha = hashlib.sha256
    hashes = [sha(b).hexdigest() for b in braw]
    if prevs[0] != head or prevs[1:] != hashes[:-1]:
        return None
    if any(map(operator.contains, objs, repeat("seed"))):
        return None
    if keep is not None:
        keep.extend(objs)
    return len(slines), hashes[-1]


def _slow_lines(scan: _Scan, block: bytes, start: int) -> None:
    """Check whole lines one by one from `start`; stop at the first problem."""
    pos = start
    end = len(block)
    while pos < end:
        nl = block.index(b"\n", pos)
        raw = block[pos:nl]
        lineno = scan.lines + 1
        checked = _check_form(raw)
        if checked.obj is not None:
            checked = _check_link(checked.obj, lineno, scan.head, scan.seed)
        if checked.obj is None:
            scan.problem = ChainProblem(lineno, checked.kind, f"line {lineno}: {checked.message}")
            return
        if scan.head is None:
            seed = checked.obj["seed"]
            scan.seed = seed if isinstance(seed, str) else None
        scan.lines = lineno
        scan.head = sha256_hex(raw)
        scan.intact_bytes += nl + 1 - pos
        if scan.records is not None:
            scan.records.append(checked.obj)
        pos = nl + 1


def _scan_block(scan: _Scan, block: bytes) -> None:
    """Check a block of whole lines (ending with a newline) continuing `scan`."""
    start = 0
    if scan.head is None:  # the first line carries the seed: check it on its own
        start = block.index(b"\n") + 1
        _slow_lines(scan, block[:start], 0)
        if scan.problem is not None or start == len(block):
            return
    assert scan.head is not None
    fast = _fast_block(block[start:] if start else block, scan.head, scan.records)
    if fast is None:
        _slow_lines(scan, block, start)
        return
    count, head = fast
    scan.lines += count
    scan.head = head
    scan.intact_bytes += len(block) - start


def _scan_fd(fd: int, path: str, seed: str | None, keep: bool) -> _Scan:
    """Verify the log open on `fd` from byte 0 to its end."""
    scan = _Scan(path=path, seed=seed, records=[] if keep else None)
    offset = 0
    carry = b""
    with _gc_paused():
        while scan.problem is None:
            data = os.pread(fd, _CHUNK, offset)
            if not data:
                break
            offset += len(data)
            if carry:
                data = carry + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            carry = data[cut:]
            _scan_block(scan, data[:cut] if cut < len(data) else data)
    if scan.problem is None and carry:
        lineno = scan.lines + 1
        scan.problem = ChainProblem(
            lineno,
            "torn_tail",
            f"line {lineno} has no newline: a torn tail of {len(carry)} bytes "
            "(repair moves it to a quarantine file)",
        )
    return scan


# --------------------------------------------------------------------------
# Opening files


def _open_regular(path: str, flags: int) -> int:
    """Open an existing regular file without blocking; refuse anything else by name."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputRefusal(
                Code.DANGLING_LINK, f"link points to nothing: {os.readlink(path)!r}", path
            ) from None
        raise InputRefusal(Code.FILE_MISSING, "no such file", path) from None
    except IsADirectoryError:
        raise InputRefusal(Code.NOT_A_REGULAR_FILE, "a folder, not a file", path) from None
    except PermissionError:
        raise InputRefusal(Code.FILE_UNREADABLE, "permission denied", path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputRefusal(Code.LINK_LOOP, "too many levels of links", path) from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing without a reader
            raise InputRefusal(
                Code.NOT_A_REGULAR_FILE, "a socket or unopenable special file", path
            ) from None
        raise InputRefusal(Code.FILE_UNREADABLE, exc.strerror or str(exc), path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputRefusal(Code.NOT_A_REGULAR_FILE, f"a {file_kind(st.st_mode)}, not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_shared(fd: int, path: str) -> None:
    """Wait (bounded) for any writer to finish so a reader sees whole appends."""
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise LogRefusal(
                    Code.LOG_LOCKED, f"a writer held the log for over {_LOCK_WAIT_S:.0f} s", path
                ) from None
            time.sleep(0.01)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return  # a file system without flock: read without it
            raise


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
# Public readers


def _resolve_seed(seed: str | None) -> str | None:
    if seed is not None and not isinstance(seed, str):
        raise LogRefusal(Code.LOG_SEED_INVALID, "a seed must be a string")
    return seed


def _scan_path(path: PathArg, seed: str | None, keep: bool) -> _Scan:
    p = os.fspath(path)
    fd = _open_regular(p, os.O_RDONLY)
    try:
        _lock_shared(fd, p)
        return _scan_fd(fd, p, _resolve_seed(seed), keep)
    finally:
        os.close(fd)


def verify_log(path: PathArg, seed: str | None = None) -> ChainStatus:
    """Verify a chained log; with `seed`, also require the log to carry that seed.

    A missing file, a dangling link or a non-regular file (FIFO, device,
    folder, socket) is a `Refusal`; problems inside the log are reported in
    the returned status, never raised.
    """
    return _scan_path(path, seed, keep=False).status()


def _refuse_problem(path: str, problem: ChainProblem) -> Refusal:
    code = Code.LOG_TORN_TAIL if problem.kind == "torn_tail" else Code.LOG_BROKEN
    return Refusal(code, problem.message, path, line=problem.line, kind=problem.kind)


def read_log(path: PathArg, seed: str | None = None) -> list[dict[str, Any]]:
    """All records of a fully intact log; `Refusal` (log_broken/log_torn_tail) naming the first bad line."""
    scan = _scan_path(path, seed, keep=True)
    if scan.problem is not None:
        raise _refuse_problem(scan.path, scan.problem)
    assert scan.records is not None
    return scan.records


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
                return _open_regular(self.path, flags), False
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
                f"line {lineno} has no newline: a torn tail; run repair before appending",
                self.path,
                line=lineno,
                kind="torn_tail",
            )
        start = self._last_line_start(fd, size)
        last = _pread_exact(fd, size - 1 - start, start, self.path)
        checked = _check_form(last)
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
        checked = _check_form(first)
        if checked.obj is not None:
            checked = _check_link(checked.obj, 1, None, None)
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
        for key in _RESERVED:
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
        checked = _check_form(raw)
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
                scan = _scan_fd(fd, self.path, self.seed, keep=False)
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
                    raise _refuse_problem(self.path, problem)
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
