"""The audit (`proctor audit RESULTS`): a reviewer's check that nothing in a study's results was altered.

`audit_results(path, prereg=None, root=None)` finds the study as `proctor analyze`
does (`harness.audit.results.open_study`: RESULTS, RESULTS/<study> or one stage
folder; a folder holding a stage's chained logs but no readable plan is audited
too, as a break) and checks every stage folder. A problem's `rule` is:

    (report rules)  everything `proctor report` validates (`harness.audit.report.check_stage`):
                    the preregistration's freeze and amendments, the plan against a fresh plan
                    of the frozen preregistration (byte for byte), every chained log of the
                    stage (wire.jsonl included) from its seed, every runner invariant, every
                    receipt, and every anchor against the logs (the oracle's `anchor` rule)
    anchor_form     an `anchor.v1` record not of the form the runner and `anchor_outputs` write:
                    keys, kind, reason (`ANCHOR_REASONS`), types, the logs every anchor names and
                    the manifests its reason names; a time earlier than the anchor before it or
                    than a run-log line it anchors, or over a day ahead of the audit's clock;
                    fewer `end` anchors than `end` events in run.jsonl (anchor lines cut off)
    output          a file named by a `notebook:<path>` or `output:<path>` manifest (the path is
                    taken from the stage folder) that is gone, or whose sha256 is not the one
                    the latest anchor naming it records (an earlier anchor may differ: a later
                    one re-anchored the file)
    chain           another chained log (`*.jsonl`) beside the stage's own that does not verify
    quarantine      a quarantine file named by a log repair that is gone or does not hash as recorded
    witness         with `run.anchor_remote` registered: the remote cannot be read; a stage's latest
                    pushed snapshot does not match the folder (each chained log in it must be a
                    byte prefix of the file now, every other file identical, none gone); a push
                    run.jsonl records is not in the remote's history; a stage the remote holds
                    is gone from the study folder (whole-study audits)

What covers what: a chained log's lines but the last are fixed by the next
line's `prev`; each log's last line by the anchors; anchors.jsonl's own last
line only by the witness (the remote). Without one, the audit says so: a
changed digit of that line's time still parses and links. Weaker guarantees
are reported beside the problems, never as breaks: no remote, anchor lines the
remote does not hold yet, log lines after the last anchor, files no check
covers, receipts whose sandbox is `none` or unrecorded, a stage held by a
running invocation while it was read.

Refusals (nothing can be audited): `results_not_found`, `results_mixed`,
`prereg_not_found`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.audit.oracle import Problem
from harness.audit.report import check_stage
from harness.audit.results import find_prereg, find_stages, open_study, stage_folders
from harness.errors import AuditRefusal, Code, Refusal
from harness.evidence.chain import PROBLEM_KINDS, ChainStatus, verify_log
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.lock import lock_holder
from harness.notebooks.stage import OUTPUT_REASONS
from harness.prereg.design import Design, load_design
from harness.prereg.freeze import FrozenPrereg, check_frozen
from harness.run.anchor_push import Pushed, read_pushed, resolve_remote
from harness.run.records import ANCHOR_KIND, LOGS, log_seed

__all__ = ["ANCHOR_REASONS", "Audit", "LogCheck", "StageAudit", "anchor_form", "audit_results"]

PathArg = str | os.PathLike[str]

ANCHOR_REASONS: Final = ("periodic", "end", *OUTPUT_REASONS)
"""Every reason an anchor may give: the runner's (`periodic`, `end`) and `anchor_outputs`'."""
_RUNNER_MANIFESTS: Final = frozenset({"plan.jsonl", "FROZEN.json", "pricing"})
_OUTPUT_PREFIXES: Final = ("notebook:", "output:")
_ANCHORED_LOGS: Final = frozenset(log for log in LOGS if log != "anchors")
_FUTURE_SLACK_S: Final = 86400.0
_MAX_FILE: Final = 1 << 32
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class LogCheck:
    """One chained log: its intact lines now, those the stage's last anchor covers, those the witness holds."""

    name: str
    lines: int
    anchored: int
    witnessed: int | None
    """Lines in the remote's latest snapshot; None without a remote."""


@dataclass(frozen=True)
class StageAudit:
    """What was checked in one stage folder."""

    stage: str
    folder: str
    logs: tuple[LogCheck, ...]
    anchors: int
    manifests: int
    """Manifest entries checked over every anchor (the runner's through the oracle, outputs here)."""
    outputs: tuple[str, ...]
    """Files named by `notebook:`/`output:` manifests, as named (relative to the stage folder)."""
    receipts: int


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


# --------------------------------------------------------------------------
# Finding the study


@dataclass(frozen=True)
class _Study:
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


def _locate(path: PathArg, prereg: PathArg | None, root: PathArg | None) -> _Study:
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
    return _Study(found.study, found.folder, found.prereg, found.frozen_sha256, stages, whole)


def _locate_despite(here: str, folders: list[str], prereg: PathArg | None, root: PathArg | None, whole: bool,
                    exc: Refusal) -> _Study:
    """A plan that does not read, or plans naming another study or freeze: audit them as breaks."""
    refs = {}
    for f in folders:
        try:
            refs[f] = find_stages(f)[0]
        except Refusal:
            continue  # check_stage names the plan that does not read
    if prereg is None:
        from harness.notebooks.stage import repo_root

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
    design = _design(found)
    studies = Counter(r.study for r in refs.values())
    study = design.study_id if design is not None else (
        studies.most_common(1)[0][0] if studies else os.path.basename(os.path.dirname(folders[0])))
    stages = tuple(sorted((refs[f].stage if f in refs and refs[f].study == study else os.path.basename(f), f)
                          for f in folders))
    frozen = os.path.join(found, "FROZEN.json")
    return _Study(study, os.path.dirname(folders[0]), found,
                  sha256_hex(read_bytes(frozen)) if os.path.isfile(frozen) else "", stages, whole)


def _design(prereg: str) -> Design | None:
    try:
        return check_frozen(prereg).design
    except Refusal:
        pass  # check_stage names the broken freeze
    try:
        return load_design(os.path.join(prereg, "design.toml"))
    except Refusal:
        return None


# --------------------------------------------------------------------------
# One stage


def _intact(path: str, seed: str | None) -> tuple[ChainStatus, list[dict[str, Any]]]:
    """A log's status and its intact records (a problem past them is the oracle's or the caller's to name)."""
    status = verify_log(path, seed)
    raw = read_bytes(path, max_bytes=_MAX_FILE).split(b"\n")[: status.lines]
    return status, [json.loads(r) for r in raw]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _hash_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and _HEX64.fullmatch(value) is not None)


def _log_entry_form(name: str, entry: Any) -> str | None:
    if not isinstance(entry, dict) or not {"lines", "head"} <= set(entry) <= {"lines", "head", "problem"}:
        return f"logs.{name} is not {{lines, head[, problem]}}"
    lines = entry["lines"]
    if not isinstance(lines, int) or isinstance(lines, bool) or lines < 0:
        return f"logs.{name}.lines is not a count"
    if not _hash_or_none(entry["head"]) or (lines > 0 and entry["head"] is None):
        return f"logs.{name}.head is not a sha256"
    problem = entry.get("problem")
    if "problem" in entry and (not isinstance(problem, dict) or set(problem) != {"line", "kind", "message"}
                               or problem["kind"] not in PROBLEM_KINDS):
        return f"logs.{name}.problem is not a chain problem"
    return None


def anchor_form(record: Mapping[str, Any], first: bool) -> list[str]:
    """What is wrong with the form of one `anchors.jsonl` record ([] when it is an `anchor.v1` as written)."""
    want = {"kind", "at", "reason", "logs", "manifests", "prev", *(("seed",) if first else ())}
    if set(record) != want:
        return [f"keys {sorted(record)} are not {sorted(want)}"]
    out = []
    if record["kind"] != ANCHOR_KIND:
        out.append(f"kind {record['kind']!r} is not {ANCHOR_KIND!r}")
    if not _number(record["at"]) or record["at"] <= 0:
        out.append("at is not a positive finite time")
    reason = record["reason"]
    if reason not in ANCHOR_REASONS:
        out.append(f"reason {reason!r} is not one of {', '.join(ANCHOR_REASONS)}")
    logs = record["logs"]
    if not isinstance(logs, dict) or set(logs) != _ANCHORED_LOGS:
        out.append(f"logs does not name exactly {', '.join(sorted(_ANCHORED_LOGS))}")
    else:
        out.extend(m for m in (_log_entry_form(n, e) for n, e in sorted(logs.items())) if m is not None)
    manifests = record["manifests"]
    if not isinstance(manifests, dict):
        out.append("manifests is not an object")
    else:
        if reason in ("periodic", "end") and set(manifests) != _RUNNER_MANIFESTS:
            out.append(f"a {reason} anchor's manifests are not {', '.join(sorted(_RUNNER_MANIFESTS))}")
        if reason in OUTPUT_REASONS and (not manifests or not all(
                n.startswith(_OUTPUT_PREFIXES) and n.split(":", 1)[1] for n in manifests)):
            out.append(f"a {reason} anchor's manifests are not notebook:<path> / output:<path>")
        out.extend(f"manifests[{n!r}] is not a sha256" for n, v in sorted(manifests.items()) if not _hash_or_none(v))
    return out


@dataclass
class _StageCheck:
    study: str
    stage: str
    folder: str
    prereg: str
    pushed: Pushed | None
    problems: list[Problem] = field(default_factory=list)
    weaker: list[str] = field(default_factory=list)
    covered: set[str] = field(default_factory=set)
    sandbox: Counter[str] = field(default_factory=Counter)

    def p(self, name: str, line: int | None, rule: str, message: str) -> None:
        self.problems.append(Problem(os.path.join(self.folder, name), line, rule, message))

    def run(self) -> StageAudit:
        try:
            self.problems.extend(check_stage(self.folder, self.prereg))
        except Refusal as exc:  # a file it cannot read at all (a FIFO for a receipt): a break, and the rest goes on
            self.problems.append(Problem(exc.path or self.folder, exc.details.get("line"), exc.code,
                                         f"the report's check stopped here: {exc.message}"))
        statuses: dict[str, ChainStatus] = {}
        records: dict[str, list[dict[str, Any]]] = {}
        for name in sorted(n[:-6] for n in os.listdir(self.folder) if n.endswith(".jsonl") and n != "plan.jsonl"):
            path = os.path.join(self.folder, f"{name}.jsonl")
            try:
                statuses[name], records[name] = _intact(path, log_seed(self.study, self.stage, name)
                                                        if name in LOGS else None)
            except Refusal as exc:
                self.p(f"{name}.jsonl", None, "chain", f"{exc.code}: {exc.message}")
                continue
            self.covered.add(path)
            problem = statuses[name].problem
            if name not in LOGS and problem is not None:
                self.p(f"{name}.jsonl", problem.line, "chain", f"{problem.kind}: {problem.message}")
        self.covered.add(os.path.join(self.folder, "plan.jsonl"))
        for name, recs in records.items():
            self.check_repairs(name, recs)
        anchors = records.get("anchors", [])
        manifests, outputs = self.check_anchors(anchors, records.get("run", []))
        receipts = self.check_receipts(records.get("finals", []))
        adir = os.path.join(self.folder, "archive")
        if os.path.isdir(adir):  # the oracle requires each to be a final's byte copy
            self.covered.update(os.path.join(adir, n) for n in os.listdir(adir))
        witnessed = self.check_witness(records.get("run", []), len(anchors)) if self.pushed is not None else {}
        last: dict[str, Any] = next((a for a in reversed(anchors) if isinstance(a.get("logs"), dict)), {"logs": {}})
        logs = []
        for name, status in sorted(statuses.items()):
            got = last["logs"].get(name)
            anchored = got.get("lines") if isinstance(got, dict) else None
            anchored = anchored if isinstance(anchored, int) else 0
            if name != "anchors" and status.lines > anchored:
                self.weaker.append(f"stage {self.stage}: {name}.jsonl lines {anchored + 1}..{status.lines} come "
                                   "after the last anchor (an unanchored tail)")
            logs.append(LogCheck(name, status.lines, status.lines if name == "anchors" else anchored,
                                 witnessed.get(name, 0) if self.pushed is not None else None))
        self.check_uncovered()
        holder = lock_holder(os.path.join(self.folder, ".invocation.lock"))
        if holder is not None:
            self.weaker.append(f"stage {self.stage} was held by pid {holder} while audited: it may have changed")
        return StageAudit(self.stage, self.folder, tuple(logs), len(anchors), manifests, outputs, receipts)

    def check_repairs(self, name: str, recs: list[dict[str, Any]]) -> None:
        for line, rec in enumerate(recs, start=1):
            if rec.get("event") != "log_repair" or "kind" in rec:
                continue
            path = os.path.join(self.folder, str(rec.get("quarantine")))
            self.covered.add(path)
            if not os.path.isfile(path):
                self.p(f"{name}.jsonl", line, "quarantine", f"the quarantine file {rec.get('quarantine')!r} is gone")
            elif sha256_hex(read_bytes(path, max_bytes=_MAX_FILE)) != rec.get("torn_sha256"):
                self.p(f"{name}.jsonl", line, "quarantine", f"{rec.get('quarantine')} does not hash as recorded")

    def check_anchors(self, anchors: list[dict[str, Any]], run: list[dict[str, Any]]) -> tuple[int, tuple[str, ...]]:
        now = time.time()
        run_at = [float(e["at"]) if _number(e.get("at")) else 0.0 for e in run]
        latest_before = [0.0, *itertools.accumulate(run_at, max)]  # the latest time in run.jsonl's first n lines
        before = 0.0
        latest: dict[str, tuple[int, Any]] = {}
        manifests = 0
        for line, a in enumerate(anchors, start=1):
            if a.get("event") == "log_repair" and "kind" not in a:
                continue
            wrong = anchor_form(a, line == 1)
            for message in wrong:
                self.p("anchors.jsonl", line, "anchor_form", message)
            if wrong:
                continue
            at = float(a["at"])
            n_run = a["logs"]["run"]["lines"]
            if at < before:
                self.p("anchors.jsonl", line, "anchor_form", f"at {at} is earlier than the anchor before ({before})")
            if n_run <= len(run) and at < latest_before[n_run]:
                self.p("anchors.jsonl", line, "anchor_form",
                       f"at {at} is earlier than run.jsonl's lines it anchors ({latest_before[n_run]})")
            if at > now + _FUTURE_SLACK_S:
                self.p("anchors.jsonl", line, "anchor_form", f"at {at} is over a day ahead of now ({now:.0f})")
            before = max(before, at)
            manifests += len(a["manifests"])
            for name, sha in a["manifests"].items():
                if name.startswith(_OUTPUT_PREFIXES):
                    latest[name] = (line, sha)
        ends = sum(1 for e in run if e.get("event") == "end")
        end_anchors = sum(1 for a in anchors if a.get("reason") == "end")
        if end_anchors < ends:
            self.p("anchors.jsonl", None, "anchor_form", f"{end_anchors} end anchors for {ends} end events in "
                   "run.jsonl: anchor lines are missing")
        for name, (line, sha) in sorted(latest.items()):
            rel = name.split(":", 1)[1]
            path = os.path.normpath(os.path.join(self.folder, rel))
            self.covered.add(path)
            if not os.path.lexists(path):
                if sha is not None:
                    self.p("anchors.jsonl", line, "output", f"{name}: the file {path} is gone")
                continue
            try:
                now_sha = sha256_hex(read_bytes(path, max_bytes=_MAX_FILE))
            except Refusal as exc:
                self.p("anchors.jsonl", line, "output", f"{name}: {exc.code}: {exc.message}")
                continue
            if now_sha != sha:
                self.problems.append(Problem(path, None, "output", f"sha256 {now_sha} is not {sha}, anchored as "
                                             f"{name} by anchors.jsonl line {line}"))
        return manifests, tuple(n.split(":", 1)[1] for n in sorted(latest))

    def check_receipts(self, finals: list[dict[str, Any]]) -> int:
        count = 0
        for f in finals:
            if not isinstance(f.get("receipt"), str):
                continue
            path = os.path.join(self.folder, f["receipt"])
            self.covered.add(path)
            try:
                receipt = json.loads(read_bytes(path))
            except (Refusal, ValueError):
                continue  # check_stage names a missing or changed receipt
            count += 1
            sandbox = receipt.get("sandbox") if isinstance(receipt, dict) else None
            kind = sandbox.get("kind") if isinstance(sandbox, dict) else sandbox
            self.sandbox[str(kind) if isinstance(kind, str) else "unrecorded"] += 1
        return count

    def check_witness(self, run: list[dict[str, Any]], total: int) -> dict[str, int]:
        """Compare the folder with the remote's latest snapshot; `total` is anchors.jsonl's lines now."""
        assert self.pushed is not None
        target = f"{self.study}/{self.stage}"
        for line, e in enumerate(run, start=1):
            commit = e.get("commit")
            if e.get("event") == "anchor_push" and e.get("ok") is True and commit not in self.pushed.commits:
                self.p("run.jsonl", line, "witness", f"the pushed anchor commit {commit} is not in the history "
                       f"of {self.pushed.remote} (rewritten?)")
        snapshot = self.pushed.snapshot(target)
        if not snapshot:
            if any(e.get("event") == "anchor_push" and e.get("ok") is True for e in run):
                self.p("anchors.jsonl", None, "witness", f"{self.pushed.remote} holds no snapshot of {target}, "
                       "though run.jsonl records pushes")
            else:
                self.weaker.append(f"stage {self.stage}: no snapshot was ever pushed to {self.pushed.remote}")
            return {}
        witnessed = {}
        for rel, data in sorted(snapshot.items()):
            path = os.path.join(self.folder, rel)
            if not os.path.lexists(path):
                self.problems.append(Problem(path, None, "witness", f"in the pushed snapshot "
                                             f"({self.pushed.commit[:12]}) but gone"))
                continue
            try:
                now = read_bytes(path, max_bytes=_MAX_FILE)
            except Refusal as exc:
                self.problems.append(Problem(path, None, "witness", f"{exc.code}: {exc.message}"))
                continue
            if "/" not in rel and rel.endswith(".jsonl") and rel != "plan.jsonl":
                lines = data.count(b"\n")
                if not now.startswith(data):
                    self.problems.append(Problem(path, None, "witness", f"does not continue the pushed snapshot's "
                                                 f"{lines} lines ({self.pushed.commit[:12]})"))
                witnessed[rel[:-6]] = lines
            elif now != data:
                self.problems.append(Problem(path, None, "witness", "differs from the pushed snapshot "
                                             f"({self.pushed.commit[:12]})"))
        if witnessed.get("anchors", 0) < total:
            self.weaker.append(f"stage {self.stage}: anchors.jsonl lines {witnessed.get('anchors', 0) + 1}..{total} "
                               f"are not in the remote's latest snapshot (a push failed or was not made)")
        return witnessed

    def check_uncovered(self) -> None:
        loose = sorted(p for p in _files(self.folder) if p not in self.covered)
        if loose:
            self.weaker.append(f"stage {self.stage}: {len(loose)} files no check covers: "
                               + ", ".join(os.path.relpath(p, self.folder) for p in loose[:10]))


def _files(top: str, skip: Iterable[str] = ()) -> list[str]:
    """Every file below `top` (links included, never followed), without `*.lock` files and the `skip` folders."""
    skipped = set(skip)
    out: list[str] = []
    for here, dirs, files in os.walk(top):
        links = [d for d in dirs if os.path.islink(os.path.join(here, d))]
        out.extend(os.path.join(here, d) for d in links)
        dirs[:] = [d for d in dirs if d not in links and os.path.join(here, d) not in skipped]
        out.extend(os.path.join(here, f) for f in files if not f.endswith(".lock"))
    return out


# --------------------------------------------------------------------------
# The whole study


def audit_results(path: PathArg, *, prereg: PathArg | None = None, root: PathArg | None = None) -> Audit:
    """Audit a study's results (RESULTS, RESULTS/<study> or a stage folder); see the module docstring.

    Args:
        path: the results to audit.
        prereg: the preregistration folder; default: found by the plans' freeze under `root/prereg/`.
        root: the repository root to search (default: the one holding the cwd).

    Raises:
        Refusal: `results_not_found`, `results_mixed` or `prereg_not_found` when nothing can be audited.
    """
    study = _locate(path, prereg, root)
    problems: list[Problem] = []
    weaker: list[str] = []
    frozen: FrozenPrereg | None
    try:
        frozen = check_frozen(study.prereg)
    except Refusal:
        frozen = None  # check_stage names the broken freeze
    design = frozen.design if frozen is not None else _design(study.prereg)
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
        check = _StageCheck(study.study, stage, folder, study.prereg, pushed)
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
        loose = sorted(p for p in _files(study.folder, skip=[f for _, f in study.stages]) if p not in covered)
        if loose:
            weaker.append(f"{len(loose)} files of the study folder no anchor names: "
                          + ", ".join(os.path.relpath(p, study.folder) for p in loose[:10]))
    if sandbox.get("none"):
        weaker.append(f"{sandbox['none']} receipts were verified without a sandbox (sandbox none)")
    if sandbox.get("unrecorded"):
        weaker.append(f"{sandbox['unrecorded']} receipts do not record a sandbox")
    unique = list(dict.fromkeys(problems))  # each stage's check names a broken freeze again
    return Audit(study.study, study.folder, study.prereg, study.frozen_sha256,
                 None if frozen is None else frozen.frozen_at,
                 () if frozen is None else tuple(a.to_json() for a in frozen.amendments), tuple(stages), tuple(unique),
                 tuple(weaker), dict(sorted(sandbox.items())), remote, None if pushed is None else pushed.commit)
