"""The preregistration folder (`prereg/<study>/`): reading its entries, locking it, validating what it registers.

The manual: docs/prereg.md.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, InputRefusal, PreregRefusal, Refusal
from harness.evidence.jsonio import loads_strict, read_bytes, sha256_hex
from harness.prereg.design import Design, System, design_from_bytes
from harness.providers.catalog import Catalog, CatalogModel, parse_catalog

__all__ = [
    "AMENDMENTS_NAME",
    "CATALOG_NAME",
    "FROZEN_NAME",
    "GO_NAME",
    "IGNORED_FOLDERS",
    "MANAGED",
    "REQUIRED_FILES",
    "Contents",
    "Prepared",
    "catalog_mismatches",
    "locked",
    "open_folder",
    "prepare",
    "read_folder",
    "refuse_odd",
    "repo_task_suite",
    "resolve_packet",
    "validate",
]

FROZEN_NAME: Final = "FROZEN.json"
AMENDMENTS_NAME: Final = "AMENDMENTS.jsonl"
REQUIRED_FILES: Final = ("design.toml", "PREREG.md", "systems.json")
CATALOG_NAME: Final = "catalog.toml"
GO_NAME: Final = "GO.jsonl"
"""The go log (`proctor prereg go`): authorizations to run, never part of the freeze."""
MANAGED: Final = (FROZEN_NAME, AMENDMENTS_NAME, GO_NAME)
IGNORED_FOLDERS: Final = (".ipynb_checkpoints",)
"""Folders an editor leaves behind (Jupyter's autosaves): not registered, never a change."""
_LOCK_WAIT_S: Final = 10.0


@dataclass(frozen=True)
class Contents:
    files: dict[str, bytes]  # every visible regular file except the managed ones
    odd: dict[str, str]  # entries that may not be there: name -> what they are
    managed: frozenset[str]  # which of FROZEN.json / AMENDMENTS.jsonl / GO.jsonl exist

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


def open_folder(path: str | os.PathLike[str]) -> str:
    folder = os.path.abspath(os.fspath(path))
    if not os.path.lexists(folder):
        raise InputRefusal(Code.FOLDER_MISSING, "no such preregistration folder", folder)
    if not os.path.isdir(folder):
        raise InputRefusal(Code.NOT_A_FOLDER, "a preregistration is a folder", folder)
    return folder


def read_folder(folder: str) -> Contents:
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
        if name in IGNORED_FOLDERS and stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            odd[name] = _kind(st.st_mode)
        elif name in MANAGED:
            managed.add(name)
        elif name.startswith("."):
            odd[name] = "a hidden file"
        else:
            files[name] = read_bytes(where)
    return Contents(files, odd, frozenset(managed))


def refuse_odd(folder: str, contents: Contents) -> None:
    if contents.odd:
        listed = "; ".join(f"{name} ({what})" for name, what in sorted(contents.odd.items()))
        raise PreregRefusal(Code.PREREG_UNEXPECTED_ENTRY, f"only visible regular files may be registered: {listed}",
                      folder, entries=sorted(contents.odd))


@contextmanager
def locked(folder: str, *, exclusive: bool) -> Iterator[None]:
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


def validate(folder: str, contents: Contents) -> Prepared:
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
        problems += catalog_mismatches(system, model, CATALOG_NAME)
    if problems:
        raise PreregRefusal(Code.SYSTEMS_CATALOG_MISMATCH, "; ".join(problems), catalog.path, problems=problems)


def catalog_mismatches(system: System, model: CatalogModel, catalog: str) -> list[str]:
    """Where a design's system and its catalog model (in `catalog`, as named in a message) disagree."""
    problems = []
    if model.provider != system.provider:
        problems.append(f"system {system.slot}: provider {system.provider!r} in design.toml, "
                        f"{model.provider!r} in {catalog}")
    if model.pricing_key != system.pricing_key:
        problems.append(f"system {system.slot}: pricing key {system.pricing_key!r} in design.toml, "
                        f"{model.pricing_key!r} in {catalog}")
    return problems


def resolve_packet(design: Design) -> tuple[int, str]:
    """The number of items in the design's packet and its sha256; refuses too small a packet."""
    from harness.evals.suite import load_packet

    packet = load_packet(design.packet_path, design.packet_sha256)
    if design.draw_items > len(packet.items):
        raise PreregRefusal(Code.DRAW_EXCEEDS_PACKET,
                      f"the design draws {design.draw_items} items; the packet holds {len(packet.items)}",
                      design.packet_path)
    if repo_task_suite(design):  # every item as the runner will use it, before a freeze
        from harness.evals.tasks import check_task_suite

        check_task_suite(os.path.dirname(design.packet_path))
    else:
        cascades = [a.id for a in design.arms if a.cascade is not None]
        if cascades:
            raise PreregRefusal(Code.CASCADE_NOT_REPO_TASK,
                                f"arms {', '.join(cascades)} are cascades, but suite {design.suite_name!r} is not a "
                                "repo_task suite: a cascade gates on an item's visible tests", design.path)
        named = [a.id for a in design.arms if a.worker is not None]
        if named:
            raise Refusal(Code.ARM_WORKER_NOT_REPO_TASK,
                          f"arms {', '.join(named)} name a worker, but suite {design.suite_name!r} is not a "
                          "repo_task suite: a completion attempt is one request, with no worker", design.path)
    return len(packet.items), packet.sha256


def repo_task_suite(design: Design) -> bool:
    """Whether the design's packet belongs to a `repo_task` suite (its SUITE.json's `kind`)."""
    from harness.evals.suite import suite_kind

    suite_dir = os.path.dirname(design.packet_path)
    return os.path.lexists(os.path.join(suite_dir, "SUITE.json")) and suite_kind(suite_dir) == "repo_task"


def prepare(path: str | os.PathLike[str]) -> Prepared:
    """Validate a folder as freeze would (entries, design, systems, catalog, text), without writing."""
    folder = open_folder(path)
    contents = read_folder(folder)
    refuse_odd(folder, contents)
    return validate(folder, contents)
