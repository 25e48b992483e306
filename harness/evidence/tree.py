"""Tree signatures: what a receipt says was verified (DESIGN.md, "Tree signature").

What is recorded
    Every entry under the workspace root, folders included (an empty folder
    counts), except:

    * the top-level ``.git`` entry (folder, or the ``gitdir:`` file of a
      worktree). Only the top level: a ``.git`` deeper down belongs to a nested
      repository or submodule that is part of the workspace, and excluding
      every ``.git`` would give a worker a name under which edits go unseen;
    * the task's exclusions (`DEFAULT_EXCLUDES` unless the task says
      otherwise). A pattern ending in ``/`` excludes folders of that name at
      any depth with everything under them. Any other pattern is an
      `fnmatch` glob (case-sensitive; ``*`` also crosses ``/``) that excludes
      any entry, and a folder's whole subtree when a folder matches. A pattern
      without ``/`` is matched against the entry's base name; one with ``/`` is
      matched against the whole relative path (a leading ``/`` only anchors).
      Names are matched as UTF-8 decoded with ``surrogateescape``.

    ``.gitignore`` is not honoured: a worker could edit it to hide a change.

How entries are read
    The walk is descriptor-relative (``openat`` with ``O_NOFOLLOW``), so links
    are never followed, not even when one is swapped in during the scan. A link
    is recorded by its target bytes; a FIFO, socket or device by its kind only,
    never opened. A regular file is opened ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK``;
    it must still be the regular file the listing saw (same device and inode)
    and hold exactly the bytes ``fstat`` announced, else the scan refuses with
    ``tree_changed_during_scan``. A folder or file that cannot be opened, listed
    or read is ``tree_unreadable``: a folder is never reported as empty. Only the
    owner-execute bit of a file counts; other mode bits, owners and times do not.
    The root itself may be reached through a link, but must be a folder.

Encoding of the digest (format ``proctor-tree-v1``)
    ``sha256`` over the header ``b"proctor-tree-v1\\n"`` followed by one record
    per entry, in ascending order of the relative path bytes::

        kind NUL exec NUL path NUL digest NUL size LF

    ``kind`` is one of `KINDS` (ASCII); ``exec`` is ``1`` or ``0``; ``path`` is
    the relative path bytes, ``/``-separated, without leading ``./``; ``digest``
    is the lowercase sha256 hex of a file's content or of a link's target bytes,
    empty for other kinds; ``size`` is the decimal byte count of a file, ``0``
    otherwise. A path cannot contain NUL and every other field is ASCII from a
    fixed alphabet without NUL or LF, so the byte string parses back in exactly
    one way.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from harness.errors import Code, Refusal, TreeRefusal

__all__ = [
    "DEFAULT_EXCLUDES",
    "KINDS",
    "TREE_FORMAT",
    "TreeDiff",
    "TreeEntry",
    "TreeSignature",
    "diff_trees",
    "display_path",
    "manifest_from_json",
    "manifest_to_json",
    "scan_tree",
    "signature_of",
    "tree_signature",
]

PathArg: TypeAlias = str | bytes | os.PathLike[str] | os.PathLike[bytes]

TREE_FORMAT: Final = "proctor-tree-v1"
"""Name of the digest encoding documented above; bump it when the encoding changes."""

DEFAULT_EXCLUDES: tuple[str, ...] = ("__pycache__/", "*.pyc", ".pytest_cache/")
"""Exclusions used when a task names none."""

KINDS: Final = ("file", "dir", "link", "fifo", "socket", "char_device", "block_device")
"""Every kind of entry a tree records."""

_CHUNK: Final = 1 << 20
_KIND_OF_FMT: Final = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "link",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char_device",
    stat.S_IFBLK: "block_device",
}
_KIND_BYTES: Final = {kind: kind.encode("ascii") for kind in KINDS}
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
_HEX: Final = re.compile(r"[0-9a-f]{64}")


def display_path(p: bytes) -> str:
    """A relative path for people: UTF-8, with undecodable bytes shown as ``\\xNN``."""
    return p.decode("utf-8", "backslashreplace")


def _utf8_or_none(p: bytes) -> str | None:
    try:
        return p.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a tree.

    Attributes:
        path: path relative to the root, ``/``-separated bytes.
        kind: one of `KINDS`.
        executable: the owner-execute bit (files only; False otherwise).
        size: content length in bytes (files only; 0 otherwise).
        digest: sha256 hex of the content (file) or the target bytes (link); "" otherwise.
        target: the link's target bytes (links only; None otherwise).
    """

    path: bytes
    kind: str
    executable: bool
    size: int
    digest: str
    target: bytes | None

    def to_json(self) -> dict[str, Any]:
        """The manifest form; ``path_hex``/``target_hex`` appear when not UTF-8."""
        out: dict[str, Any] = {
            "path": display_path(self.path),
            "kind": self.kind,
            "executable": self.executable,
            "size": self.size,
            "digest": self.digest,
        }
        if _utf8_or_none(self.path) is None:
            out["path_hex"] = self.path.hex()
        if self.target is not None:
            out["target"] = display_path(self.target)
            if _utf8_or_none(self.target) is None:
                out["target_hex"] = self.target.hex()
        return out


@dataclass(frozen=True)
class TreeSignature:
    """The digest of a tree and its totals.

    Attributes:
        digest: sha256 hex of the `TREE_FORMAT` encoding.
        entries: number of entries of every kind.
        files: number of regular files.
        bytes: total size of the regular files.
    """

    digest: str
    entries: int
    files: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """The JSON form, naming the encoding."""
        return {
            "format": TREE_FORMAT,
            "digest": self.digest,
            "entries": self.entries,
            "files": self.files,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class TreeDiff:
    """Paths added, removed and changed between two trees, each sorted by bytes."""

    added: tuple[bytes, ...]
    removed: tuple[bytes, ...]
    changed: tuple[bytes, ...]

    @property
    def empty(self) -> bool:
        """True when the two trees are identical."""
        return not (self.added or self.removed or self.changed)

    def to_json(self) -> dict[str, Any]:
        """Display paths per category."""
        return {
            "added": [display_path(p) for p in self.added],
            "removed": [display_path(p) for p in self.removed],
            "changed": [display_path(p) for p in self.changed],
        }


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
        if rules.name_any is not None and rules.name_any.match(uname):
            continue
        if is_dir and rules.name_dir is not None and rules.name_dir.match(uname):
            continue
        upath = ""
        if want_path:
            upath = urel + "/" + uname if urel else uname
            if rules.path_any is not None and rules.path_any.match(upath):
                continue
            if is_dir and rules.path_dir is not None and rules.path_dir.match(upath):
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

    Args:
        root: the workspace folder.
        excludes: the task's exclusion patterns (see the module docstring).

    Raises:
        Refusal: ``workspace_missing``, ``not_a_directory``, ``tree_unreadable``,
            ``tree_changed_during_scan`` or ``exclusion_invalid``.
    """
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
    return scan.out


def signature_of(entries: Mapping[bytes, TreeEntry]) -> TreeSignature:
    """The `TREE_FORMAT` signature of scanned (or reloaded) entries."""
    parts = [TREE_FORMAT.encode("ascii") + b"\n"]
    files = total = 0
    for key in sorted(entries):
        e = entries[key]
        if e.path != key:
            raise ValueError(f"entry keyed {key!r} has path {e.path!r}")
        if e.kind == "file":
            files += 1
            total += e.size
        parts.append(
            b"%s\0%s\0%s\0%s\0%d\n"
            % (
                _KIND_BYTES[e.kind],
                b"1" if e.executable else b"0",
                e.path,
                e.digest.encode("ascii"),
                e.size,
            )
        )
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    return TreeSignature(digest=digest, entries=len(entries), files=files, bytes=total)


def tree_signature(root: PathArg, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> TreeSignature:
    """Scan `root` and return its signature (see `scan_tree` for refusals)."""
    return signature_of(scan_tree(root, excludes))


def diff_trees(before: Mapping[bytes, TreeEntry], after: Mapping[bytes, TreeEntry]) -> TreeDiff:
    """Entries added, removed, or present in both with any field changed."""
    added = tuple(sorted(p for p in after if p not in before))
    removed = tuple(sorted(p for p in before if p not in after))
    changed = tuple(sorted(p for p in before if p in after and before[p] != after[p]))
    return TreeDiff(added=added, removed=removed, changed=changed)


# --- manifests --------------------------------------------------------------------


def manifest_to_json(entries: Mapping[bytes, TreeEntry]) -> list[dict[str, Any]]:
    """Entries as JSON objects sorted by path, for storing a baseline tree."""
    return [entries[p].to_json() for p in sorted(entries)]


def _bad(index: int, message: str) -> Refusal:
    return TreeRefusal(Code.MANIFEST_INVALID, f"entry {index}: {message}", item=index)


def _bytes_field(item: Mapping[str, Any], key: str, index: int) -> bytes:
    text = item.get(key)
    if not isinstance(text, str):
        raise _bad(index, f"{key!r} must be a string")
    hex_key = key + "_hex"
    if hex_key in item:
        hexed = item[hex_key]
        if not isinstance(hexed, str) or re.fullmatch(r"(?:[0-9a-f]{2})+", hexed) is None:
            raise _bad(index, f"{hex_key!r} must be lowercase hex")
        raw = bytes.fromhex(hexed)
        if _utf8_or_none(raw) is not None:
            raise _bad(index, f"{hex_key!r} is given for a UTF-8 value")
        if display_path(raw) != text:
            raise _bad(index, f"{key!r} does not match {hex_key!r}")
        return raw
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(index, f"{key!r} is not valid UTF-8 text") from None


def _entry_from_json(item: Any, index: int) -> TreeEntry:
    if not isinstance(item, dict):
        raise _bad(index, "not an object")
    kind = item.get("kind")
    if kind not in KINDS:
        raise _bad(index, f"unknown kind {kind!r}")
    allowed = {"path", "path_hex", "kind", "executable", "size", "digest"}
    if kind == "link":
        allowed |= {"target", "target_hex"}
    required = allowed - {"path_hex", "target_hex"}
    keys = set(item)
    if keys - allowed or required - keys:
        extra, missing = sorted(keys - allowed), sorted(required - keys)
        raise _bad(index, f"unexpected keys {extra}, missing keys {missing}")
    path = _bytes_field(item, "path", index)
    parts = path.split(b"/")
    if b"\0" in path or any(part in (b"", b".", b"..") for part in parts):
        raise _bad(index, f"not a clean relative path: {display_path(path)!r}")
    executable, size, digest = item["executable"], item["size"], item["digest"]
    if not isinstance(executable, bool):
        raise _bad(index, "'executable' must be true or false")
    if type(size) is not int or size < 0:
        raise _bad(index, "'size' must be a non-negative integer")
    if not isinstance(digest, str):
        raise _bad(index, "'digest' must be a string")
    target: bytes | None = None
    if kind == "file":
        if _HEX.fullmatch(digest) is None:
            raise _bad(index, "a file needs a lowercase sha256 hex digest")
    else:
        if executable or size:
            raise _bad(index, f"a {kind} has no executable bit or size")
        if kind == "link":
            target = _bytes_field(item, "target", index)
            if not target or b"\0" in target:
                raise _bad(index, "a link target must be non-empty and contain no NUL")
            if digest != hashlib.sha256(target).hexdigest():
                raise _bad(index, "digest does not match the link target")
        elif digest:
            raise _bad(index, f"a {kind} has no digest")
    return TreeEntry(path, kind, executable, size, digest, target)


def manifest_from_json(items: list[dict[str, Any]]) -> dict[bytes, TreeEntry]:
    """Strictly rebuild entries from `manifest_to_json` output.

    Refuses (``manifest_invalid``) anything `manifest_to_json` would not have
    written: wrong types or keys, unclean paths, bad digests, entries out of
    order or repeated, or an entry whose parent folder is not listed.
    """
    if not isinstance(items, list):
        raise TreeRefusal(Code.MANIFEST_INVALID, "a tree manifest must be a JSON array")
    out: dict[bytes, TreeEntry] = {}
    previous: bytes | None = None
    for index, item in enumerate(items):
        entry = _entry_from_json(item, index)
        if previous is not None and entry.path <= previous:
            raise _bad(index, "entries must be sorted by path bytes without repeats")
        parent = entry.path.rpartition(b"/")[0]
        if parent and (parent not in out or out[parent].kind != "dir"):
            raise _bad(index, f"parent folder {display_path(parent)!r} is not listed")
        out[entry.path] = entry
        previous = entry.path
    return out
