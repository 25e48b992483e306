"""The audit (`proctor audit RESULTS`): a reviewer's check that nothing in a study's results was altered.

The manual: docs/audit.md.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.audit.locate import PathArg, locate, study_design
from harness.audit.oracle import Problem
from harness.audit.stage import StageAudit, StageCheck, files_below
from harness.errors import Refusal
from harness.evidence.chain_read import read_log
from harness.evidence.portable import machine_paths
from harness.prereg.frozen import FrozenPrereg, check_frozen
from harness.run.anchor_push import Pushed, read_pushed, resolve_remote
from harness.run.layout import log_seed

__all__ = ["Audit", "audit_results"]


@dataclass(frozen=True)
class Audit:
    """The audit of one study: `ok` when no problem was found; `weaker` lists what is covered less strongly."""

    study: str
    folder: str
    prereg: str
    frozen_sha256: str
    frozen_at: str | None
    """When the preregistration was first frozen (None when its freeze does not check)."""
    amendments: tuple[dict[str, Any], ...]
    stages: tuple[StageAudit, ...]
    problems: tuple[Problem, ...]
    weaker: tuple[str, ...]
    sandbox: Mapping[str, int]
    remote: str | None
    commit: str | None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The summary as printed by `proctor audit --json` (`ok`, totals, guarantees, problems)."""
        logs = [log for s in self.stages for log in s.logs]
        totals = {"stages": len(self.stages), "logs": len(logs), "lines": sum(log.lines for log in logs),
                  "anchors": sum(s.anchors for s in self.stages), "manifests": sum(s.manifests for s in self.stages),
                  "outputs": sum(len(s.outputs) for s in self.stages), "receipts": sum(s.receipts for s in self.stages)}
        holds = [f"{totals['logs']} chained logs verify from their seeds ({totals['lines']} lines)",
                 f"the preregistration matches its freeze of {self.frozen_at} ({len(self.amendments)} amendments) "
                 f"and each of {totals['stages']} stages' plan is its fresh plan",
                 f"{totals['anchors']} anchors match the logs; {totals['manifests']} manifest hashes match "
                 f"their files ({totals['outputs']} notebooks and outputs)",
                 f"{totals['receipts']} receipts match their finals"]
        if self.remote is not None and self.commit is not None:
            holds.append(f"the remote {self.remote} (commit {self.commit[:12]}) witnesses the pushed snapshots")
        return {
            "ok": self.ok, "study": self.study, "folder": self.folder, "prereg": self.prereg,
            "frozen_sha256": self.frozen_sha256, "frozen_at": self.frozen_at, "amendments": list(self.amendments),
            "stages": [{"stage": s.stage, "folder": s.folder, "anchors": s.anchors, "manifests": s.manifests,
                        "outputs": list(s.outputs), "receipts": s.receipts,
                        "logs": {log.name: {"lines": log.lines, "anchored": log.anchored, "witnessed": log.witnessed}
                                 for log in s.logs}} for s in self.stages],
            "verified": totals,
            "witness": None if self.remote is None else {"remote": self.remote, "commit": self.commit},
            "sandbox": dict(self.sandbox),
            "guarantees": {"holds": holds if self.ok else [], "weaker": list(self.weaker)},
            "problems": [{"file": p.file, "line": p.line, "rule": p.rule, "message": p.message}
                         for p in self.problems],
        }


def _records_provenance(study: str, stage: str, folder: str) -> bool:
    """Whether the stage's run log records its provenance (a stage run since evidence became portable)."""
    path = os.path.join(folder, "run.jsonl")
    try:
        return any(r.get("event") == "start" and "provenance" in r for r in read_log(path, log_seed(study, stage, "run")))
    except (Refusal, OSError):
        return False  # the stage's own checks name a broken or missing run log


def _portable(study: str, stages: Sequence[tuple[str, str]], whole: str | None, problems: list[Problem],
              weaker: list[str]) -> None:
    """`absolute_path`: a file of a stage whose run records its provenance (or of the study folder beside
    such stages) names a folder of this machine; in earlier evidence it is only a weaker guarantee."""
    scans = [(folder, machine_paths(folder), _records_provenance(study, stage, folder)) for stage, folder in stages]
    if whole is not None:
        skip = [os.path.relpath(f, whole) for _, f in stages]
        scans.append((whole, machine_paths(whole, skip=skip), any(new for _, _, new in scans)))
    for folder, leaks, new in scans:
        for leak in leaks:
            message = (f"names an absolute path of the machine that wrote it ({leak.count} in the file, the "
                       f"first {leak.path!r}); evidence must be portable (docs/evidence.md)")
            if new:
                problems.append(Problem(os.path.join(folder, leak.file), leak.line, "absolute_path", message))
        if leaks and not new:
            weaker.append(f"{len(leaks)} files of {os.path.basename(folder)} (written before evidence was "
                          f"portable) name absolute paths of the machine that wrote them: "
                          + ", ".join(leak.file for leak in leaks[:5]))


def audit_results(path: PathArg, *, prereg: PathArg | None = None, root: PathArg | None = None) -> Audit:
    """Audit a study's results (RESULTS, RESULTS/<study> or a stage folder); see the module docstring.

    Args:
        path: the results to audit.
        prereg: the preregistration folder; default: found by the plans' freeze under `root/prereg/`.
        root: the repository root to search (default: the one holding the cwd).

    Raises:
        Refusal: `results_not_found`, `results_mixed` or `prereg_not_found` when nothing can be audited.
    """
    study = locate(path, prereg, root)
    problems: list[Problem] = []
    weaker: list[str] = []
    frozen: FrozenPrereg | None
    try:
        frozen = check_frozen(study.prereg)
    except Refusal:
        frozen = None  # check_stage names the broken freeze
    design = frozen.design if frozen is not None else study_design(study.prereg)
    pushed: Pushed | None = None
    remote = None
    if design is not None and design.run.anchor_remote is not None:
        remote = resolve_remote(design.run.anchor_remote, design.path)
        got = read_pushed(remote, study.study, timeout_s=design.run.anchor_timeout_s)
        if isinstance(got, str):
            problems.append(Problem(remote, None, "witness", got))
        else:
            pushed = got
    elif design is not None:
        weaker.append("no anchor remote is registered (run.anchor_remote): the last line of each stage's "
                      "anchors.jsonl is covered by nothing outside the results (a changed digit of its time "
                      "would not be seen)")
    stages, covered, sandbox = [], set(), Counter[str]()
    for stage, folder in study.stages:
        check = StageCheck(study.study, stage, folder, study.prereg, pushed)
        stages.append(check.run())
        problems.extend(check.problems)
        weaker.extend(check.weaker)
        covered |= check.covered
        sandbox.update(check.sandbox)
    if study.whole:
        if pushed is not None:
            here = {stage for stage, _ in study.stages}
            for gone in sorted(pushed.targets(study.study) - here):
                problems.append(Problem(os.path.join(study.folder, gone), None, "witness",
                                        f"{remote} holds stage {gone} ({pushed.commit[:12]}) but its folder is gone"))
        loose = sorted(p for p in files_below(study.folder, skip=[f for _, f in study.stages]) if p not in covered)
        if loose:
            weaker.append(f"{len(loose)} files of the study folder no anchor names: "
                          + ", ".join(os.path.relpath(p, study.folder) for p in loose[:10]))
    _portable(study.study, study.stages, study.folder if study.whole else None, problems, weaker)
    if sandbox.get("none"):
        weaker.append(f"{sandbox['none']} receipts were verified without a sandbox (sandbox none)")
    if sandbox.get("unrecorded"):
        weaker.append(f"{sandbox['unrecorded']} receipts do not record a sandbox")
    unique = list(dict.fromkeys(problems))  # each stage's check names a broken freeze again
    return Audit(study.study, study.folder, study.prereg, study.frozen_sha256,
                 None if frozen is None else frozen.frozen_at,
                 () if frozen is None else tuple(a.to_json() for a in frozen.amendments), tuple(stages), tuple(unique),
                 tuple(weaker), dict(sorted(sandbox.items())), remote, None if pushed is None else pushed.commit)
