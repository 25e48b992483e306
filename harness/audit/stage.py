"""The audit of one stage folder: anchor forms, output manifests, quarantines, receipts, the witness.

Everything `proctor report` validates comes from `harness.audit.report.check_stage`;
this module adds what only the audit checks (see `harness.audit.audit`).

The manual: docs/audit.md.
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
from harness.audit.oracle.work import work_paths
from harness.audit.report import check_stage
from harness.errors import Refusal
from harness.evidence.chain_read import PROBLEM_KINDS, ChainStatus, verify_log
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.lock import lock_holder
from harness.records.anchor import ANCHOR_FIELDS, ANCHOR_KIND
from harness.run.anchor_push import Pushed
from harness.run.anchors import OUTPUT_REASONS
from harness.run.layout import LOGS, log_seed

__all__ = ["ANCHOR_REASONS", "LogCheck", "StageAudit", "StageCheck", "anchor_form", "files_below"]

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
    want = {*ANCHOR_FIELDS, "prev", *(("seed",) if first else ())}
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
class StageCheck:
    """The audit of one stage folder: `run()` checks it, collecting problems, weaker guarantees and covered files."""

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
        self.covered.update(work_paths(self.folder, records.get("attempts", [])))  # the oracle's rule `work`
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
        loose = sorted(p for p in files_below(self.folder) if p not in self.covered)
        if loose:
            self.weaker.append(f"stage {self.stage}: {len(loose)} files no check covers: "
                               + ", ".join(os.path.relpath(p, self.folder) for p in loose[:10]))


def files_below(top: str, skip: Iterable[str] = ()) -> list[str]:
    """Every file below `top` (links included, never followed), without `*.lock` files and the `skip` folders."""
    skipped = set(skip)
    out: list[str] = []
    for here, dirs, files in os.walk(top):
        links = [d for d in dirs if os.path.islink(os.path.join(here, d))]
        out.extend(os.path.join(here, d) for d in links)
        dirs[:] = [d for d in dirs if d not in links and os.path.join(here, d) not in skipped]
        out.extend(os.path.join(here, f) for f in files if not f.endswith(".lock"))
    return out
