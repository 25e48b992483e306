"""Chained append-only JSONL logs: the format, and reading and verifying a log.

The manual: docs/evidence.md ("Chained logs").
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, pairwise, repeat
from types import ModuleType
from typing import Any, Final

from harness.errors import Code, LogRefusal, Refusal
from harness.evidence.jsonio import MAX_DEPTH, loads_strict, open_regular, sha256_hex

__all__ = [
    "PROBLEM_KINDS",
    "REPAIR_HINT",
    "RESERVED",
    "ChainProblem",
    "ChainStatus",
    "PathArg",
    "check_form",
    "check_link",
    "read_log",
    "refuse_problem",
    "scan_fd",
    "seed_hash",
    "verify_log",
]

REPAIR_HINT: Final = ("run `proctor ledger repair FILE` on this log: it moves the torn tail to a "
                      "quarantine file and records the repair in the chain")
"""What a torn-tail refusal tells the operator to do."""

PROBLEM_KINDS: Final = (
    "torn_tail",
    Code.INVALID_JSON,
    "not_canonical",
    "missing_prev",
    "broken_prev",
    "seed_mismatch",
    "not_object",
)
"""Every `ChainProblem.kind`."""

_CHUNK: Final = 256 * 1024
"""Bytes read per step while verifying (a longer line is read whole, in doubling steps).

Small enough that one block's parsed objects stay in the CPU caches and the
allocator reuses its memory (16 MiB blocks spent a fifth of the time in page
faults); large enough that the per-block calls do not matter."""

_LOCK_WAIT_S: Final = 30.0
"""How long a reader waits for a writer's exclusive lock before refusing."""

RESERVED: Final = ("prev", "seed")

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


def _load_orjson() -> ModuleType | None:
    """orjson when it is installed and writes what `_encode` writes (floats aside: `_orjson_objects` checks them)."""
    try:
        import orjson
    except ImportError:
        return None
    sample = {
        "b": [1, -7, 2**63 - 1, None, True, False, 'é\u2028"\\\n\x00\x1f\x7f', "\U0001f600"],
        "\uffff": {"z": "", "\U00010000": [], "Z": {}},
        "a": "x",
    }
    try:
        if orjson.dumps(sample, option=orjson.OPT_SORT_KEYS) != _encode(sample).encode("utf-8"):
            return None
    except Exception:
        return None
    return orjson


_ORJSON: list[ModuleType | None] = []
"""orjson (or None: blocks are then proved with the standard library alone), once `_orjson` has loaded it."""


def _orjson() -> ModuleType | None:
    """orjson, loaded on first use (a command that verifies no log does not import it)."""
    if not _ORJSON:
        _ORJSON.append(_load_orjson())
    return _ORJSON[0]


# --------------------------------------------------------------------------
# Checking one line


@dataclass
class _Line:
    """One line checked on its own: the object, or the problem with it."""

    obj: dict[str, Any] | None
    kind: str = ""
    message: str = ""


def check_form(raw: bytes) -> _Line:
    """Check that `raw` (one line without its newline) is a canonical JSON object."""
    try:
        value = loads_strict(raw, expect_object=False)
    except Refusal as exc:
        return _Line(None, Code.INVALID_JSON, exc.message)
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


def check_link(obj: dict[str, Any], lineno: int, head: str | None, want_seed: str | None) -> _Line:
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


class _Route:
    """Which proof a scan tries first on a block: orjson's, until a block needed the standard library's.

    Routing only: either proof alone decides correctly. A log whose floats need an exponent (which
    orjson writes otherwise) fails orjson's proof; after the first such block, only blocks without
    "e-" and "e+" try orjson first, so such a log does not pay for both proofs on every block.
    """

    __slots__ = ("std_seen",)

    def __init__(self) -> None:
        self.std_seen = False


@dataclass
class _Scan:
    path: str
    seed: str | None
    lines: int = 0
    head: str | None = None  # None until the first intact line
    intact_bytes: int = 0
    problem: ChainProblem | None = None
    records: list[dict[str, Any]] | None = field(default=None)
    route: _Route = field(default_factory=_Route)

    def status(self) -> ChainStatus:
        if self.head is not None:
            head = self.head
        elif self.seed is not None:
            head = seed_hash(self.seed)
        else:
            head = ""
        return ChainStatus(self.path, self.lines, head, self.seed, self.problem)


_get_prev: Final = operator.itemgetter("prev")
_hexdigest: Final = operator.methodcaller("hexdigest")
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


_FLOAT_OR_NESTED: Final = frozenset({float, dict, list})


def _floats(objs: list[dict[str, Any]]) -> list[float]:
    """Every float inside `objs`, in any order."""
    found = [v for v in chain.from_iterable(map(dict.values, objs)) if type(v) in _FLOAT_OR_NESTED]
    kinds = set(map(type, found))
    if dict not in kinds and list not in kinds:  # flat records: the floats themselves
        return found
    out: list[float] = []
    stack: list[Any] = found
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is float:
            out.append(node)
        elif kind is dict:
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
    return out


def _orjson_objects(body: bytes, count: int) -> list[dict[str, Any]] | None:
    """The objects of `count` newline-separated lines when each is canonical, proved with orjson; else None.

    orjson's sorted, compact output equals `canonical_bytes` for every string,
    key order, integer and structure (checked at import and in the tests), so
    a line equal to orjson's encoding of its object is canonical once every
    float in it is written as Python writes it (orjson writes 1e-05 as
    0.00001, 1e+16 as 1e16): the floats are re-encoded both ways and compared.
    Integers beyond 64 bits parse as floats in orjson and never round-trip.
    """
    orjson = _orjson()
    assert orjson is not None
    try:
        objs: list[dict[str, Any]] = orjson.loads(b"[" + body.replace(b"\n", b",") + b"]")
    except ValueError:  # orjson.JSONDecodeError
        return None
    if len(objs) != count or set(map(type, objs)) != {dict}:
        return None
    try:
        # A canonical encoding never holds a raw newline, so the joined texts are
        # equal exactly when every line equals its own object's encoding.
        if b"\n".join(map(orjson.dumps, objs, repeat(None), repeat(orjson.OPT_SORT_KEYS))) != body:
            return None
        floats = _floats(objs)
        if floats:
            # Each distinct float once (records repeat scores and prices); a set keeps one of
            # 0.0 and -0.0, so both are always checked.
            distinct = [*set(floats), 0.0, -0.0]
            if orjson.dumps(distinct) != ("[" + ",".join(map(repr, distinct)) + "]").encode("ascii"):
                return None
    except (TypeError, ValueError):  # orjson.JSONEncodeError
        return None
    return objs


def _std_objects(block: bytes, count: int) -> list[dict[str, Any]] | None:
    """The objects of a block's `count` lines when each is canonical, proved with the standard library; else None."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        return None
    body = text[:-1]
    if body.count("\n") != count - 1:  # cannot happen for valid UTF-8; cheap to guard
        return None
    try:
        objs: list[dict[str, Any]] = json.loads("[" + body.replace("\n", ",") + "]")
    except (ValueError, RecursionError):
        return None
    if len(objs) != count or set(map(type, objs)) != {dict}:
        return None
    try:
        # A canonical encoding never holds a raw newline, so the joined texts are
        # equal exactly when every line equals its own object's encoding.
        if "\n".join(map(_encode, objs)) != body:
            return None
    except ValueError:
        return None
    return objs


def _fast_lines(
    block: bytes, keep: list[dict[str, Any]] | None, route: _Route | None = None
) -> tuple[str, int, str] | None:
    """Check a block of whole lines after the first, linked among themselves; None when anything looks off.

    Returns (the first line's prev, the line count, the last line's sha256);
    the caller checks that first prev against the head before the block.
    Correct by construction: every line must equal the canonical encoding of
    the object parsed from it, so a batch parse cannot hide a bad line.
    """
    braw = block.split(b"\n")
    braw.pop()  # the block ends with a newline
    count = len(braw)
    if _TOO_MANY_BRACKETS.search(block.translate(None, _NOT_BRACKETS)):
        return None  # a line may nest deeper than MAX_DEPTH: let the strict reader decide
    objs = None
    # Records kept come from the standard parser, as always. A float Python writes
    # with an exponent (e-05) may be one orjson writes otherwise (0.00001): such a
    # block fails orjson's proof and goes to the standard library's; once one has,
    # blocks holding "e-" or "e+" go straight there (`_Route`).
    tried = False
    if keep is None and _orjson() is not None and (
        route is None or not route.std_seen or (b"e-" not in block and b"e+" not in block)
    ):
        tried = True
        objs = _orjson_objects(block[:-1], count)
    if objs is None:
        objs = _std_objects(block, count)
        if objs is not None and tried and route is not None:
            route.std_seen = True
    if objs is None:
        return None
    try:
        prevs = list(map(_get_prev, objs))
    except KeyError:
        return None
    hashes = list(map(_hexdigest, map(hashlib.sha256, braw)))
    if prevs[1:] != hashes[:-1]:
        return None
    if any(map(operator.contains, objs, repeat("seed"))):
        return None
    first = prevs[0]
    if not isinstance(first, str):
        return None
    if keep is not None:
        keep.extend(objs)
    return first, count, hashes[-1]


def _fast_block(
    block: bytes, head: str, keep: list[dict[str, Any]] | None, route: _Route | None = None
) -> tuple[int, str] | None:
    """Verify a block of whole lines after the first, continuing `head`; None when anything looks off."""
    got: list[dict[str, Any]] | None = None if keep is None else []
    found = _fast_lines(block, got, route)
    if found is None or found[0] != head:
        return None
    if keep is not None and got is not None:
        keep.extend(got)
    return found[1], found[2]


def _slow_lines(scan: _Scan, block: bytes, start: int) -> None:
    """Check whole lines one by one from `start`; stop at the first problem."""
    pos = start
    end = len(block)
    while pos < end:
        nl = block.index(b"\n", pos)
        raw = block[pos:nl]
        lineno = scan.lines + 1
        checked = check_form(raw)
        if checked.obj is not None:
            checked = check_link(checked.obj, lineno, scan.head, scan.seed)
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
    fast = _fast_block(block[start:] if start else block, scan.head, scan.records, scan.route)
    if fast is None:
        _slow_lines(scan, block, start)
        return
    count, head = fast
    scan.lines += count
    scan.head = head
    scan.intact_bytes += len(block) - start


def scan_fd(fd: int, path: str, seed: str | None, keep: bool) -> _Scan:
    """Verify the log open on `fd` from byte 0 to its end.

    A large log (and no records kept) is verified in parallel pieces first
    (`_scan_parallel`); the serial scan then carries on from wherever that
    stopped, so every problem is found and named exactly as a serial scan would.
    """
    scan = _Scan(path=path, seed=seed, records=[] if keep else None)
    with _gc_paused():
        offset = 0 if keep else _scan_parallel(fd, scan)
        carry = _scan_serial(fd, scan, offset)
    if scan.problem is None and carry:
        lineno = scan.lines + 1
        scan.problem = ChainProblem(
            lineno,
            "torn_tail",
            f"line {lineno} has no newline: a torn tail of {len(carry)} bytes; {REPAIR_HINT}",
        )
    return scan


class _Blocks:
    """The blocks of whole lines read from `fd` in [offset, end) (`end` None: to the end of the file).

    While and after iterating, `rest` holds the bytes after the last newline read; `short` is True when
    the file ended before `end`.
    """

    def __init__(self, fd: int, offset: int, end: int | None = None) -> None:
        self.fd, self.offset, self.end = fd, offset, end
        self.rest, self.short = b"", False

    def __iter__(self) -> Iterator[bytes]:
        carry = b""
        while self.end is None or self.offset < self.end:
            want = max(_CHUNK, len(carry))
            data = os.pread(self.fd, want if self.end is None else min(want, self.end - self.offset), self.offset)
            if not data:
                self.short = self.end is not None
                break
            self.offset += len(data)
            if carry:
                data = carry + data
            cut = data.rfind(b"\n") + 1
            self.rest = carry = data[cut:]
            if cut:
                yield data[:cut] if cut < len(data) else data


def _scan_serial(fd: int, scan: _Scan, offset: int) -> bytes:
    """Carry `scan` on from byte `offset` to the end; returns the bytes after the last newline."""
    blocks = _Blocks(fd, offset)
    if scan.problem is None:
        for block in blocks:
            _scan_block(scan, block)
            if scan.problem is not None:
                break
    return blocks.rest


# --------------------------------------------------------------------------
# Verifying a large log in parallel pieces

_PAR_MIN_BYTES = 32 * 1024 * 1024
"""Smallest log verified in parallel pieces (a module variable so tests can lower it)."""

_PAR_MIN_PIECE = 8 * 1024 * 1024
"""Smallest piece given to one process (tests lower it too)."""

_PAR_MAX_WORKERS: Final = 8
_PAR_CORES: int | None = None
"""Cores to use; None asks the OS (tests set more than the machine has, to cut more pieces)."""
_PROBE: Final = 1 << 20
"""Bytes read at a time while looking for a line boundary near a cut."""


def _par_workers(size: int) -> int:
    """How many processes verify a log of `size` bytes: 1 (serial) unless it pays and is safe.

    Forking is safe only in a single-threaded process (a thread may hold a
    lock the child would need); a runner with lanes verifies serially.
    """
    if size < _PAR_MIN_BYTES or not hasattr(os, "fork") or threading.active_count() != 1:
        return 1
    cores = _PAR_CORES
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
    return max(1, min(cores, _PAR_MAX_WORKERS, size // max(1, _PAR_MIN_PIECE)))


def _next_line_start(fd: int, pos: int, end: int) -> int:
    """The offset just after the first newline at or after `pos` (before `end`); -1 if none."""
    while pos < end:
        data = os.pread(fd, min(_PROBE, end - pos), pos)
        if not data:
            return -1
        nl = data.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(data)
    return -1


def _verify_range(fd: int, start: int, end: int) -> tuple[str, int, str] | None:
    """Fast-check the whole lines in bytes [start, end): (first prev, count, last sha256), or None."""
    first = ""
    count = 0
    head = ""
    blocks = _Blocks(fd, start, end)
    route = _Route()
    for block in blocks:
        found = _fast_lines(block, None, route)
        if found is None or (count and found[0] != head):
            return None
        if not count:
            first = found[0]
        count += found[1]
        head = found[2]
    if blocks.short or blocks.rest or not count:  # the file shrank, or a piece ends mid-line: the serial scan decides
        return None
    return first, count, head


def _fork_range(fd: int, start: int, end: int) -> tuple[int, int]:
    """Verify [start, end) in a forked child; returns (pid, read end of its result pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: verify, write the result as JSON, exit without cleanup
        code = 1
        try:
            os.close(r)
            out = json.dumps(_verify_range(fd, start, end)).encode("ascii")
            while out:
                out = out[os.write(w, out):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _collect(pid: int, r: int) -> tuple[str, int, str] | None:
    """A child's result (None when it failed in any way); always reaps the child."""
    try:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        value = json.loads(b"".join(chunks))
    except ValueError:
        return None
    if (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[0], str)
        and type(value[1]) is int
        and isinstance(value[2], str)
    ):
        return value[0], value[1], value[2]
    return None


def _scan_parallel(fd: int, scan: _Scan) -> int:
    """Verify a large log in pieces across processes; returns the offset the serial scan goes on from.

    The first line (the seed) is checked serially. The rest is cut at line
    boundaries into pieces; each process checks its lines' form and the links
    inside its piece and reports (first prev, count, last sha256); the links
    between pieces are checked here, in order. At the first piece that is not
    clean, this stops and returns that piece's start with `scan` exactly as a
    serial scan would have it there, so the serial scan finds and names the
    problem as it always has.
    """
    size = os.fstat(fd).st_size
    workers = _par_workers(size)
    if workers < 2:
        return 0
    start = _next_line_start(fd, 0, size)
    if start <= 0:
        return 0
    _slow_lines(scan, os.pread(fd, start, 0), 0)
    if scan.problem is not None:
        return start
    tail = os.pread(fd, min(size - start, _PROBE), size - min(size - start, _PROBE))
    end = size - len(tail) + tail.rfind(b"\n") + 1
    if end <= start:
        return start
    cuts = [start]
    for i in range(1, workers):
        cut = _next_line_start(fd, start + (end - start) * i // workers, end)
        if cut > cuts[-1] and cut < end:
            cuts.append(cut)
    cuts.append(end)
    pieces = list(pairwise(cuts))
    children: list[tuple[int, int]] = []
    results: list[tuple[str, int, str] | None] = []
    try:
        try:
            for a, b in pieces[1:]:
                children.append(_fork_range(fd, a, b))
        except OSError:
            pass  # no fork: the pieces without a child are checked serially below
        results.append(_verify_range(fd, *pieces[0]))
    finally:
        results.extend(_collect(pid, r) for pid, r in children)
    for (a, b), found in zip(pieces, results, strict=False):  # fewer results if a fork failed
        if found is None or found[0] != scan.head:
            return a
        scan.lines += found[1]
        scan.head = found[2]
        scan.intact_bytes += b - a
    return end if len(results) == len(pieces) else pieces[len(results)][0]


# --------------------------------------------------------------------------
# A reader's shared lock


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


# --------------------------------------------------------------------------
# Public readers


def _resolve_seed(seed: str | None) -> str | None:
    if seed is not None and not isinstance(seed, str):
        raise LogRefusal(Code.LOG_SEED_INVALID, "a seed must be a string")
    return seed


def _scan_path(path: PathArg, seed: str | None, keep: bool) -> _Scan:
    p = os.fspath(path)
    fd = open_regular(p, os.O_RDONLY)
    try:
        _lock_shared(fd, p)
        return scan_fd(fd, p, _resolve_seed(seed), keep)
    finally:
        os.close(fd)


def verify_log(path: PathArg, seed: str | None = None) -> ChainStatus:
    """Verify a chained log; with `seed`, also require the log to carry that seed.

    A missing file, a dangling link or a non-regular file (FIFO, device,
    folder, socket) is a `Refusal`; problems inside the log are reported in
    the returned status, never raised.
    """
    return _scan_path(path, seed, keep=False).status()


def refuse_problem(path: str, problem: ChainProblem) -> Refusal:
    code = Code.LOG_TORN_TAIL if problem.kind == "torn_tail" else Code.LOG_BROKEN
    return Refusal(code, problem.message, path, line=problem.line, kind=problem.kind)


def read_log(path: PathArg, seed: str | None = None) -> list[dict[str, Any]]:
    """All records of a fully intact log; `Refusal` (log_broken/log_torn_tail) naming the first bad line."""
    scan = _scan_path(path, seed, keep=True)
    if scan.problem is not None:
        raise refuse_problem(scan.path, scan.problem)
    assert scan.records is not None
    return scan.records
