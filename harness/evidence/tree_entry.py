"""Tree entries, the tree signature and manifests: the records of `harness.evidence.tree`'s scan.

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

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, Refusal, TreeRefusal

__all__ = [
    "KINDS",
    "TREE_FORMAT",
    "TreeDiff",
    "TreeEntry",
    "TreeSignature",
    "diff_trees",
    "display_path",
    "manifest_from_json",
    "manifest_to_json",
    "signature_of",
]

TREE_FORMAT: Final = "proctor-tree-v1"
"""Name of the digest encoding documented above; bump it when the encoding changes."""

KINDS: Final = ("file", "dir", "link", "fifo", "socket", "char_device", "block_device")
"""Every kind of entry a tree records."""

_KIND_BYTES: Final = {kind: kind.encode("ascii") for kind in KINDS}
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


def diff_trees(before: Mapping[bytes, TreeEntry], after: Mapping[bytes, TreeEntry]) -> TreeDiff:
    """Entries added, removed, or present in both with any field changed."""
    added = tuple(sorted(p for p in after if p not in before))
    removed = tuple(sorted(p for p in before if p not in after))
    changed = tuple(sorted(p for p in before if p in after and before[p] != after[p]))
    return TreeDiff(added=added, removed=removed, changed=changed)


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
