"""FROZEN.json and the amendment log: reading them back, replaying the amendments, `check_frozen`.

The manual: docs/prereg.md.
"""


from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from harness.errors import Code, PreregRefusal, Refusal
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import (
    canonical_bytes,
    canonical_line,
    loads_strict,
    read_bytes,
    sha256_hex,
)
from harness.prereg.design import Design
from harness.prereg.folder import (
    AMENDMENTS_NAME,
    FROZEN_NAME,
    MANAGED,
    locked,
    open_folder,
    read_folder,
    validate,
)

__all__ = [
    "FROZEN_SCHEMA",
    "Amendment",
    "FileChange",
    "FrozenFile",
    "FrozenPrereg",
    "amendments_seed",
    "apply_amendment",
    "check_frozen",
    "check_replay",
    "count_mismatch",
    "diff_files",
    "epoch",
    "freeze_history",
    "freezes_of",
    "frozen_bytes",
    "parse_amendment",
    "read_amendments",
    "read_frozen",
]

FROZEN_SCHEMA: Final = "proctor-frozen.v1"
_SHA: Final = re.compile(r"^[0-9a-f]{64}$")
_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_CHANGES: Final = ("added", "changed", "removed")
_FROZEN_KEYS: Final = ("schema", "study", "frozen_at", "files", "amendments", "amendments_head")


def amendments_seed(study: str) -> str:
    """The seed of a study's amendment log (it names the study, so logs cannot be swapped)."""
    return f"proctor-amendments:{study}"


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
    note: bool = False
    """A deviation recorded without a file change (`proctor prereg amend --note TEXT`): `changed` is empty."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"amendment": self.number, "at": self.at, "reason": self.reason,
                               "changed": [c.to_json() for c in self.changed]}
        if self.note:
            out["note"] = True
        return out


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

    def freezes(self) -> tuple[str, ...]:
        """The sha256 of FROZEN.json as it was after 0, 1, ... amendments; the last is `frozen_sha256`."""
        return freezes_of(self.design.study_id, self.frozen_at, self.files, self.amendments)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "study": self.design.study_id, "frozen_sha256": self.frozen_sha256,
                "frozen_at": self.frozen_at, "files": dict(self.files),
                "amendments": [a.to_json() for a in self.amendments]}


@dataclass(frozen=True)
class FrozenFile:
    study: str
    frozen_at: str
    files: dict[str, str]
    amendments: int
    head: str | None
    sha256: str


def epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def frozen_bytes(study: str, frozen_at: str, files: Mapping[str, str], amendments: Sequence[Amendment]) -> bytes:
    """FROZEN.json's exact bytes after `amendments` (`freeze` and `amend` write these)."""
    return canonical_line({"schema": FROZEN_SCHEMA, "study": study, "frozen_at": frozen_at, "files": dict(files),
                           "amendments": len(amendments),
                           "amendments_head": amendments[-1].line_sha256 if amendments else None})


def freezes_of(study: str, frozen_at: str, files: Mapping[str, str],
               amendments: Sequence[Amendment]) -> tuple[str, ...]:
    """The sha256 of FROZEN.json after 0, 1, ..., n amendments, rebuilt from the current hashes.

    Each amendment's `old` hashes undo it, so every earlier FROZEN.json is rebuilt byte for byte
    (`frozen_at` never moves); a stage's plan names the one it ran under.
    """
    states = [dict(files)]
    for a in reversed(amendments):
        before = dict(states[-1])
        for c in a.changed:
            if c.old is None:
                before.pop(c.path, None)
            else:
                before[c.path] = c.old
        states.append(before)
    states.reverse()
    return tuple(sha256_hex(frozen_bytes(study, frozen_at, state, amendments[:k])) for k, state in enumerate(states))


def freeze_history(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The freezes of the folder at `path` (see `freezes_of`), read without validating the design.

    Raises:
        Refusal: no or an invalid FROZEN.json, or an amendment log that does not read or replay.
    """
    folder = open_folder(path)
    with locked(folder, exclusive=False):
        frozen = read_frozen(folder)
        amendments = read_amendments(folder, frozen.study)
    log_path = os.path.join(folder, AMENDMENTS_NAME)
    if len(amendments) != frozen.amendments:
        raise count_mismatch(frozen, amendments, log_path)
    check_replay(amendments, frozen, log_path)
    return freezes_of(frozen.study, frozen.frozen_at, frozen.files, amendments)


def read_frozen(folder: str) -> FrozenFile:
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
    if not isinstance(value["study"], str) or epoch(value["frozen_at"]) is None:
        raise bad("study must be a string and frozen_at an ISO-8601 UTC time")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise bad("amendments must be a count")
    head = value["amendments_head"]
    if (head is None) != (count == 0) or not (head is None or (isinstance(head, str) and _SHA.match(head))):
        raise bad("amendments_head must be a sha256 hex digest exactly when there are amendments")
    if not isinstance(files, dict) or not all(
        isinstance(h, str) and _SHA.match(h) and n not in MANAGED and "/" not in n for n, h in files.items()
    ):
        raise bad("files must map file names to sha256 hex digests")
    return FrozenFile(value["study"], value["frozen_at"], dict(files), count, head, sha256_hex(raw))


def parse_amendment(record: dict[str, Any], index: int, path: str) -> Amendment:
    """One log record, validated (the log's lines are canonical, so its line's sha256 is recomputed)."""

    def bad(message: str) -> Refusal:
        return PreregRefusal(Code.AMENDMENTS_INVALID, f"line {index}: {message}", path, line=index)

    allowed = {"amendment", "at", "reason", "changed", "note", "prev"} | ({"seed"} if index == 1 else set())
    if not {"amendment", "at", "reason", "changed", "prev"} <= set(record) <= allowed:
        raise bad("expected exactly amendment, at, reason, changed (and note for a note)")
    note = "note" in record
    if note and record["note"] is not True:
        raise bad("note, when present, must be true")
    if type(record["amendment"]) is not int or record["amendment"] != index:
        raise bad(f"amendment must be {index} (numbered 1, 2, ... in order)")
    if epoch(record["at"]) is None or not isinstance(record["reason"], str) or not record["reason"].strip():
        raise bad("at must be an ISO-8601 UTC time and reason a non-empty text")
    changes = record["changed"]
    if not isinstance(changes, list) or (not changes) != note:
        raise bad("changed must be a non-empty list (an empty one exactly for a note)")
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
    return Amendment(index, record["at"], record["reason"], tuple(out), sha256_hex(canonical_bytes(record)), note)


def read_amendments(folder: str, study: str) -> list[Amendment]:
    path = os.path.join(folder, AMENDMENTS_NAME)
    if not os.path.lexists(path):
        return []
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise PreregRefusal(Code.AMENDMENTS_INVALID, "AMENDMENTS.jsonl must be a regular file, not a link or anything else",
                      path)
    records = read_log(path, amendments_seed(study))
    amendments = [parse_amendment(r, i, path) for i, r in enumerate(records, 1)]
    last = 0.0
    for a in amendments:
        at = epoch(a.at) or 0.0
        if at < last:
            raise PreregRefusal(Code.AMENDMENTS_INVALID, f"line {a.number}: dated before the amendment above it", path,
                          line=a.number)
        last = at
    return amendments


def apply_amendment(files: Mapping[str, str], amendment: Amendment) -> dict[str, str] | None:
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


def check_replay(amendments: list[Amendment], frozen: FrozenFile, path: str) -> None:
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


def diff_files(old: Mapping[str, str], new: Mapping[str, str | None]) -> list[FileChange]:
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


def count_mismatch(frozen: FrozenFile, amendments: list[Amendment], path: str) -> Refusal:
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
    folder = open_folder(path)
    with locked(folder, exclusive=False):
        frozen = read_frozen(folder)
        contents = read_folder(folder)
        now: dict[str, str | None] = {**contents.hashes(), **dict.fromkeys(contents.odd)}
        changes = diff_files(frozen.files, now)
        if changes:
            def named(kind: str) -> list[str]:
                return [c.path for c in changes if c.change == kind]

            said = "; ".join(f"{c.path} {c.change}" + (f" ({contents.odd[c.path]})" if c.path in contents.odd else "")
                             for c in changes)
            raise PreregRefusal(Code.PREREG_CHANGED_SINCE_FREEZE, f"changed since its freeze: {said} "
                          "(record the change with proctor prereg amend DIR --reason TEXT)", folder,
                          added=named("added"), changed=named("changed"), removed=named("removed"))
        prepared = validate(folder, contents)
        if prepared.design.study_id != frozen.study:
            raise PreregRefusal(Code.FROZEN_INVALID, f"FROZEN.json is for study {frozen.study!r}, the design for "
                          f"{prepared.design.study_id!r}", os.path.join(folder, FROZEN_NAME))
        log_path = os.path.join(folder, AMENDMENTS_NAME)
        amendments = read_amendments(folder, frozen.study)
        if len(amendments) != frozen.amendments:
            raise count_mismatch(frozen, amendments, log_path)
        check_replay(amendments, frozen, log_path)
    return FrozenPrereg(
        path=folder, design=prepared.design, systems=prepared.systems, systems_sha256=prepared.systems_sha256,
        frozen_sha256=frozen.sha256, frozen_at=frozen.frozen_at, files=frozen.files,
        amendments=tuple(amendments),
        catalog_sha256=None if prepared.catalog is None else prepared.catalog.sha256,
    )
