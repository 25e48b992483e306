"""The preregistration folder (`prereg/<study>/`): freeze and amend.

The manual: docs/prereg.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from harness.errors import Code, LogRefusal, PreregRefusal
from harness.evidence.chain import ChainedLog
from harness.evidence.clock import Clock, utc_iso
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import loads_strict, sha256_hex
from harness.prereg.check import budget_of
from harness.prereg.folder import (
    AMENDMENTS_NAME,
    FROZEN_NAME,
    locked,
    open_folder,
    read_folder,
    refuse_odd,
    resolve_packet,
    validate,
)
from harness.prereg.frozen import (
    Amendment,
    amendments_seed,
    apply_amendment,
    check_replay,
    count_mismatch,
    diff_files,
    epoch,
    frozen_bytes,
    parse_amendment,
    read_amendments,
    read_frozen,
)
from harness.prereg.resolve import resolve_systems

__all__ = ["amend", "freeze"]


def _write_frozen(
    folder: str, study: str, frozen_at: str, files: Mapping[str, str], amendments: list[Amendment]
) -> dict[str, Any]:
    data = frozen_bytes(study, frozen_at, files, amendments)
    record = loads_strict(data)
    try:
        atomic_write(os.path.join(folder, FROZEN_NAME), data, mode=0o644)
    except OSError as exc:
        raise LogRefusal(Code.FILE_UNWRITABLE, exc.strerror or str(exc), os.path.join(folder, FROZEN_NAME)) from None
    return {**record, "sha256": sha256_hex(data)}


# --------------------------------------------------------------------------
# Commands


def freeze(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`proctor prereg freeze DIR`: validate everything and write FROZEN.json (once; later: amend).

    Every system is resolved against the catalog and the pricing first
    (`resolve_systems`): what `plan` or `run` would refuse is refused here.
    """
    folder = open_folder(path)
    with locked(folder, exclusive=True):
        contents = read_folder(folder)
        if FROZEN_NAME in contents.managed:  # anything else by that name is refused as unexpected below
            raise PreregRefusal(Code.PREREG_ALREADY_FROZEN, "already frozen: record a change with proctor prereg amend",
                          os.path.join(folder, FROZEN_NAME))
        if AMENDMENTS_NAME in contents.managed:
            raise PreregRefusal(Code.PREREG_ALREADY_FROZEN, "AMENDMENTS.jsonl exists, so this was frozen before and "
                          "FROZEN.json is missing: restore it rather than freezing again",
                          os.path.join(folder, AMENDMENTS_NAME))
        refuse_odd(folder, contents)
        prepared = validate(folder, contents)
        resolve_packet(prepared.design)
        resolve_systems(folder, prepared.design, prepared.catalog, prepared.files)
        written = _write_frozen(folder, prepared.design.study_id, utc_iso(time.time()), prepared.files, [])
    warnings: list[str] = []
    budget = budget_of(prepared.design, warnings)
    return {"ok": True, "study": prepared.design.study_id, "path": folder, "frozen": written,
            "budget": budget, "warnings": warnings}


def amend(path: str | os.PathLike[str], reason: str, *, note: bool = False) -> dict[str, Any]:
    """`proctor prereg amend DIR --reason TEXT`: log what changed since the last freeze, then re-freeze.

    With `note` (`--note TEXT`) the amendment records a deviation without a file change: the
    folder must be exactly as frozen, and the text is the amendment's reason.
    """
    folder = open_folder(path)
    if not isinstance(reason, str) or not reason.strip():
        raise PreregRefusal(Code.AMENDMENT_REASON_EMPTY, "an amendment needs a reason", folder)
    log_path = os.path.join(folder, AMENDMENTS_NAME)
    with locked(folder, exclusive=True):
        frozen = read_frozen(folder)
        contents = read_folder(folder)
        refuse_odd(folder, contents)
        prepared = validate(folder, contents)
        if prepared.design.study_id != frozen.study:
            raise PreregRefusal(Code.AMENDMENT_CHANGES_STUDY, f"the study id is {frozen.study!r}: an amendment cannot "
                          "change it (results and logs are named by it)", prepared.design.path)
        resolve_packet(prepared.design)
        resolve_systems(folder, prepared.design, prepared.catalog, prepared.files)
        amendments = read_amendments(folder, frozen.study)
        current = prepared.files
        if len(amendments) == frozen.amendments + 1:  # a crash after the log line, before FROZEN.json
            pending = amendments[-1]
            check_replay(amendments[:-1], frozen, log_path)
            if apply_amendment(frozen.files, pending) != current:
                raise count_mismatch(frozen, amendments, log_path)
            written = _write_frozen(folder, frozen.study, frozen.frozen_at, current, amendments)
            return {"ok": True, "study": frozen.study, "path": folder, "recovered": True,
                    "amendment": pending.to_json(), "frozen": written}
        if len(amendments) != frozen.amendments:
            raise count_mismatch(frozen, amendments, log_path)
        check_replay(amendments, frozen, log_path)
        changed = diff_files(frozen.files, current)
        if note and changed:
            raise PreregRefusal(Code.AMENDMENT_NOTE_CHANGES_FILES, "a note records a deviation without a file change, "
                                f"but {', '.join(c.path for c in changed)} changed: amend with --reason", folder,
                                changed=[c.path for c in changed])
        if not changed and not note:
            raise PreregRefusal(Code.AMENDMENT_EMPTY, "nothing changed since the last freeze (a deviation without a "
                                "file change is recorded with --note TEXT)", folder)
        floor = max([epoch(frozen.frozen_at) or 0.0] + [epoch(a.at) or 0.0 for a in amendments])
        record = Amendment(len(amendments) + 1, utc_iso(Clock(floor).now()), reason, tuple(changed), note=note)
        line = ChainedLog(log_path, amendments_seed(frozen.study)).append(record.to_json())
        record = parse_amendment(line, record.number, log_path)
        written = _write_frozen(folder, frozen.study, frozen.frozen_at, current, [*amendments, record])
    return {"ok": True, "study": frozen.study, "path": folder, "recovered": False,
            "amendment": record.to_json(), "frozen": written}
