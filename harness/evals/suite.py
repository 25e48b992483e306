"""Eval suites on disk: the answer-stripped packet, the sealed private part, the manifest.

The manual: docs/evals.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from harness.errors import Code, EvalRefusal, Refusal
from harness.evidence.jsonio import loads_strict, read_bytes, read_json, sha256_hex
from harness.evidence.memo import ParsedMemo

__all__ = [
    "FORBIDDEN_KEYS",
    "PACKET_KEYS",
    "SUITE_KINDS",
    "SUITE_SCHEMA",
    "Packet",
    "PacketItem",
    "PrivateItem",
    "Suite",
    "forbidden_key",
    "load_packet",
    "load_private",
    "load_suite",
    "parse_private_lines",
    "suite_kind",
]

SUITE_SCHEMA: Final = "proctor-suite.v1"

SUITE_KINDS: Final = ("completion", "repo_task")
"""The kinds a suite may declare in SUITE.json (``kind``): how an item is attempted and scored.

``completion``: one request, the answer completes ``entry_point`` (HumanEval); ``repo_task``: a bug fix
in a workspace (a folder in the repository, or a snapshot made from the private part), hidden tests.
"""

FORBIDDEN_KEYS: Final = frozenset(
    {
        "canonical_solution",
        "test",
        "tests",
        "answer",
        "answers",
        "oracle",
        "reference",
        "solution",
        "expected",
        "expected_output",
        "hidden",
        "private",
        "check",
        "verifier",
    }
)
"""Keys that carry answers or oracles and may appear nowhere in a packet, at any depth.

A key is compared after lowercasing and dropping every character that is not
a letter or digit, so ``canonicalSolution``, ``Canonical-Solution`` and
``EXPECTED_OUTPUT`` are refused as well. ``verifier`` is here because the
private record of a repository task holds the verifier's argv and hidden
tests under it.
"""

PACKET_KEYS: Final = frozenset({"item", "prompt", "entry_point", "workspace", "snapshot", "metadata"})
"""The only keys a packet line may have."""

_NORMALISED_FORBIDDEN: Final = {re.sub(r"[^a-z0-9]", "", k): k for k in FORBIDDEN_KEYS}
_PACKET_CODES: Final = (Code.PACKET_INVALID, Code.PACKET_BLANK_RECORD)
_PRIVATE_CODES: Final = (Code.PRIVATE_INVALID, Code.PRIVATE_INVALID)
_PRIVATE_MARKS: Final = frozenset({"canonical_solution", "test", "hidden", "verifier"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_SNAPSHOT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class PacketItem:
    """One item as a model may see it.

    Attributes:
        item: the item id, unique in the suite (e.g. ``HumanEval/0``).
        prompt: the text the model is given (before any arm's template).
        entry_point: the function the answer must define (function-completion items).
        workspace: the task's workspace folder, relative to the repository root (task items).
        metadata: public facts about the item (e.g. ``source_index``, ``features``).
        snapshot: the private tree the task's workspace is made from (mutant items: `materialize`).
    """

    item: str
    prompt: str
    entry_point: str | None
    workspace: str | None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    snapshot: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"item": self.item, "prompt": self.prompt, "metadata": dict(self.metadata)}
        if self.entry_point is not None:
            out["entry_point"] = self.entry_point
        if self.workspace is not None:
            out["workspace"] = self.workspace
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot
        return out


@dataclass(frozen=True)
class Packet:
    """A validated packet: its items in file order, the sha256 of its bytes, where it was read."""

    items: tuple[PacketItem, ...]
    sha256: str
    path: str

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i.item for i in self.items)

    def get(self, item: str) -> PacketItem:
        """The item with id `item`; `suite_item_unknown` if there is none."""
        for it in self.items:
            if it.item == item:
                return it
        raise EvalRefusal(Code.SUITE_ITEM_UNKNOWN, f"no item {item!r} in the packet", self.path)

    def __iter__(self) -> Iterator[PacketItem]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class PrivateItem:
    """One item's private record: what only the verifier and the simulator read.

    Attributes:
        item: the item id.
        canonical_solution: the reference completion (HumanEval items).
        test: the hidden test source defining ``check(candidate)`` (HumanEval items).
        entry_point: the function ``check`` is called with (HumanEval items).
        record: the whole record as read (task items keep their verifier here).
    """

    item: str
    canonical_solution: str | None
    test: str | None
    entry_point: str | None
    record: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Suite:
    """A suite folder read and cross-checked: manifest, packet, private part, and its kind (`SUITE_KINDS`)."""

    name: str
    folder: str
    manifest: Mapping[str, Any]
    packet: Packet
    private: Mapping[str, PrivateItem]
    kind: str


def forbidden_key(key: str) -> str | None:
    """The `FORBIDDEN_KEYS` entry `key` stands for, or None if it is allowed."""
    return _NORMALISED_FORBIDDEN.get(re.sub(r"[^a-z0-9]", "", key.lower()))


def _find_forbidden(value: Any) -> tuple[str, str] | None:
    """(key, JSON path) of the first forbidden key anywhere in `value`, depth first in key order."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            children: list[tuple[Any, str]] = []
            for key, child in node.items():
                at = f"{where}.{key}" if where else key
                if forbidden_key(key) is not None:
                    return key, at
                children.append((child, at))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(reversed([(child, f"{where}[{i}]") for i, child in enumerate(node)]))
    return None


def _split_lines(raw: bytes, where: str, invalid: Code) -> tuple[list[bytes], bool]:
    """The file's lines without their newlines, and whether the last one lacks its newline (torn).

    Each line is then walked in file order, so the first problem in the file
    is the one reported; a torn last line is refused after the walk.
    """
    if not raw:
        raise Refusal(invalid, "the file is empty: no items", where)
    torn = not raw.endswith(b"\n")
    return (raw if torn else raw[:-1]).split(b"\n"), torn


def _refuse_torn(count: int, where: str, invalid: Code) -> NoReturn:
    raise Refusal(invalid, f"line {count}: the last line has no newline (torn or hand-edited)", where, line=count)


def _raw_record(data: bytes, number: int, where: str, codes: tuple[Code, Code]) -> dict[str, Any]:
    """One line decoded strictly as a non-empty JSON object, or a refusal (`codes`: invalid, blank)."""
    invalid, blank = codes
    if not data.strip():
        raise Refusal(blank, f"line {number}: a blank line", where, line=number)
    try:
        value = loads_strict(data, path=where, expect_object=False)
    except Refusal as exc:
        raise Refusal(invalid, f"line {number}: {exc.message}", where, line=number, cause=exc.code) from None
    if not isinstance(value, dict):
        raise Refusal(
            invalid,
            f"line {number}: expected a JSON object, found {type(value).__name__}",
            where,
            line=number,
        )
    if not value:
        raise Refusal(blank, f"line {number}: an empty record", where, line=number)
    return value


def _walk_packet(raw: bytes, where: str) -> list[dict[str, Any]]:
    """Every record decoded and checked for answers, blanks and duplicates, before any typed parsing."""
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    lines, torn = _split_lines(raw, where, Code.PACKET_INVALID)
    for number, data in enumerate(lines, 1):
        record = _raw_record(data, number, where, _PACKET_CODES)
        found = _find_forbidden(record)
        if found is not None:
            key, at = found
            private = " (a private item record?)" if at == key and forbidden_key(key) in _PRIVATE_MARKS else ""
            raise EvalRefusal(
                Code.PACKET_FORBIDDEN_KEY,
                f"line {number}: the key {at!r} carries an answer or an oracle{private}; "
                "a packet holds no answers",
                where,
                line=number,
                key=key,
                at=at,
            )
        item = record.get("item")
        if not isinstance(item, str) or not item.strip():
            raise EvalRefusal(
                Code.PACKET_INVALID, f"line {number}: the item id must be a non-empty string", where, line=number
            )
        if item in seen:
            raise EvalRefusal(
                Code.PACKET_DUPLICATE_ITEM,
                f"line {number}: item {item!r} already appeared on line {seen[item]}",
                where,
                line=number,
                item=item,
            )
        seen[item] = number
        records.append(record)
    if torn:
        _refuse_torn(len(lines), where, Code.PACKET_INVALID)
    return records


def _packet_item(record: dict[str, Any], number: int, where: str) -> PacketItem:
    def bad(message: str) -> Refusal:
        return EvalRefusal(Code.PACKET_INVALID, f"line {number}: {message}", where, line=number)

    unknown = sorted(set(record) - PACKET_KEYS)
    if unknown:
        raise bad(f"unknown keys: {', '.join(unknown)} (allowed: {', '.join(sorted(PACKET_KEYS))})")
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("prompt must be a non-empty string")
    entry_point = record.get("entry_point")
    if entry_point is not None and (not isinstance(entry_point, str) or not _IDENTIFIER.match(entry_point)):
        raise bad("entry_point must be a Python identifier")
    workspace = record.get("workspace")
    if workspace is not None:
        parts = workspace.split("/") if isinstance(workspace, str) else []
        if not parts or workspace.startswith("/") or ".." in parts or "" in parts or "\x00" in workspace:
            raise bad("workspace must be a relative path without '..'")
    snapshot = record.get("snapshot")
    if snapshot is not None and (not isinstance(snapshot, str) or not _SNAPSHOT.match(snapshot)):
        raise bad("snapshot must be a name of letters, digits, '.', '_' and '-'")
    if entry_point is None and workspace is None and snapshot is None:
        raise bad("an item needs an entry_point, a workspace or a snapshot")
    metadata = record.get("metadata", {})
    if not isinstance(metadata, dict):
        raise bad("metadata must be an object")
    return PacketItem(record["item"], prompt, entry_point, workspace, metadata, snapshot)


def load_packet(path: str | os.PathLike[str], expected_sha256: str | None = None) -> Packet:
    """Read a packet strictly: one read, hashed; every raw record walked; then typed.

    Args:
        path: the ``packet.jsonl`` file.
        expected_sha256: the registered sha256 of its bytes; None checks nothing.

    Returns:
        The items in file order with the sha256 of the bytes read.
    """
    where = os.fspath(path)
    raw = read_bytes(where)
    digest = sha256_hex(raw)
    if expected_sha256 is not None and digest != expected_sha256:
        raise EvalRefusal(
            Code.PACKET_SHA256_MISMATCH,
            f"the packet's sha256 is {digest}, the registered one {expected_sha256}",
            where,
            sha256=digest,
            expected_sha256=expected_sha256,
        )
    # the same bytes read from the same path parse to the same packet (docs/evals.md, "Reading a packet")
    return _PACKETS.get((digest, where), lambda: _walked(raw, digest, where))


def _walked(raw: bytes, digest: str, where: str) -> Packet:
    records = _walk_packet(raw, where)
    items = tuple(_packet_item(record, number, where) for number, record in enumerate(records, 1))
    return Packet(items=items, sha256=digest, path=where)


# Packets already walked, by (sha256 of the bytes read, path): an audit or a plan reads the same packet once per
# stage; the bytes are read and hashed every time, so a changed file is walked again.
_PACKETS: ParsedMemo[tuple[str, str], Packet] = ParsedMemo()


def parse_private_lines(raw: bytes, where: str) -> dict[str, PrivateItem]:
    """Private records by item id (strict lines; refuses blanks, duplicates, bad fields naming the line)."""
    out: dict[str, PrivateItem] = {}
    lines, torn = _split_lines(raw, where, Code.PRIVATE_INVALID)
    if torn:
        _refuse_torn(len(lines), where, Code.PRIVATE_INVALID)
    for number, data in enumerate(lines, 1):
        record = _raw_record(data, number, where, _PRIVATE_CODES)

        def bad(message: str, at: int = number) -> Refusal:
            return EvalRefusal(Code.PRIVATE_INVALID, f"line {at}: {message}", where, line=at)

        item = record.get("item")
        if not isinstance(item, str) or not item.strip():
            raise bad("the item id must be a non-empty string")
        if item in out:
            raise bad(f"item {item!r} appears twice")
        texts: dict[str, str | None] = {}
        for key in ("canonical_solution", "test", "entry_point"):
            value = record.get(key)
            if value is not None and not isinstance(value, str):
                raise bad(f"{key} must be a string")
            texts[key] = value
        out[item] = PrivateItem(item, texts["canonical_solution"], texts["test"], texts["entry_point"], record)
    return out


def _manifest(folder: str) -> tuple[dict[str, Any], str]:
    path = os.path.join(folder, "SUITE.json")
    manifest: dict[str, Any] = read_json(path).value

    def bad(message: str) -> Refusal:
        return EvalRefusal(Code.SUITE_INVALID, message, path)

    if manifest.get("schema") != SUITE_SCHEMA:
        raise bad(f"expected schema {SUITE_SCHEMA}")
    for key in ("packet_sha256", "private_sha256"):
        if not isinstance(manifest.get(key), str) or not _SHA.match(manifest[key]):
            raise bad(f"{key} must be 64 lowercase hex digits")
    if not isinstance(manifest.get("suite"), str) or not manifest["suite"]:
        raise bad("suite must be a non-empty string")
    items = manifest.get("items")
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        raise bad("items must be a positive integer")
    kind = manifest.get("kind")
    if not isinstance(kind, str):
        raise bad(f"kind must be one of {', '.join(SUITE_KINDS)}")
    if kind not in SUITE_KINDS:
        raise EvalRefusal(
            Code.SUITE_KIND_UNKNOWN, f"unknown suite kind {kind!r} (known: {', '.join(SUITE_KINDS)})", path, kind=kind
        )
    return manifest, path


def suite_kind(suite_dir: str | os.PathLike[str]) -> str:
    """The suite's kind from its SUITE.json (`SUITE_KINDS`); refuses what reading the manifest refuses."""
    manifest, _ = _manifest(os.fspath(suite_dir))
    return str(manifest["kind"])


def load_private(suite_dir: str | os.PathLike[str]) -> dict[str, PrivateItem]:
    """The private part of a suite, by item id, checked against ``private_sha256`` in SUITE.json."""
    folder = os.fspath(suite_dir)
    manifest, _ = _manifest(folder)
    path = os.path.join(folder, "private", "items.jsonl")
    raw = read_bytes(path)
    digest = sha256_hex(raw)
    if digest != manifest["private_sha256"]:
        raise EvalRefusal(
            Code.PRIVATE_SHA256_MISMATCH,
            f"the private part's sha256 is {digest}, SUITE.json seals {manifest['private_sha256']}",
            path,
        )
    return parse_private_lines(raw, path)


def load_suite(suite_dir: str | os.PathLike[str], packet_sha256: str | None = None) -> Suite:
    """A whole suite: the manifest, the packet (sealed by SUITE.json and optionally by `packet_sha256`)
    and the private part, with the same item ids on both sides (else ``private_items_mismatch``)."""
    folder = os.fspath(suite_dir)
    manifest, manifest_path = _manifest(folder)
    if packet_sha256 is not None and packet_sha256 != manifest["packet_sha256"]:
        raise EvalRefusal(
            Code.PACKET_SHA256_MISMATCH,
            f"SUITE.json seals packet {manifest['packet_sha256']}, the registered one is {packet_sha256}",
            manifest_path,
        )
    packet = load_packet(os.path.join(folder, "packet.jsonl"), manifest["packet_sha256"])
    private = load_private(folder)
    if set(private) != set(packet.ids) or len(packet) != manifest["items"]:
        only_packet = sorted(set(packet.ids) - set(private))[:5]
        only_private = sorted(set(private) - set(packet.ids))[:5]
        raise EvalRefusal(
            Code.PRIVATE_ITEMS_MISMATCH,
            f"packet and private part disagree: only in the packet {only_packet}, only in the private part "
            f"{only_private}; SUITE.json says {manifest['items']} items, the packet has {len(packet)}",
            folder,
        )
    _check_kind(manifest["kind"], packet, private, folder)
    for item in packet:
        theirs = private[item.item].entry_point
        if theirs is not None and theirs != item.entry_point:
            raise EvalRefusal(
                Code.PRIVATE_ITEMS_MISMATCH,
                f"item {item.item!r}: the packet's entry point is {item.entry_point!r}, the private part's {theirs!r}",
                folder,
            )
    return Suite(manifest["suite"], folder, manifest, packet, private, manifest["kind"])


def _check_kind(kind: str, packet: Packet, private: Mapping[str, PrivateItem], folder: str) -> None:
    """Every item is one its suite's kind can attempt (`suite_invalid` naming the first that is not).

    A ``completion`` item needs an entry point and a hidden test; a ``repo_task`` item a workspace
    or a ``snapshot`` in the packet with a ``snapshot`` in its private record (`harness.evals.mutants.materialize`).
    """
    for item in packet:
        record = private[item.item]
        if kind == "completion":
            ok = item.entry_point is not None and record.test is not None
            need = "an entry_point and a hidden test"
        else:
            snapshot = isinstance(record.record.get("snapshot"), dict)
            ok = item.entry_point is None and (item.workspace is not None or (item.snapshot is not None and snapshot))
            need = "a workspace (or a snapshot, with its private record) and no entry_point"
        if not ok:
            raise EvalRefusal(
                Code.SUITE_INVALID, f"item {item.item!r}: a {kind} item needs {need}", folder, item=item.item, kind=kind
            )
