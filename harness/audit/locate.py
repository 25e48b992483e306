"""Finding the study an audit covers: its stage folders and preregistration, also when a plan does not read.

The manual: docs/audit.md.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from harness.audit.results import find_prereg, find_stages, open_study, stage_folders
from harness.errors import AuditRefusal, Code, Refusal
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.paths import repo_root
from harness.prereg.design import Design, load_design
from harness.prereg.frozen import check_frozen
from harness.run.layout import LOGS

__all__ = ["Located", "PathArg", "locate", "study_design"]

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class Located:
    """The study an audit covers: its folder, preregistration, freeze and (stage, folder) pairs."""

    study: str
    folder: str
    prereg: str
    frozen_sha256: str
    stages: tuple[tuple[str, str], ...]  # (stage, folder)
    whole: bool  # more than one stage folder could be here (not a stage folder named alone)


def _looks_like_stage(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f"{name}.jsonl")) for name in ("plan", *LOGS))


def _discover(root: str) -> list[str]:
    """Folders at `root`, one or two levels below (the first depth with any) holding a plan or a stage's log."""
    return stage_folders(root, _looks_like_stage)


def locate(path: PathArg, prereg: PathArg | None, root: PathArg | None) -> Located:
    """The study at `path` (RESULTS, RESULTS/<study> or a stage folder), as `open_study` finds it."""
    here = os.path.abspath(os.fspath(path))
    if prereg is not None and not os.path.isdir(prereg):
        raise AuditRefusal(Code.PREREG_NOT_FOUND, "the preregistration given is not a folder", os.path.abspath(prereg))
    folders = _discover(here)
    whole = folders != [here]
    try:
        found = open_study(here, prereg=prereg, root=root)
    except Refusal as exc:
        parents = {os.path.dirname(f) for f in folders}
        if not folders or exc.code == Code.PREREG_NOT_FOUND or len(parents) > 1:
            raise
        return _locate_despite(here, folders, prereg, root, whole, exc)
    named = {s.folder: s.stage for s in found.stages}
    stages = tuple(sorted((named.get(f, os.path.basename(f)), f) for f in {*folders, *named}))
    return Located(found.study, found.folder, found.prereg, found.frozen_sha256, stages, whole)


def _locate_despite(here: str, folders: list[str], prereg: PathArg | None, root: PathArg | None, whole: bool,
                    exc: Refusal) -> Located:
    """A plan that does not read, or plans naming another study or freeze: audit them as breaks."""
    refs = {}
    for f in folders:
        try:
            refs[f] = find_stages(f)[0]
        except Refusal:
            continue  # check_stage names the plan that does not read
    if prereg is None:
        base = root if root is not None else repo_root()
        freezes = sorted({r.frozen_sha256 for r in refs.values()})
        if not freezes:
            raise AuditRefusal(Code.PREREG_NOT_FOUND, "no stage's plan reads, so the preregistration cannot be "
                          "found by its freeze: pass --prereg DIR", here) from exc
        held = []  # plans naming different freezes: the one preregistration that exists decides
        for sha in freezes:
            try:
                held.append(find_prereg(sha, base))
            except Refusal:
                continue
        if len(held) != 1:
            raise exc
        found = held[0]
    else:
        found = os.path.abspath(os.fspath(prereg))
    design = study_design(found)
    studies = Counter(r.study for r in refs.values())
    study = design.study_id if design is not None else (
        studies.most_common(1)[0][0] if studies else os.path.basename(os.path.dirname(folders[0])))
    stages = tuple(sorted((refs[f].stage if f in refs and refs[f].study == study else os.path.basename(f), f)
                          for f in folders))
    frozen = os.path.join(found, "FROZEN.json")
    return Located(study, os.path.dirname(folders[0]), found,
                  sha256_hex(read_bytes(frozen)) if os.path.isfile(frozen) else "", stages, whole)


def study_design(prereg: str) -> Design | None:
    """The frozen design, else the design as it reads, else None (`check_stage` names what is broken)."""
    try:
        return check_frozen(prereg).design
    except Refusal:
        pass  # check_stage names the broken freeze
    try:
        return load_design(os.path.join(prereg, "design.toml"))
    except Refusal:
        return None
