"""Strict reading of saved inputs and canonical JSON writing.

Every reader in proctor goes through here: read the file once, hash those
bytes, decode the same bytes. Bad input is a named `Refusal` carrying the path.

The manual: docs/evidence.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, InputRefusal

MAX_DEPTH: Final = 64
"""Deepest nesting of arrays and objects a saved JSON input may have."""

MAX_BYTES: Final = 64 * 1024 * 1024
"""Largest saved input read by default (64 MiB)."""

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "Loaded",
    "canonical_bytes",
    "canonical_line",
    "file_kind",
    "loads_strict",
    "open_regular",
    "read_bytes",
    "read_json",
    "sha256_hex",
]


@dataclass(frozen=True)
class Loaded:
    """A decoded input with the sha256 of exactly the bytes it was decoded from."""

    value: Any
    sha256: str
    raw: bytes


def sha256_hex(data: bytes) -> str:
    """The sha256 hex digest of `data`."""
    return hashlib.sha256(data).hexdigest()


def canonical_bytes(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, compact separators, UTF-8, no NaN or Infinity."""
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise InputRefusal(Code.JSON_NON_FINITE, f"cannot write a non-finite number: {exc}") from exc
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. decoded from a "\\ud800" escape
        raise InputRefusal(Code.INVALID_UTF8, f"a lone surrogate cannot be written as UTF-8 at {exc.start}") from None


def canonical_line(obj: Any) -> bytes:
    """Canonical JSON followed by one newline."""
    return canonical_bytes(obj) + b"\n"


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> bytes:
    """Read a regular file once, without ever blocking on a FIFO or device.

    A link is followed to a regular file; a dangling link, a folder, a FIFO,
    a device or a socket is a named refusal.
    """
    p = os.fspath(path)
    fd = open_regular(p, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise InputRefusal(Code.FILE_TOO_LARGE, f"{st.st_size} bytes, limit {max_bytes}", p)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise InputRefusal(Code.FILE_TOO_LARGE, f"more than {max_bytes} bytes", p)
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path: str, flags: int) -> int:
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


def file_kind(mode: int) -> str:
    """A person's name for the kind of file `mode` describes."""
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _pairs_no_duplicates(path: str | None) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InputRefusal(Code.JSON_DUPLICATE_KEY, f"duplicate key {key!r}", path)
            out[key] = value
        return out

    return hook


def _refuse_constant(path: str | None) -> Any:
    def hook(name: str) -> Any:
        raise InputRefusal(Code.JSON_NON_FINITE, f"{name} is not allowed", path)

    return hook


def _check_depth(value: Any, max_depth: int, path: str | None) -> None:
    """Refuse nesting deeper than `max_depth`, one level of containers at a time (the decoder makes
    only exact dicts and lists)."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 1
    while level:
        if depth > max_depth:
            raise InputRefusal(Code.JSON_TOO_DEEP, f"nesting deeper than {max_depth}", path)
        level = [child for node in level for child in (node.values() if type(node) is dict else node)
                 if type(child) is dict or type(child) is list]
        depth += 1


def _finite_floats(path: str | None) -> Any:
    def hook(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):  # 1e400 overflows to infinity
            raise InputRefusal(Code.JSON_NON_FINITE, f"number {text} is not finite", path)
        return number

    return hook


def loads_strict(
    data: bytes,
    *,
    path: str | os.PathLike[str] | None = None,
    max_depth: int = MAX_DEPTH,
    expect_object: bool = True,
) -> Any:
    """Decode strict UTF-8 JSON bytes, refusing duplicates, NaN/Infinity and deep nesting."""
    where = None if path is None else os.fspath(path)
    try:
        text = data.decode("utf-8", "strict")
    except UnicodeDecodeError as exc:
        raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", where) from None
    if text.startswith("\ufeff"):
        raise InputRefusal(Code.INVALID_JSON, "a byte-order mark is not JSON", where)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs_no_duplicates(where),
            parse_constant=_refuse_constant(where),
            parse_float=_finite_floats(where),
        )
    except RecursionError:
        raise InputRefusal(Code.JSON_TOO_DEEP, f"nesting deeper than {max_depth}", where) from None
    except json.JSONDecodeError as exc:
        raise InputRefusal(Code.INVALID_JSON, f"{exc.msg} at line {exc.lineno} column {exc.colno}", where) from None
    except ValueError as exc:  # e.g. an integer longer than Python's digit limit
        raise InputRefusal(Code.INVALID_JSON, str(exc), where) from None
    _check_depth(value, max_depth, where)
    if expect_object and not isinstance(value, dict):
        raise InputRefusal(Code.JSON_NOT_OBJECT, f"expected an object, found {type(value).__name__}", where)
    return value


def read_json(
    path: str | os.PathLike[str],
    *,
    expect_object: bool = True,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
) -> Loaded:
    """Read, hash and strictly decode one JSON file."""
    raw = read_bytes(path, max_bytes=max_bytes)
    value = loads_strict(raw, path=path, max_depth=max_depth, expect_object=expect_object)
    return Loaded(value=value, sha256=sha256_hex(raw), raw=raw)
