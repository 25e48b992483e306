"""A study's results folder as a whole: its stage folders and the preregistration they were run from.

The manual: docs/audit.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from harness.errors import AuditRefusal, Code, Refusal
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.paths import repo_root
from harness.prereg.frozen import freeze_history
from harness.run.attempts import read_plan

__all__ = ["StageRef", "StudyResults", "find_prereg", "find_stages", "open_study", "stage_folders"]

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class StageRef:
    """One stage folder: where it is and what its plan header says it is."""

    study: str
    stage: str
    folder: str
    plan_sha256: str
    frozen_sha256: str


@dataclass(frozen=True)
class StudyResults:
    """Every stage folder of one study and the preregistration folder they name (absolute paths)."""

    study: str
    folder: str
    """The study folder (`RESULTS/<study>`): analysis outputs go below it."""
    stages: tuple[StageRef, ...]
    prereg: str
    frozen_sha256: str


def _stage(folder: str) -> StageRef:
    plan = read_plan(os.path.join(folder, "plan.jsonl"))
    stage = plan.header.get("stage")
    return StageRef(plan.study, str(stage) if isinstance(stage, str) else os.path.basename(folder), folder,
                    plan.sha256, str(plan.header.get("frozen_sha256")))


def stage_folders(path: PathArg, is_stage: Callable[[str], bool] | None = None) -> list[str]:
    """The folders at `path`, one level below it or two levels below it (the first depth with any)
    for which `is_stage` holds (default: the folder holds `plan.jsonl`), in name order; links and
    dot-folders are not entered. An empty list when there is none (or `path` is no folder)."""
    holds = is_stage or (lambda f: os.path.isfile(os.path.join(f, "plan.jsonl")))
    level = [os.path.abspath(os.fspath(path))]
    level = [f for f in level if os.path.isdir(f)]
    for _ in range(3):
        found = [f for f in level if holds(f)]
        if found:
            return sorted(found)
        level = sorted(os.path.join(f, name) for f in level for name in os.listdir(f)
                       if not name.startswith(".") and os.path.isdir(os.path.join(f, name))
                       and not os.path.islink(os.path.join(f, name)))
    return []


def find_stages(path: PathArg) -> list[StageRef]:
    """Every stage folder at `path`, one level below it, or two levels below it (the first depth with any).

    Raises:
        Refusal: `results_not_found` when no folder at those depths holds `plan.jsonl`;
            a plan's own refusal (`plan_invalid`, ...) when one does not read.
    """
    root = os.path.abspath(os.fspath(path))
    if not os.path.isdir(root):
        raise AuditRefusal(Code.RESULTS_NOT_FOUND, "not a folder", root)
    found = stage_folders(root)
    if not found:
        raise AuditRefusal(Code.RESULTS_NOT_FOUND, "no stage folder (a folder holding plan.jsonl) here, "
                      "one level below or two levels below", root)
    return [_stage(f) for f in found]


def _history(folder: str) -> tuple[str, ...]:
    """The freezes of a preregistration folder (`freeze_history`); only the current one when the
    amendment log does not read (the audit names it)."""
    try:
        return freeze_history(folder)
    except Refusal:
        return (sha256_hex(read_bytes(os.path.join(folder, "FROZEN.json"))),)


def find_prereg(frozen_sha256: str | Collection[str], root: PathArg) -> str:
    """The folder under `root/prereg/` whose `FROZEN.json` hashes to `frozen_sha256`, or whose
    chained amendments lead from that freeze to its current one (every one, given several).

    Raises:
        Refusal: `prereg_not_found` naming the folders looked at.
    """
    wanted = {frozen_sha256} if isinstance(frozen_sha256, str) else set(frozen_sha256)
    base = os.path.join(os.path.abspath(os.fspath(root)), "prereg")
    looked = []
    if os.path.isdir(base):
        for name in sorted(os.listdir(base)):
            frozen = os.path.join(base, name, "FROZEN.json")
            if os.path.isfile(frozen) and not os.path.islink(frozen):
                looked.append(name)
                if wanted <= set(_history(os.path.join(base, name))):
                    return os.path.join(base, name)
    said = ", ".join(sorted(wanted))
    raise AuditRefusal(Code.PREREG_NOT_FOUND, f"no preregistration under {base} has FROZEN.json with sha256 "
                  f"{said} or amendments leading from it (looked at: {', '.join(looked) or 'none'}); "
                  "pass --prereg DIR", base)


def open_study(path: PathArg, *, prereg: PathArg | None = None, root: PathArg | None = None) -> StudyResults:
    """One study's stage folders and its preregistration folder (see the module docstring).

    Args:
        path: RESULTS, RESULTS/<study> or a stage folder.
        prereg: the preregistration folder; default: found by the plans' `frozen_sha256`
            under `root/prereg/`.
        root: the repository root to search (default: `harness.evidence.paths.repo_root()`).
    """
    stages = find_stages(path)
    studies = sorted({s.study for s in stages})
    freezes = sorted({s.frozen_sha256 for s in stages})
    here = os.path.abspath(os.fspath(path))
    if len(studies) != 1:
        raise AuditRefusal(Code.RESULTS_MIXED, f"stages of {len(studies)} studies ({', '.join(studies)}): "
                      "name one study folder", here)
    mixed = AuditRefusal(Code.RESULTS_MIXED, f"the stages' plans name {len(freezes)} different freezes "
                         f"({', '.join(f[:12] for f in freezes)}) that no preregistration's amendments chain",
                         here)
    if prereg is None:
        try:
            found = find_prereg(freezes, root if root is not None else repo_root())
        except Refusal:
            if len(freezes) != 1:
                raise mixed from None
            raise
    else:
        found = os.path.abspath(os.fspath(prereg))
    # stages run under this freeze or earlier ones its amendments lead from: the study's freeze is the current one
    history = _history(found) if os.path.isfile(os.path.join(found, "FROZEN.json")) else ()
    if set(freezes) <= set(history):
        frozen_sha256 = history[-1]
    elif len(freezes) != 1:
        raise mixed
    else:
        frozen_sha256 = freezes[0]  # the report names the plan that is not this preregistration's
    study_folder = str(Path(stages[0].folder).parent)
    return StudyResults(studies[0], study_folder, tuple(stages), found, frozen_sha256)
