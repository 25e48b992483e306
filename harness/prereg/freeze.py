"""The preregistration folder (`prereg/<study>/`): freeze, amend, and the check every later command runs.

What the folder holds (top level only)::

    design.toml       the design (`harness.prereg.design`), required
    PREREG.md         the human text, required: UTF-8, not blank
    systems.json      the frozen system manifest, required:
                      {"study": id, "systems": [{"slot", "provider", "model", "setting"}, ...]}
                      exactly the design's systems, in the design's order
    catalog.toml      optional: when present, every system's model must be in it
                      with the design's provider and pricing key (the plan reads it)
    any other file    allowed and hashed (notes, figures): it is part of what was registered
    FROZEN.json       written by freeze and amend (below); never hashed into itself
    AMENDMENTS.jsonl  the chained amendment log, written by amend; not hashed into FROZEN.json

Entries: only visible regular files. A link (even to a regular file: what
it points to could change without the folder changing), a subfolder, a
FIFO, device or socket, a name starting with '.', or a name that is not
UTF-8 is refused at freeze and amend (`prereg_unexpected_entry`) and counts
as a change (added or changed) after a freeze.

`FROZEN.json` (canonical JSON and a newline, written atomically)::

    {"schema": "proctor-frozen.v1", "study": id, "frozen_at": ISO-8601 UTC,
     "files": {name: sha256 of its bytes, ...}, "amendments": n,
     "amendments_head": sha256 of the amendment log's last line, or null}

`frozen_at` is the first freeze's time and is kept by amendments: the date
a preregistration was registered must not move. `amendments_head` binds the
log to the freeze: without it the last amendment's line (its reason, its
date) could be edited with nothing after it in the chain to notice. Each
amendment is a line of
`AMENDMENTS.jsonl`, a `ChainedLog` with seed `proctor-amendments:<study>`::

    {"amendment": n, "at": ISO-8601 UTC, "reason": text,
     "changed": [{"path", "change": "added"|"changed"|"removed", "old": sha256|null, "new": sha256|null}]}

after which FROZEN.json is rewritten with the new hashes and count. If a
crash falls between the two writes, `amend` completes the re-freeze when the
folder is exactly as the logged amendment says (and refuses otherwise).
Freeze and amend hold an exclusive `flock` on the folder itself, the checker
a shared one, so nothing is read half-amended and no lock file is needed.

`check_frozen` replays what it can: amendment numbers 1..n, non-decreasing
times, each change's `old` hash equal to the `new` hash of the last earlier
amendment that touched that file, and the last hash of every amended file
equal to FROZEN.json's.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from harness.errors import Code, InputRefusal, LogRefusal, PreregRefusal, Refusal
from harness.evidence.chain import ChainedLog, read_log
from harness.evidence.clock import Clock, utc_iso
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import (
    canonical_bytes,
    canonical_line,
    loads_strict,
    read_bytes,
    sha256_hex,
)
from harness.prereg.design import Design, design_from_bytes
from harness.providers.catalog import Catalog, parse_catalog

__all__ = [
    "AMENDMENTS_NAME",
    "FROZEN_NAME",
    "FROZEN_SCHEMA",
    "REQUIRED_FILES",
    "Amendment",
    "FileChange",
    "FrozenPrereg",
    "Prepared",
    "amend",
    "amendments_seed",
    "check_frozen",
    "check_prereg",
    "freeze",
    "prepare",
    "resolve_packet",
]

FROZEN_NAME: Final = "FROZEN.json"
AMENDMENTS_NAME: Final = "AMENDMENTS.jsonl"
FROZEN_SCHEMA: Final = "proctor-frozen.v1"
REQUIRED_FILES: Final = ("design.toml", "PREREG.md", "systems.json")
CATALOG_NAME: Final = "catalog.toml"
_MANAGED: Final = (FROZEN_NAME, AMENDMENTS_NAME)
_SHA: Final = re.compile(r"^[0-9a-f]{64}$")
_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_LOCK_WAIT_S: Final = 10.0
_CHANGES: Final = ("added", "changed", "removed")
_FROZEN_KEYS: Final = ("schema", "study", "frozen_at", "files", "amendments", "amendments_head")


def amendments_seed(study: str) -> str:
    """The seed of a study's amendment log (it names the study, so logs cannot be swapped)."""
    return f"proctor-amendments:{study}"


# --------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class FileChange:
    """One file added, changed or removed by an amendment (a hash is None where the file is absent)."""

    path: str
    change: str
    old: str | None
    new: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class Amendment:
    """One dated amendment with its reason and the files it changed."""

    number: int
    at: str
    reason: str
    changed: tuple[FileChange, ...]
    line_sha256: str = ""
    """The sha256 of its line in the log (empty before it is written)."""

    def to_json(self) -> dict[str, Any]:
        return {"amendment": self.number, "at": self.at, "reason": self.reason,
                "changed": [c.to_json() for c in self.changed]}


@dataclass(frozen=True)
class FrozenPrereg:
    """A preregistration checked against its freeze: what every later command works from.

    Attributes:
        path: the folder (absolute).
        design: the validated design.
        systems: the frozen system manifest entries, in order.
        systems_sha256: the sha256 of systems.json.
        frozen_sha256: the sha256 of FROZEN.json's bytes (results record it).
        frozen_at: when it was first frozen.
        files: every hashed file's sha256 by name.
        amendments: every amendment, in order.
        catalog_sha256: the sha256 of catalog.toml, or None when the folder holds none.
    """

    path: str
    design: Design
    systems: tuple[dict[str, str], ...]
    systems_sha256: str
    frozen_sha256: str
    frozen_at: str
    files: dict[str, str]
    amendments: tuple[Amendment, ...]
    catalog_sha256: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "study": self.design.study_id, "frozen_sha256": self.frozen_sha256,
                "frozen_at": self.frozen_at, "files": dict(self.files),
                "amendments": [a.to_json() for a in self.amendments]}


# --------------------------------------------------------------------------
# Reading the folder


@dataclass(frozen=True)
class _Contents:
    files: dict[str, bytes]  # every visible regular file except the managed ones
    odd: dict[str, str]  # entries that may not be there: name -> what they are
    managed: frozenset[str]  # which of FROZEN.json / AMENDMENTS.jsonl exist

    def hashes(self) -> dict[str, str]:
        return {name: sha256_hex(data) for name, data in self.files.items()}


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "a special file"


def _shown(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _folder(path: str | os.PathLike[str]) -> str:
    folder = os.path.abspath(os.fspath(path))
    if not os.path.lexists(folder):
        raise InputRefusal(Code.FOLDER_MISSING, "no such preregistration folder", folder)
    if not os.path.isdir(folder):
        raise InputRefusal(Code.NOT_A_FOLDER, "a preregistration is a folder", folder)
    return folder


def _read_folder(folder: str) -> _Contents:
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise InputRefusal(Code.FOLDER_UNREADABLE, exc.strerror or str(exc), folder) from None
    files: dict[str, bytes] = {}
    odd: dict[str, str] = {}
    managed: set[str] = set()
    for name in names:
        where = os.path.join(folder, name)
        try:
            st = os.lstat(where)
        except FileNotFoundError:  # removed while listing: it is not there
            continue
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            odd[_shown(name)] = "a name that is not UTF-8"
            continue
        if not stat.S_ISREG(st.st_mode):
            odd[name] = _kind(st.st_mode)
        elif name in _MANAGED:
            managed.add(name)
        elif name.startswith("."):
            odd[name] = "a hidden file"
        else:
            files[name] = read_bytes(where)
    return _Contents(files, odd, frozenset(managed))


def _refuse_odd(folder: str, contents: _Contents) -> None:
    if contents.odd:
        listed = "; ".join(f"{name} ({what})" for name, what in sorted(contents.odd.items()))
        raise PreregRefusal(Code.PREREG_UNEXPECTED_ENTRY, f"only visible regular files may be registered: {listed}",
                      folder, entries=sorted(contents.odd))


@contextmanager
def _locked(folder: str, *, exclusive: bool) -> Iterator[None]:
    """Hold a `flock` on the folder itself (no lock file inside what is hashed)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + (0.0 if exclusive else _LOCK_WAIT_S)
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PreregRefusal(Code.PREREG_LOCKED, "another proctor command is freezing, amending or checking it",
                                  folder) from None
                time.sleep(0.02)
            except OSError as exc:
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    break  # a file system without flock
                raise
        yield
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# Validating what is registered


@dataclass(frozen=True)
class Prepared:
    """A folder's registered files, validated: what a freeze would record.

    Attributes:
        path: the folder.
        design: the validated design.
        systems: the manifest entries, in order.
        systems_sha256: the sha256 of systems.json.
        catalog: the folder's catalog, or None.
        files: every hashed file's sha256 by name.
    """

    path: str
    design: Design
    systems: tuple[dict[str, str], ...]
    systems_sha256: str
    catalog: Catalog | None
    files: dict[str, str]


def _validate(folder: str, contents: _Contents) -> Prepared:
    missing = [name for name in REQUIRED_FILES if name not in contents.files]
    if missing:
        raise InputRefusal(Code.FILE_MISSING, f"a preregistration needs {', '.join(missing)}",
                      os.path.join(folder, missing[0]))
    design = design_from_bytes(contents.files["design.toml"], os.path.join(folder, "design.toml"))
    text_path = os.path.join(folder, "PREREG.md")
    try:
        text = contents.files["PREREG.md"].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", text_path) from None
    if not text.strip():
        raise PreregRefusal(Code.PREREG_TEXT_EMPTY, "PREREG.md holds no text", text_path)
    raw = contents.files["systems.json"]
    systems = _check_manifest(loads_strict(raw, path=os.path.join(folder, "systems.json")), design,
                              os.path.join(folder, "systems.json"))
    catalog = None
    if CATALOG_NAME in contents.files:
        catalog = parse_catalog(contents.files[CATALOG_NAME], os.path.join(folder, CATALOG_NAME))
        _check_catalog(catalog, design)
    return Prepared(folder, design, systems, sha256_hex(raw), catalog, contents.hashes())


_MANIFEST_KEYS: Final = ("slot", "provider", "model", "setting")


def _check_manifest(value: Any, design: Design, path: str) -> tuple[dict[str, str], ...]:
    """systems.json must be exactly the design's systems: same study, order, provider, model, setting."""

    def bad(message: str) -> Refusal:
        return PreregRefusal(Code.SYSTEMS_MANIFEST_INVALID, message, path)

    if set(value) != {"study", "systems"}:
        raise bad(f"expected exactly the keys study and systems, found {', '.join(sorted(value)) or 'none'}")
    entries = value["systems"]
    if not isinstance(value["study"], str) or not isinstance(entries, list) or not entries:
        raise bad("study must be a string and systems a non-empty list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != set(_MANIFEST_KEYS):
            raise bad(f"systems[{i}] must be an object with exactly {', '.join(_MANIFEST_KEYS)}")
        if not all(isinstance(entry[k], str) for k in _MANIFEST_KEYS):
            raise bad(f"systems[{i}]: every field must be a string")
    frozen = [{k: str(e[k]) for k in _MANIFEST_KEYS} for e in entries]
    slots = [e["slot"] for e in frozen]
    if len(set(slots)) != len(slots):
        raise bad("two systems share a slot")
    problems: list[str] = []
    if value["study"] != design.study_id:
        problems.append(f"systems.json is for study {value['study']!r}, design.toml for {design.study_id!r}")
    registered = {s.slot: s.manifest() for s in design.systems}
    missing = [s for s in registered if s not in slots]
    extra = [s for s in slots if s not in registered]
    if missing:
        problems.append(f"missing from systems.json: {', '.join(missing)}")
    if extra:
        problems.append(f"not in design.toml: {', '.join(extra)}")
    shared_frozen = [s for s in slots if s in registered]
    shared_design = [s for s in registered if s in slots]
    if shared_frozen != shared_design:
        problems.append(f"order: systems.json lists {', '.join(shared_frozen)}; "
                        f"design.toml registers {', '.join(shared_design)}")
    for entry in frozen:
        want = registered.get(entry["slot"])
        for key in _MANIFEST_KEYS[1:]:
            if want is not None and entry[key] != want[key]:
                problems.append(f"system {entry['slot']}: {key} is {entry[key]!r} in systems.json, "
                                f"{want[key]!r} in design.toml")
    if problems:
        raise PreregRefusal(Code.SYSTEMS_MANIFEST_MISMATCH, "; ".join(problems), path, problems=problems)
    return tuple(frozen)


def _check_catalog(catalog: Catalog, design: Design) -> None:
    problems: list[str] = []
    for system in design.systems:
        model = catalog.get(system.model)
        if model is None:
            problems.append(f"system {system.slot}: model {system.model!r} is not in catalog.toml")
            continue
        if model.provider != system.provider:
            problems.append(f"system {system.slot}: provider {system.provider!r} in design.toml, "
                            f"{model.provider!r} in catalog.toml")
        if model.pricing_key != system.pricing_key:
            problems.append(f"system {system.slot}: pricing key {system.pricing_key!r} in design.toml, "
                            f"{model.pricing_key!r} in catalog.toml")
    if problems:
        raise PreregRefusal(Code.SYSTEMS_CATALOG_MISMATCH, "; ".join(problems), catalog.path, problems=problems)


def resolve_packet(design: Design) -> tuple[int, str]:
    """The number of items in the design's packet and its sha256; refuses too small a packet."""
    from harness.evals.suite import load_packet

    packet = load_packet(design.packet_path, design.packet_sha256)
    if design.draw_items > len(packet.items):
        raise PreregRefusal(Code.DRAW_EXCEEDS_PACKET,
                      f"the design draws {design.draw_items} items; the packet holds {len(packet.items)}",
                      design.packet_path)
    return len(packet.items), packet.sha256


def prepare(path: str | os.PathLike[str]) -> Prepared:
    """Validate a folder as freeze would (entries, design, systems, catalog, text), without writing."""
    folder = _folder(path)
    contents = _read_folder(folder)
    _refuse_odd(folder, contents)
    return _validate(folder, contents)


# --------------------------------------------------------------------------
# FROZEN.json and the amendment log


@dataclass(frozen=True)
class _Frozen:
    study: str
    frozen_at: str
    files: dict[str, str]
    amendments: int
    head: str | None
    sha256: str


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _read_frozen(folder: str) -> _Frozen:
    path = os.path.join(folder, FROZEN_NAME)
    if not os.path.lexists(path):
        raise PreregRefusal(Code.PREREG_NOT_FROZEN, "no FROZEN.json: run proctor prereg freeze first", folder)

    def bad(message: str) -> Refusal:
        return PreregRefusal(Code.FROZEN_INVALID, message, path)

    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise bad("FROZEN.json must be a regular file, not a link or anything else")
    raw = read_bytes(path)
    value = loads_strict(raw, path=path)
    if set(value) != set(_FROZEN_KEYS):
        raise bad(f"expected exactly the keys {', '.join(_FROZEN_KEYS)}")
    if value["schema"] != FROZEN_SCHEMA:
        raise bad(f"schema must be {FROZEN_SCHEMA!r}")
    if canonical_line(value) != raw:
        raise bad("not in canonical form (it is written by proctor, never by hand)")
    files, count = value["files"], value["amendments"]
    if not isinstance(value["study"], str) or _epoch(value["frozen_at"]) is None:
        raise bad("study must be a string and frozen_at an ISO-8601 UTC time")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise bad("amendments must be a count")
    head = value["amendments_head"]
    if (head is None) != (count == 0) or not (head is None or (isinstance(head, str) and _SHA.match(head))):
        raise bad("amendments_head must be a sha256 hex digest exactly when there are amendments")
    if not isinstance(files, dict) or not all(
        isinstance(h, str) and _SHA.match(h) and n not in _MANAGED and "/" not in n for n, h in files.items()
    ):
        raise bad("files must map file names to sha256 hex digests")
    return _Frozen(value["study"], value["frozen_at"], dict(files), count, head, sha256_hex(raw))


def _parse_amendment(record: dict[str, Any], index: int, path: str) -> Amendment:
    """One log record, validated (the log's lines are canonical, so its line's sha256 is recomputed)."""

    def bad(message: str) -> Refusal:
        return PreregRefusal(Code.AMENDMENTS_INVALID, f"line {index}: {message}", path, line=index)

    allowed = {"amendment", "at", "reason", "changed", "prev"} | ({"seed"} if index == 1 else set())
    if not {"amendment", "at", "reason", "changed", "prev"} <= set(record) <= allowed:
        raise bad("expected exactly amendment, at, reason, changed")
    if type(record["amendment"]) is not int or record["amendment"] != index:
        raise bad(f"amendment must be {index} (numbered 1, 2, ... in order)")
    if _epoch(record["at"]) is None or not isinstance(record["reason"], str) or not record["reason"].strip():
        raise bad("at must be an ISO-8601 UTC time and reason a non-empty text")
    changes = record["changed"]
    if not isinstance(changes, list) or not changes:
        raise bad("changed must be a non-empty list")
    out: list[FileChange] = []
    for change in changes:
        if not isinstance(change, dict) or set(change) != {"path", "change", "old", "new"}:
            raise bad("each change must have exactly path, change, old, new")
        kind, old, new = change["change"], change["old"], change["new"]
        if not isinstance(change["path"], str) or kind not in _CHANGES:
            raise bad("a change names a path and is added, changed or removed")
        if not all(h is None or (isinstance(h, str) and _SHA.match(h)) for h in (old, new)):
            raise bad("old and new must be sha256 hex digests or null")
        if (old is None) != (kind == "added") or (new is None) != (kind == "removed") or old == new:
            raise bad(f"{change['path']}: old and new do not describe {kind!r}")
        out.append(FileChange(change["path"], kind, old, new))
    if len({c.path for c in out}) != len(out):
        raise bad("a path is changed twice in one amendment")
    return Amendment(index, record["at"], record["reason"], tuple(out), sha256_hex(canonical_bytes(record)))


def _read_amendments(folder: str, study: str) -> list[Amendment]:
    path = os.path.join(folder, AMENDMENTS_NAME)
    if not os.path.lexists(path):
        return []
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise PreregRefusal(Code.AMENDMENTS_INVALID, "AMENDMENTS.jsonl must be a regular file, not a link or anything else",
                      path)
    records = read_log(path, amendments_seed(study))
    amendments = [_parse_amendment(r, i, path) for i, r in enumerate(records, 1)]
    last = 0.0
    for a in amendments:
        at = _epoch(a.at) or 0.0
        if at < last:
            raise PreregRefusal(Code.AMENDMENTS_INVALID, f"line {a.number}: dated before the amendment above it", path,
                          line=a.number)
        last = at
    return amendments


def _apply(files: Mapping[str, str], amendment: Amendment) -> dict[str, str] | None:
    """The hashes after `amendment`, or None when its `old` hashes are not `files`'."""
    out = dict(files)
    for c in amendment.changed:
        if out.get(c.path) != c.old:
            return None
        if c.new is None:
            del out[c.path]
        else:
            out[c.path] = c.new
    return out


def _check_replay(amendments: list[Amendment], frozen: _Frozen, path: str) -> None:
    latest: dict[str, str | None] = {}
    for a in amendments:
        for c in a.changed:
            if c.path in latest and latest[c.path] != c.old:
                raise PreregRefusal(Code.AMENDMENTS_INVALID, f"line {a.number}: {c.path}'s old hash is not the one "
                              "the amendment before recorded", path, line=a.number)
            latest[c.path] = c.new
    wrong = sorted(p for p, h in latest.items() if frozen.files.get(p) != h)
    if wrong:
        raise PreregRefusal(Code.AMENDMENTS_INVALID, f"FROZEN.json disagrees with the last amendment of: {', '.join(wrong)}",
                      path)
    head = amendments[-1].line_sha256 if amendments else None
    if head != frozen.head:
        raise PreregRefusal(Code.AMENDMENTS_INVALID, "the amendment log's last line is not the one FROZEN.json recorded "
                      "(an amendment was edited)", path)


def _diff(old: Mapping[str, str], new: Mapping[str, str | None]) -> list[FileChange]:
    """Changes from `old` to `new` (a None hash in `new`: present but not a regular file)."""
    out: list[FileChange] = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(FileChange(name, "removed", old[name], None))
        elif name not in old:
            out.append(FileChange(name, "added", None, new[name]))
        elif old[name] != new[name]:
            out.append(FileChange(name, "changed", old[name], new[name]))
    return out


def _write_frozen(
    folder: str, study: str, frozen_at: str, files: Mapping[str, str], amendments: list[Amendment]
) -> dict[str, Any]:
    record = {"schema": FROZEN_SCHEMA, "study": study, "frozen_at": frozen_at, "files": dict(files),
              "amendments": len(amendments), "amendments_head": amendments[-1].line_sha256 if amendments else None}
    data = canonical_line(record)
    try:
        atomic_write(os.path.join(folder, FROZEN_NAME), data, mode=0o644)
    except OSError as exc:
        raise LogRefusal(Code.FILE_UNWRITABLE, exc.strerror or str(exc), os.path.join(folder, FROZEN_NAME)) from None
    return {**record, "sha256": sha256_hex(data)}


# --------------------------------------------------------------------------
# Commands


def freeze(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`proctor prereg freeze DIR`: validate everything and write FROZEN.json (once; later: amend)."""
    folder = _folder(path)
    with _locked(folder, exclusive=True):
        contents = _read_folder(folder)
        if FROZEN_NAME in contents.managed:  # anything else by that name is refused as unexpected below
            raise PreregRefusal(Code.PREREG_ALREADY_FROZEN, "already frozen: record a change with proctor prereg amend",
                          os.path.join(folder, FROZEN_NAME))
        if AMENDMENTS_NAME in contents.managed:
            raise PreregRefusal(Code.PREREG_ALREADY_FROZEN, "AMENDMENTS.jsonl exists, so this was frozen before and "
                          "FROZEN.json is missing: restore it rather than freezing again",
                          os.path.join(folder, AMENDMENTS_NAME))
        _refuse_odd(folder, contents)
        prepared = _validate(folder, contents)
        resolve_packet(prepared.design)
        written = _write_frozen(folder, prepared.design.study_id, utc_iso(time.time()), prepared.files, [])
    return {"ok": True, "study": prepared.design.study_id, "path": folder, "frozen": written}


def amend(path: str | os.PathLike[str], reason: str) -> dict[str, Any]:
    """`proctor prereg amend DIR --reason TEXT`: log what changed since the last freeze, then re-freeze."""
    folder = _folder(path)
    if not isinstance(reason, str) or not reason.strip():
        raise PreregRefusal(Code.AMENDMENT_REASON_EMPTY, "an amendment needs a reason", folder)
    log_path = os.path.join(folder, AMENDMENTS_NAME)
    with _locked(folder, exclusive=True):
        frozen = _read_frozen(folder)
        contents = _read_folder(folder)
        _refuse_odd(folder, contents)
        prepared = _validate(folder, contents)
        if prepared.design.study_id != frozen.study:
            raise PreregRefusal(Code.AMENDMENT_CHANGES_STUDY, f"the study id is {frozen.study!r}: an amendment cannot "
                          "change it (results and logs are named by it)", prepared.design.path)
        resolve_packet(prepared.design)
        amendments = _read_amendments(folder, frozen.study)
        current = prepared.files
        if len(amendments) == frozen.amendments + 1:  # a crash after the log line, before FROZEN.json
            pending = amendments[-1]
            _check_replay(amendments[:-1], frozen, log_path)
            if _apply(frozen.files, pending) != current:
                raise _count_mismatch(frozen, amendments, log_path)
            written = _write_frozen(folder, frozen.study, frozen.frozen_at, current, amendments)
            return {"ok": True, "study": frozen.study, "path": folder, "recovered": True,
                    "amendment": pending.to_json(), "frozen": written}
        if len(amendments) != frozen.amendments:
            raise _count_mismatch(frozen, amendments, log_path)
        _check_replay(amendments, frozen, log_path)
        changed = _diff(frozen.files, current)
        if not changed:
            raise PreregRefusal(Code.AMENDMENT_EMPTY, "nothing changed since the last freeze", folder)
        floor = max([_epoch(frozen.frozen_at) or 0.0] + [_epoch(a.at) or 0.0 for a in amendments])
        record = Amendment(len(amendments) + 1, utc_iso(Clock(floor).now()), reason, tuple(changed))
        line = ChainedLog(log_path, amendments_seed(frozen.study)).append(record.to_json())
        record = _parse_amendment(line, record.number, log_path)
        written = _write_frozen(folder, frozen.study, frozen.frozen_at, current, [*amendments, record])
    return {"ok": True, "study": frozen.study, "path": folder, "recovered": False,
            "amendment": record.to_json(), "frozen": written}


def _count_mismatch(frozen: _Frozen, amendments: list[Amendment], path: str) -> Refusal:
    hint = ""
    if len(amendments) == frozen.amendments + 1:
        hint = (" (an amend was interrupted after logging it: proctor prereg amend completes it when the "
                "folder is as that amendment says)")
    return PreregRefusal(Code.AMENDMENTS_COUNT_MISMATCH, f"FROZEN.json counts {frozen.amendments} amendments, "
                   f"AMENDMENTS.jsonl holds {len(amendments)}{hint}", path,
                   frozen=frozen.amendments, logged=len(amendments))


def check_frozen(path: str | os.PathLike[str]) -> FrozenPrereg:
    """The frozen preregistration, or a refusal: not frozen, changed since its freeze, or inconsistent.

    Every later command (plan, run, report) starts here.
    """
    folder = _folder(path)
    with _locked(folder, exclusive=False):
        frozen = _read_frozen(folder)
        contents = _read_folder(folder)
        now: dict[str, str | None] = {**contents.hashes(), **dict.fromkeys(contents.odd)}
        changes = _diff(frozen.files, now)
        if changes:
            def named(kind: str) -> list[str]:
                return [c.path for c in changes if c.change == kind]

            said = "; ".join(f"{c.path} {c.change}" + (f" ({contents.odd[c.path]})" if c.path in contents.odd else "")
                             for c in changes)
            raise PreregRefusal(Code.PREREG_CHANGED_SINCE_FREEZE, f"changed since its freeze: {said} "
                          "(record the change with proctor prereg amend DIR --reason TEXT)", folder,
                          added=named("added"), changed=named("changed"), removed=named("removed"))
        prepared = _validate(folder, contents)
        if prepared.design.study_id != frozen.study:
            raise PreregRefusal(Code.FROZEN_INVALID, f"FROZEN.json is for study {frozen.study!r}, the design for "
                          f"{prepared.design.study_id!r}", os.path.join(folder, FROZEN_NAME))
        log_path = os.path.join(folder, AMENDMENTS_NAME)
        amendments = _read_amendments(folder, frozen.study)
        if len(amendments) != frozen.amendments:
            raise _count_mismatch(frozen, amendments, log_path)
        _check_replay(amendments, frozen, log_path)
    return FrozenPrereg(
        path=folder, design=prepared.design, systems=prepared.systems, systems_sha256=prepared.systems_sha256,
        frozen_sha256=frozen.sha256, frozen_at=frozen.frozen_at, files=frozen.files,
        amendments=tuple(amendments),
        catalog_sha256=None if prepared.catalog is None else prepared.catalog.sha256,
    )


# --------------------------------------------------------------------------
# `proctor prereg check`: what the registration amounts to, before anything runs


def check_prereg(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`proctor prereg check DIR`: validate, resolve the packet and draw, show cells, budgets and power.

    A frozen folder is checked against its freeze first (a change is refused,
    as every later command would); an unfrozen one is validated as freeze
    would validate it, and the report says what freeze would record.
    """
    folder = _folder(path)
    if os.path.lexists(os.path.join(folder, FROZEN_NAME)):
        frozen = check_frozen(folder)
        design, systems_sha256 = frozen.design, frozen.systems_sha256
        state: dict[str, Any] = {"state": "frozen", "frozen_at": frozen.frozen_at,
                                 "frozen_sha256": frozen.frozen_sha256, "files": frozen.files,
                                 "amendments": [a.to_json() for a in frozen.amendments]}
    else:
        prepared = prepare(folder)
        design, systems_sha256 = prepared.design, prepared.systems_sha256
        state = {"state": "unfrozen", "would_record": {"study": design.study_id, "files": prepared.files,
                                                       "amendments": 0}}
    packet_items, packet_sha256 = resolve_packet(design)
    warnings: list[str] = []
    if state["state"] == "unfrozen":
        warnings.append("not frozen: plan, run and report refuse it until proctor prereg freeze DIR")
        if os.path.lexists(os.path.join(folder, AMENDMENTS_NAME)):
            warnings.append("AMENDMENTS.jsonl exists without FROZEN.json: freeze refuses; restore FROZEN.json")
    stages = [_stage_cells(design, stage_id) for stage_id in (s.id for s in design.stages)]
    budget = _budget(design, warnings)
    power = [_comparison_power(design, i, warnings) for i in range(len(design.comparisons))]
    return {
        "ok": True, "study": design.study_id, "title": design.title, "path": folder,
        "design_sha256": design.sha256, "systems_sha256": systems_sha256,
        "systems": [{**s.manifest(), "pricing_key": s.pricing_key, "cap_usd": s.cap_usd} for s in design.systems],
        "packet": {"suite": design.suite_name, "path": design.packet_path, "sha256": packet_sha256,
                   "items": packet_items},
        "draw": {"items": design.draw_items, "packet_items": packet_items, "seed": design.seed},
        "stages": stages, "cells_total": sum(s["cells"] for s in stages),
        "budget": budget, "power": power, "frozen": state, "warnings": warnings,
    }


def _stage_cells(design: Design, stage_id: str) -> dict[str, Any]:
    stage = design.stage(stage_id)
    per_system = stage.items * len(stage.arms) * stage.repeats
    return {"stage": stage.id, "items": stage.items, "arms": list(stage.arms), "repeats": stage.repeats,
            "systems": {slot: per_system for slot in stage.systems},
            "cells": per_system * len(stage.systems),
            "formula": f"{stage.items} items x {len(stage.arms)} arms x {stage.repeats} repeats per system"}


def _usd(x: float) -> float:
    return round(x, 6)


def _budget(design: Design, warnings: list[str]) -> dict[str, Any]:
    """Caps against the reserve: an item under way (one item of one repeat, all its arms) holds the reserve."""
    b = design.budgets
    systems: list[dict[str, Any]] = []
    for system in design.systems:
        rows: list[dict[str, Any]] = []
        held = 0.0
        for stage in design.stages:
            if system.slot not in stage.systems:
                continue
            items = stage.items * stage.repeats
            held = math.fsum([held, items * b.reserve_per_item_usd])
            rows.append({"stage": stage.id, "items": items, "reserve_usd": _usd(items * b.reserve_per_item_usd),
                         "cumulative_usd": _usd(held), "covered": held <= system.cap_usd})
        covered = held <= system.cap_usd
        if not covered:
            short = next(r["stage"] for r in rows if not r["covered"])
            warnings.append(f"system {system.slot}: its cap ${system.cap_usd:g} cannot cover its items at the "
                            f"reserve ${b.reserve_per_item_usd:g} (${_usd(held):g} needed; short from stage {short})")
        systems.append({"slot": system.slot, "cap_usd": system.cap_usd,
                        "items": sum(r["items"] for r in rows), "reserve_needed_usd": _usd(held),
                        "covered": covered, "stages": rows})
    total = math.fsum(s["reserve_needed_usd"] for s in systems)
    available = b.overall_cap_usd - b.spend_before_usd
    if total > available:
        warnings.append(f"overall: the stages need ${_usd(total):g} at the reserve; the overall cap leaves "
                        f"${_usd(available):g} after ${b.spend_before_usd:g} spent before")
    if sum(s.cap_usd for s in design.systems) > b.overall_cap_usd:
        warnings.append("the systems' caps add up to more than the overall cap: the overall cap binds first")
    return {"reserve_per_item_usd": b.reserve_per_item_usd, "systems": systems,
            "overall_cap_usd": b.overall_cap_usd, "ceiling_margin_usd": b.ceiling_margin_usd,
            "ceiling_usd": _usd(b.ceiling_usd), "spend_before_usd": b.spend_before_usd,
            "available_usd": _usd(available), "reserve_needed_usd": _usd(total), "covered": total <= available}


def _comparison_power(design: Design, index: int, warnings: list[str]) -> dict[str, Any]:
    from harness.stats.power import items_needed, minimum_detectable_margin, tost_power

    c = design.comparisons[index]
    paired = design.test == "paired_tost"
    common: dict[str, Any] = {"p_a": c.expected_a, "p_b": c.expected_b, "correlation": c.correlation,
                              "paired": paired}
    needed = items_needed(margin=c.margin, alpha=design.alpha, power=design.power, **common)
    stages: list[dict[str, Any]] = []
    for stage in design.stages:
        if c.a in stage.systems and c.b in stage.systems and c.arm in stage.arms:
            n = stage.items  # distinct items: repeats of an item are clustered, not new items
            stages.append({
                "stage": stage.id, "items": n,
                "reaches": needed.n is not None and n >= needed.n,
                "power_at_items": tost_power(n, margin=c.margin, alpha=design.alpha, **common),
                "minimum_detectable_margin": minimum_detectable_margin(n, alpha=design.alpha, power=design.power,
                                                                       **common),
            })
    name = f"{c.a} vs {c.b} on {c.arm}"
    if needed.n is None:
        warnings.append(f"comparison {name}: {needed.reason}")
    elif not any(s["reaches"] for s in stages):
        best = max(stages, key=lambda s: s["items"])
        warnings.append(f"comparison {name}: needs {needed.n} items for power {design.power:g} at margin "
                        f"{c.margin:g}; the largest stage has {best['items']} (power {best['power_at_items']:.3f}, "
                        f"minimum detectable margin {best['minimum_detectable_margin']:.4f})")
    return {"a": c.a, "b": c.b, "arm": c.arm, "test": design.test, "margin": c.margin, "alpha": design.alpha,
            "power": design.power, "expected_a": c.expected_a, "expected_b": c.expected_b,
            "correlation": c.correlation, "needed": needed.to_json(), "stages": stages}
