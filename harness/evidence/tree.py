"""Tree signatures: what a receipt says was verified.

The manual: docs/evidence.md ("Tree signature").
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import hashlib
import os
import re
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from harness.errors import Code, Refusal, TreeRefusal
from harness.evidence.tree_entry import TreeEntry, TreeSignature, signature_of

__all__ = ["DEFAULT_EXCLUDES", "MAX_FILE_BYTES", "scan_tree", "scan_tree_excluded", "tree_signature"]

PathArg: TypeAlias = str | bytes | os.PathLike[str] | os.PathLike[bytes]

DEFAULT_EXCLUDES: tuple[str, ...] = ("__pycache__/", "*.pyc", ".pytest_cache/")
"""Exclusions used when a task names none."""

_CHUNK: Final = 1 << 20
MAX_FILE_BYTES: Final = 1 << 30
"""A file whose apparent size is larger is refused (`tree_file_too_large`), never read: a sparse
file of terabytes of holes would otherwise be hashed byte by byte. Matches a run's RLIMIT_FSIZE."""
_KIND_OF_FMT: Final = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "link",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char_device",
    stat.S_IFBLK: "block_device",
}
_FILE_FLAGS: Final = (
    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
)
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ROOT_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
# scandir on a descriptor yields str names; with a UTF-8 filesystem encoding they
# are already the UTF-8/surrogateescape text the exclusion rules match against.
_FS_UTF8: Final = (
    codecs.lookup(sys.getfilesystemencoding()).name == "utf-8"
    and sys.getfilesystemencodeerrors() == "surrogateescape"
)


# --- exclusions -----------------------------------------------------------------


@dataclass(frozen=True)
class _Rules:
    """Compiled exclusions: base-name or whole-path globs, for any entry or folders only."""

    name_any: re.Pattern[str] | None
    name_dir: re.Pattern[str] | None
    path_any: re.Pattern[str] | None
    path_dir: re.Pattern[str] | None


def _join(globs: list[str]) -> re.Pattern[str] | None:
    if not globs:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))


def _compile_excludes(excludes: Sequence[str]) -> _Rules:
    if isinstance(excludes, (str, bytes)):
        raise TreeRefusal(Code.EXCLUSION_INVALID, "exclusions must be a list of patterns, not one string")
    groups: dict[tuple[bool, bool], list[str]] = {
        (a, b): [] for a in (False, True) for b in (False, True)
    }
    for pattern in excludes:
        if not isinstance(pattern, str) or "\0" in pattern:
            raise TreeRefusal(Code.EXCLUSION_INVALID, f"not a usable pattern: {pattern!r}")
        dir_only = pattern.endswith("/")
        body = pattern.rstrip("/") if dir_only else pattern
        whole_path = "/" in body
        body = body.lstrip("/")
        if not body:
            raise TreeRefusal(Code.EXCLUSION_INVALID, f"pattern matches nothing: {pattern!r}")
        groups[(whole_path, dir_only)].append(body)
    return _Rules(
        name_any=_join(groups[(False, False)]),
        name_dir=_join(groups[(False, True)]),
        path_any=_join(groups[(True, False)]),
        path_dir=_join(groups[(True, True)]),
    )


# --- scanning -------------------------------------------------------------------


class _Scan:
    """State of one walk: the root for messages, the rules, the entries found."""

    def __init__(self, root: bytes, rules: _Rules) -> None:
        self.root = root
        self.rules = rules
        self.out: dict[bytes, TreeEntry] = {}
        self.excluded: list[bytes] = []

    def where(self, rel: bytes) -> bytes:
        return os.path.join(self.root, rel) if rel else self.root

    def unreadable(self, rel: bytes, exc: OSError) -> Refusal:
        what = exc.strerror or type(exc).__name__
        return TreeRefusal(Code.TREE_UNREADABLE, f"cannot read: {what}", self.where(rel))

    def changed(self, rel: bytes, why: str) -> Refusal:
        return TreeRefusal(Code.TREE_CHANGED_DURING_SCAN, why, self.where(rel))


def _open_root(root: bytes) -> int:
    try:
        return os.open(root, _ROOT_FLAGS)
    except FileNotFoundError:
        raise TreeRefusal(Code.WORKSPACE_MISSING, "no such folder", root) from None
    except NotADirectoryError:
        raise TreeRefusal(Code.NOT_A_DIRECTORY, "the workspace is not a folder", root) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TreeRefusal(Code.WORKSPACE_MISSING, "too many levels of links", root) from None
        raise TreeRefusal(Code.TREE_UNREADABLE, f"cannot open: {exc.strerror}", root) from None


def _list_dir(
    scan: _Scan, dfd: int, rel: bytes, urel: str
) -> list[tuple[bytes, bytes, str, os.stat_result]]:
    """Record every entry of one folder; return its subfolders still to walk."""
    rules = scan.rules
    out = scan.out
    try:
        with os.scandir(dfd) as it:
            listing = [(de.name, de) for de in it]
    except OSError as exc:
        raise scan.unreadable(rel, exc) from None
    want_path = rules.path_any is not None or rules.path_dir is not None
    subdirs: list[tuple[bytes, bytes, str, os.stat_result]] = []
    for name, de in listing:
        if _FS_UTF8:
            name_b = name.encode("utf-8", "surrogateescape")
            uname = name
        else:
            name_b = os.fsencode(name)
            uname = name_b.decode("utf-8", "surrogateescape")
        if not rel and name_b == b".git":
            continue
        path = rel + b"/" + name_b if rel else name_b
        try:
            st = de.stat(follow_symlinks=False)
        except FileNotFoundError:
            raise scan.changed(path, "entry vanished during the scan") from None
        except OSError as exc:
            raise scan.unreadable(path, exc) from None
        fmt = stat.S_IFMT(st.st_mode)
        is_dir = fmt == stat.S_IFDIR
        if (rules.name_any is not None and rules.name_any.match(uname)) or (
            is_dir and rules.name_dir is not None and rules.name_dir.match(uname)
        ):
            scan.excluded.append(path)
            continue
        upath = ""
        if want_path:
            upath = urel + "/" + uname if urel else uname
            if (rules.path_any is not None and rules.path_any.match(upath)) or (
                is_dir and rules.path_dir is not None and rules.path_dir.match(upath)
            ):
                scan.excluded.append(path)
                continue
        if fmt == stat.S_IFREG:
            out[path] = _read_file(scan, dfd, name_b, path, st)
        elif is_dir:
            out[path] = TreeEntry(path, "dir", False, 0, "", None)
            subdirs.append((name_b, path, upath, st))
        elif fmt == stat.S_IFLNK:
            try:
                target = os.readlink(name_b, dir_fd=dfd)
            except (FileNotFoundError, NotADirectoryError):
                raise scan.changed(path, "link vanished during the scan") from None
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise scan.changed(path, "no longer a link") from None
                raise scan.unreadable(path, exc) from None
            digest = hashlib.sha256(target).hexdigest()
            out[path] = TreeEntry(path, "link", False, 0, digest, target)
        else:
            kind = _KIND_OF_FMT.get(fmt)
            if kind is None:
                raise TreeRefusal(Code.TREE_UNREADABLE, f"unsupported file type {fmt:o}", scan.where(path))
            out[path] = TreeEntry(path, kind, False, 0, "", None)
    # Walk subfolders in reverse so popping from the end visits them in listing order.
    subdirs.reverse()
    return subdirs


def _read_file(scan: _Scan, dfd: int, name: bytes, path: bytes, st: os.stat_result) -> TreeEntry:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        raise scan.changed(path, "file vanished during the scan") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise scan.changed(path, "no longer a regular file") from None
        raise scan.unreadable(path, exc) from None
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or fst.st_ino != st.st_ino or fst.st_dev != st.st_dev:
            raise scan.changed(path, "replaced during the scan")
        size = fst.st_size
        if size > MAX_FILE_BYTES:
            raise TreeRefusal(
                Code.TREE_FILE_TOO_LARGE,
                f"{size} bytes apparent size ({fst.st_blocks * 512} on disk), limit {MAX_FILE_BYTES}",
                scan.where(path),
            )
        try:
            if size < _CHUNK:
                data = os.read(fd, size + 1)  # one read; the extra byte detects growth
                if len(data) == size:
                    digest = hashlib.sha256(data).hexdigest()
                    total = size
                else:
                    digest, total = _hash_rest(fd, data)
            else:
                digest, total = _hash_rest(fd, b"")
        except OSError as exc:
            raise scan.unreadable(path, exc) from None
        if total != size:
            raise scan.changed(path, f"size changed from {size} to {total} bytes while reading")
    finally:
        os.close(fd)
    return TreeEntry(path, "file", bool(fst.st_mode & stat.S_IXUSR), size, digest, None)


def _hash_rest(fd: int, first: bytes) -> tuple[str, int]:
    """Hash `first` and everything after it up to end of file, in 1 MiB chunks."""
    h = hashlib.sha256(first)
    total = len(first)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while True:
        n = os.readv(fd, [buf])
        if n == 0:
            break
        h.update(view[:n])
        total += n
    return h.hexdigest(), total


def _open_subdir(scan: _Scan, dfd: int, name: bytes, path: bytes, st: os.stat_result) -> int:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        raise scan.changed(path, "folder vanished or was replaced during the scan") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise scan.changed(path, "folder replaced by a link during the scan") from None
        raise scan.unreadable(path, exc) from None
    try:
        fst = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise scan.unreadable(path, exc) from None
    if fst.st_ino != st.st_ino or fst.st_dev != st.st_dev:
        os.close(fd)
        raise scan.changed(path, "folder replaced during the scan")
    return fd


def scan_tree(root: PathArg, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> dict[bytes, TreeEntry]:
    """Every recorded entry under `root`, keyed by relative path bytes.

    `scan_tree_excluded` also returns what the exclusions left out.

    Args:
        root: the workspace folder.
        excludes: the task's exclusion patterns (see the module docstring).

    Raises:
        Refusal: ``workspace_missing``, ``not_a_directory``, ``tree_unreadable``,
            ``tree_changed_during_scan`` or ``exclusion_invalid``.
    """
    return _scan(root, excludes).out


def scan_tree_excluded(
    root: PathArg, excludes: Sequence[str] = DEFAULT_EXCLUDES
) -> tuple[dict[bytes, TreeEntry], list[bytes]]:
    """`scan_tree`, and the relative paths the exclusions left out (an excluded folder once,
    never walked into): what the signature does not cover (docs/gated-path.md)."""
    scan = _scan(root, excludes)
    return scan.out, sorted(scan.excluded)


def _scan(root: PathArg, excludes: Sequence[str]) -> _Scan:
    rules = _compile_excludes(excludes)
    root_b = os.fsencode(root)
    scan = _Scan(root_b, rules)
    # One open folder per level of depth: [fd, subfolders still to walk].
    stack: list[tuple[int, list[tuple[bytes, bytes, str, os.stat_result]]]] = []
    try:
        fd = _open_root(root_b)
        stack.append((fd, []))
        stack[-1][1].extend(_list_dir(scan, fd, b"", ""))
        while stack:
            fd, pending = stack[-1]
            if not pending:
                stack.pop()
                os.close(fd)
                continue
            name, path, upath, st = pending.pop()
            child = _open_subdir(scan, fd, name, path, st)
            stack.append((child, []))
            stack[-1][1].extend(_list_dir(scan, child, path, upath))
    finally:
        for fd, _ in stack:
            os.close(fd)
    return scan


def tree_signature(root: PathArg, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> TreeSignature:
    """Scan `root` and return its signature (see `scan_tree` for refusals)."""
    return signature_of(scan_tree(root, excludes))
