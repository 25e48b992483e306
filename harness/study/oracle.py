"""The run oracle: every invariant a stage folder's files must satisfy, checked from the files alone.

`run_problems(results_dir, prereg_dir=None)` reads each stage folder (a folder
holding `plan.jsonl`, either `results_dir` itself or `results_dir/<study>/<stage>`)
and returns every `Problem` it finds (file, line, rule, message); an empty list
means the run's files are consistent. It recomputes rather than trusts the
runner's bookkeeping: spend, classes, actions, admission inputs, the ceiling's
crossing and every hash are re-derived from the records. It reuses only the
registered rules (`classify`, `action_for`, `admission_decision`, `run_ended`,
`cost_for_spend`) and the chain verifier.

The rules (a problem's `rule`):

    chain            a chained log does not verify (seed, links, canonical form, torn tail)
    attempt_invalid  an attempt record that does not validate, or names a cell outside the plan
    attempt_numbering  attempts of a run not numbered 1, 2, ...; an attempt after its run ended;
                     a rerun that no earlier final asked for
    attempt_logged   an attempt line without exactly one run-log `attempt` event, or an event
                     whose hash, line or fields disagree with the record
    class_action     a logged class or action that is not the one recomputed from the record
    final_link       a final whose attempt link, receipt or replaced list disagrees with the files,
                     whose kind, system, item, arm or repeat is not its plan cell's, or that carries
                     a verdict or receipt without a delivered answer
    archive          an archive missing, not a byte copy of its final, or not listed with its sha256
    reruns_exceeded  an arm (cell) with more than `run.reruns` reruns
    rerun_skipped    a final asking for a rerun with no next rerun, although its invocation went
                     on to its end with the system neither stopped, paused, interrupted nor past
                     the ceiling
    lane             an attempt logged on a lane other than its plan's lane
    lane_order       a lane admitting items out of their plan (draw) order within an invocation,
                     attempting an item other than the one it last admitted, or running an
                     item's arms out of their drawn order
    lane_overlap     two attempts on one lane overlapping in time
    admission_rule   a decision or reason that is not `admission_decision` of its logged inputs
    admission_inputs logged inputs that are not what the files imply: finished spend (records
                     and late costs before it), items under way, cap, reserve, refusals before,
                     the ceiling's total and crossing
    halted           an attempt started or an item admitted during a pause, after a stop or a
                     first signal in the same invocation, or after the ceiling's crossing
    ceiling          spend past the ceiling without a ceiling event for every system, or a ceiling
                     event logged at the wrong time
    conservation     a ceiling event's total that is not spend before plus every record's cost
                     ("unknown" counted as the reserve) plus every late cost up to the crossing
    late_cost        a late cost that names no abandoned attempt, or two for one attempt
    anchor           an anchor whose line count and head are not a prefix of the log as it is
                     now, or whose manifest sha256 is not the file's
    final_missing    a run ended by an attempt without its final, although its invocation went on
                     to its end with no harness stop (a failed verifier) or runner error after it
    incomplete       an invocation that logged `complete: true` while a cell has no standing final
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.errors import Refusal
from harness.evidence.chain import verify_log
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.meter.pricing import BUNDLED_PRICING
from harness.study.attempts import PlanRequest, read_plan
from harness.study.run_records import (
    FINAL_KIND,
    LOGS,
    AdmissionInputs,
    action_for,
    admission_decision,
    archive_name,
    classify,
    cost_for_spend,
    log_seed,
    receipt_name,
    run_ended,
    validate_run_attempt,
)

__all__ = ["Problem", "run_problems"]

PathArg = str | os.PathLike[str]
_REL = 1e-9
_ABS = 1e-12


@dataclass(frozen=True)
class Problem:
    """One broken invariant: the file (absolute path), its 1-based line or None, the rule, a message."""

    file: str
    line: int | None
    rule: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: [{self.rule}] {self.message}"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=_ABS)


@dataclass(frozen=True)
class _Rules:
    reruns: int
    transport_retries: int
    reserve: float | None
    ceiling: float | None
    spend_before: float | None
    caps: Mapping[str, float]
    manifests: Mapping[str, str]


def _stage_folders(results_dir: str) -> list[str]:
    if os.path.exists(os.path.join(results_dir, "plan.jsonl")):
        return [results_dir]
    out = []
    for study in sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []:
        sdir = os.path.join(results_dir, study)
        if not os.path.isdir(sdir):
            continue
        for stage in sorted(os.listdir(sdir)):
            if os.path.exists(os.path.join(sdir, stage, "plan.jsonl")):
                out.append(os.path.join(sdir, stage))
    return out


def run_problems(results_dir: PathArg, *, prereg_dir: PathArg | None = None) -> list[Problem]:
    """Every problem with the run files under `results_dir` (a stage folder or a results root).

    With `prereg_dir` the registered rules (reruns, transport retries, reserve, caps,
    ceiling, spend before, manifests) come from the frozen preregistration; without it
    they come from the run log's `start` events and the admission records (reruns
    defaults to the registered default, 2).
    """
    root = os.path.abspath(os.fspath(results_dir))
    folders = _stage_folders(root)
    if not folders:
        return [Problem(root, None, "chain", "no stage folder (plan.jsonl) found")]
    problems: list[Problem] = []
    for folder in folders:
        problems.extend(_Check(folder, None if prereg_dir is None else os.fspath(prereg_dir)).run())
    return problems


class _Check:
    def __init__(self, folder: str, prereg: str | None) -> None:
        self.folder = folder
        self.prereg = prereg
        self.problems: list[Problem] = []

    def p(self, name: str, line: int | None, rule: str, message: str) -> None:
        self.problems.append(Problem(os.path.join(self.folder, name), line, rule, message))

    # ---- reading

    def _log(self, name: str) -> tuple[list[dict[str, Any]], list[str]]:
        """The intact records of a log and each line's sha256 (a chain problem is reported)."""
        path = os.path.join(self.folder, f"{name}.jsonl")
        if not os.path.lexists(path):
            return [], []
        status = verify_log(path, log_seed(self.study, self.stage, name))
        if status.problem is not None:
            self.p(f"{name}.jsonl", status.problem.line, "chain",
                   f"{status.problem.kind}: {status.problem.message}")
        raw = read_bytes(path).split(b"\n")[: status.lines]
        return [json.loads(r) for r in raw], [sha256_hex(r) for r in raw]

    def _rules(self, requests: tuple[PlanRequest, ...]) -> _Rules:
        if self.prereg is not None:
            from harness.study.prereg import check_frozen

            frozen = check_frozen(self.prereg)
            d = frozen.design
            local = os.path.join(self.prereg, "pricing.yaml")
            manifests = {"plan.jsonl": os.path.join(self.folder, "plan.jsonl"),
                         "FROZEN.json": os.path.join(frozen.path, "FROZEN.json"),
                         "pricing": local if os.path.exists(local) else str(BUNDLED_PRICING)}
            return _Rules(d.run.reruns, d.run.transport_retries, d.budgets.reserve_per_item_usd,
                          d.budgets.ceiling_usd, d.budgets.spend_before_usd,
                          {s.slot: s.cap_usd for s in d.systems}, manifests)
        starts = [e for e in self.events if e.get("event") == "start"]
        caps = {s["slot"]: float(s["cap_usd"]) for e in starts[:1] for s in e.get("systems", [])}
        reserve = next((float(a["reserve_usd"]) for a in self.admissions), None)
        most = max((int(r["attempt"]) for r in self.attempts), default=1)
        return _Rules(2, max(0, most - 1), reserve,
                      float(starts[0]["ceiling_usd"]) if starts else None,
                      float(starts[0]["spend_before_usd"]) if starts else None, caps,
                      {"plan.jsonl": os.path.join(self.folder, "plan.jsonl")})

    # ---- the whole check

    def run(self) -> list[Problem]:
        try:
            plan = read_plan(os.path.join(self.folder, "plan.jsonl"))
        except Refusal as exc:
            self.p("plan.jsonl", None, "chain", f"the plan does not read: {exc.code}: {exc.message}")
            return self.problems
        self.requests = {r.run_id: r for r in plan.requests}
        self.study = str(plan.header["study"])
        self.stage = str(plan.header.get("stage") or os.path.basename(self.folder))
        logs = {name: self._log(name) for name in LOGS}
        self.heads = {name: v[1] for name, v in logs.items()}
        self.attempts_all, _ = logs["attempts"]
        self.events = [e for e in logs["run"][0] if not (e.get("event") == "log_repair" and "kind" not in e)]
        self.admissions = [a for a in logs["admission"][0] if "kind" in a]
        self.attempts = [a for a in self.attempts_all if not (a.get("event") == "log_repair" and "kind" not in a)]
        self.rules = self._rules(plan.requests)
        self.check_attempts(logs["attempts"])
        self.check_run_log(logs["run"])
        self.check_finals(logs["finals"])
        self.check_archives()
        self.check_lanes()
        self.check_spend()
        self.check_admissions(logs["admission"][0])
        self.check_halts()
        self.check_anchors(logs["anchors"][0])
        return self.problems

    # ---- attempts and the run log's attempt lines

    def check_attempts(self, log: tuple[list[dict[str, Any]], list[str]]) -> None:
        records, shas = log
        # (run_id, rerun) -> [(line, record, sha)]
        self.runs: dict[tuple[str, int], list[tuple[int, dict[str, Any], str]]] = {}
        self.by_line: dict[int, tuple[dict[str, Any], str]] = {}
        for line, (rec, sha) in enumerate(zip(records, shas, strict=True), start=1):
            if rec.get("event") == "log_repair" and "kind" not in rec:
                continue
            body = {k: v for k, v in rec.items() if k not in ("prev", "seed")}
            try:
                validate_run_attempt(body, line, reruns=10**6)
            except Refusal as exc:
                self.p("attempts.jsonl", line, "attempt_invalid", exc.message)
                continue
            req = self.requests.get(body["run_id"])
            if req is None or body["request_sha256"] != req.request_sha256:
                self.p("attempts.jsonl", line, "attempt_invalid", "run id or request not in the stage's plan")
                continue
            if body["rerun"] > self.rules.reruns:
                self.p("attempts.jsonl", line, "reruns_exceeded",
                       f"{body['run_id']}: rerun {body['rerun']} > run.reruns {self.rules.reruns}")
            run = self.runs.setdefault((body["run_id"], body["rerun"]), [])
            if body["attempt"] != len(run) + 1:
                self.p("attempts.jsonl", line, "attempt_numbering",
                       f"{body['run_id']} rerun {body['rerun']}: attempt {body['attempt']}, expected {len(run) + 1}")
            if run and run_ended(run[-1][1], self.rules.transport_retries):
                self.p("attempts.jsonl", line, "attempt_numbering", f"{body['run_id']}: an attempt after its run ended")
            run.append((line, body, sha))
            self.by_line[line] = (body, sha)

    def check_run_log(self, log: tuple[list[dict[str, Any]], list[str]]) -> None:
        seen: dict[int, int] = {}
        self.attempt_events: list[tuple[int, dict[str, Any]]] = []
        for line, e in enumerate(log[0], start=1):
            if e.get("event") != "attempt":
                continue
            self.attempt_events.append((line, e))
            n = int(e.get("attempts_line", -1))
            seen[n] = seen.get(n, 0) + 1
            got = self.by_line.get(n)
            if got is None:
                self.p("run.jsonl", line, "attempt_logged", f"attempts line {n} does not exist")
                continue
            rec, sha = got
            if e.get("attempt_sha256") != sha:
                self.p("run.jsonl", line, "attempt_logged", f"attempts line {n} does not hash as logged")
            for key in ("run_id", "rerun", "attempt", "started", "ended", "cost_usd"):
                if e.get(key) != rec.get(key):
                    self.p("run.jsonl", line, "attempt_logged", f"{key} {e.get(key)!r} is not the record's {rec.get(key)!r}")
            if e.get("system") != self.requests[rec["run_id"]].system:
                self.p("run.jsonl", line, "attempt_logged", "system is not the plan's")
            if e.get("class") != classify(rec):
                self.p("run.jsonl", line, "class_action", f"class {e.get('class')!r} is not {classify(rec)!r}")
        for n in self.by_line:
            if seen.get(n, 0) != 1:
                self.p("attempts.jsonl", n, "attempt_logged", f"{seen.get(n, 0)} run-log lines (exactly one owed)")

    # ---- finals, receipts, archives

    def check_finals(self, log: tuple[list[dict[str, Any]], list[str]]) -> None:
        records, _ = log
        self.finals: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        reruns = self.rules.reruns
        for line, rec in enumerate(records, start=1):
            rid = rec.get("run_id")
            if rid not in self.requests:
                self.p("finals.jsonl", line, "final_link", f"run id {rid!r} not in the plan")
                continue
            mine = self.finals.setdefault(str(rid), [])
            req = self.requests[str(rid)]
            if [rec.get(k) for k in ("kind", "system", "item", "arm", "repeat")] != [
                    FINAL_KIND, req.system, req.item, req.arm, req.repeat]:
                self.p("finals.jsonl", line, "final_link", "kind, system, item, arm or repeat is not the plan's")
            rerun = rec.get("rerun")
            if rerun != len(mine):
                self.p("finals.jsonl", line, "final_link", f"rerun {rerun!r}: expected {len(mine)}")
            if mine and mine[-1][1].get("action") == "stand":
                self.p("finals.jsonl", line, "final_link", "a final after the cell's standing final")
            got = self.by_line.get(int(rec.get("attempt_line", -1)))
            run = self.runs.get((str(rid), int(rerun if isinstance(rerun, int) else -1)), [])
            if got is None or not run or run[-1][0] != rec.get("attempt_line") or got[1] != rec.get("attempt_sha256"):
                self.p("finals.jsonl", line, "final_link", "attempt_line/attempt_sha256 is not its run's last attempt")
            else:
                attempt = got[0]
                if not run_ended(attempt, self.rules.transport_retries):
                    self.p("finals.jsonl", line, "final_link", "the linked attempt did not end its run")
                cls = classify(attempt)
                want = action_for(cls, int(rerun), reruns)  # type: ignore[arg-type]
                if rec.get("class") != cls or rec.get("action") != want:
                    self.p("finals.jsonl", line, "class_action",
                           f"{rec.get('class')}/{rec.get('action')} is not the recomputed {cls}/{want}")
                if rec.get("attempt") != attempt["attempt"] or rec.get("error_code") != attempt.get("error_code"):
                    self.p("finals.jsonl", line, "final_link", "attempt or error_code is not the record's")
                if cls != "delivered" and any(rec.get(k) is not None for k in ("passed", "receipt", "receipt_sha256")):
                    # the report scores `passed`: only a verified delivered answer may carry one
                    self.p("finals.jsonl", line, "final_link", f"a {cls} final carries a verdict or a receipt")
                if cls == "delivered":
                    name = receipt_name(str(rid), int(rerun))  # type: ignore[arg-type]
                    path = os.path.join(self.folder, name)
                    if rec.get("receipt") != name or not os.path.exists(path):
                        self.p("finals.jsonl", line, "final_link", f"the receipt {name} is missing")
                    elif sha256_hex(read_bytes(path)) != rec.get("receipt_sha256"):
                        self.p("finals.jsonl", line, "final_link", "receipt_sha256 is not the receipt's")
            replaced = rec.get("replaced")
            if not isinstance(replaced, list) or len(replaced) != len(mine):
                self.p("finals.jsonl", line, "archive", "replaced does not list every earlier final")
            else:
                for entry, (_, old) in zip(replaced, mine, strict=True):
                    self._archive(line, str(rid), old, entry)
            mine.append((line, rec))
        for (rid, rerun), _ in self.runs.items():
            if rerun > 0:
                prior = self.finals.get(rid, [])
                if len(prior) < rerun or prior[rerun - 1][1].get("action") == "stand":
                    self.p("attempts.jsonl", self.runs[(rid, rerun)][0][0], "attempt_numbering",
                           f"{rid}: rerun {rerun} that no final asked for")

    def _archive(self, line: int, rid: str, old: Mapping[str, Any], entry: Any) -> None:
        want = archive_name(rid, int(old["rerun"]))
        path = os.path.join(self.folder, want)
        if not isinstance(entry, dict) or entry.get("archive") != want or not os.path.exists(path):
            self.p("finals.jsonl", line, "archive", f"{want} is missing or not listed")
            return
        data = read_bytes(path)
        if data != canonical_bytes(old) + b"\n":
            self.p(want, None, "archive", "not a byte copy of the replaced final")
        if entry.get("sha256") != sha256_hex(data):
            self.p("finals.jsonl", line, "archive", f"{want}: sha256 is not the archive's")
        if entry.get("attempt_sha256") != old.get("attempt_sha256"):
            self.p("finals.jsonl", line, "archive", f"{want}: attempt_sha256 is not the replaced final's")

    def check_archives(self) -> None:
        adir = os.path.join(self.folder, "archive")
        finals = {archive_name(rid, int(rec["rerun"])): rec for rid, fs in self.finals.items() for _, rec in fs}
        for name in sorted(os.listdir(adir)) if os.path.isdir(adir) else []:
            rel = f"archive/{name}"
            rec = finals.get(rel)
            if rec is None or read_bytes(os.path.join(adir, name)) != canonical_bytes(rec) + b"\n":
                self.p(rel, None, "archive", "an archive that is no final's byte copy")

    # ---- invocations, lanes

    def invocation_of(self, t: float) -> int:
        """The index of the invocation (start event) in force at time t (-1 before any)."""
        return bisect.bisect_right(self.start_times, t) - 1

    def check_lanes(self) -> None:
        self.start_times = [float(e["at"]) for e in self.events if e.get("event") == "start"]
        on_lane: dict[tuple[str, int], list[tuple[float, float, int, dict[str, Any]]]] = {}
        for line, e in self.attempt_events:
            logged = self.by_line.get(int(e.get("attempts_line", -1)))
            if logged is None:
                continue
            att = logged[0]
            req = self.requests[att["run_id"]]
            if e.get("lane") != req.lane:
                self.p("run.jsonl", line, "lane", f"{req.run_id} logged on lane {e.get('lane')}, planned {req.lane}")
            on_lane.setdefault((req.system, req.lane), []).append(
                (float(att["started"]), float(att["ended"]), line, att))
        for (system, lane), spans in on_lane.items():
            spans.sort(key=lambda s: (s[0], s[1]))
            for a, b in itertools.pairwise(spans):
                if b[0] < a[1]:
                    self.p("run.jsonl", b[2], "lane_overlap",
                           f"{system} lane {lane}: an attempt started at {b[0]} before the one at {a[0]} ended at {a[1]}")
        # admissions per lane, in plan order within an invocation; attempts on the last admitted item
        admits: dict[tuple[str, int], list[tuple[float, int, str]]] = {}
        for line, adm in enumerate(self.admissions, start=1):
            if adm.get("decision") == "admit":
                admits.setdefault((adm["system"], int(adm["lane"])), []).append((float(adm["at"]), line, adm["item"]))
        position = {(r.system, r.item): r.lane_position for r in self.requests.values()}
        for (system, lane), seq in admits.items():
            for (t0, _, i0), (t1, line, i1) in itertools.pairwise(seq):
                if self.invocation_of(t0) == self.invocation_of(t1) and position.get((system, i1), -1) <= position.get((system, i0), -1):
                    self.p("admission.jsonl", line, "lane_order",
                           f"{system} lane {lane}: item {i1} admitted after {i0} in the same invocation")
            for a_line, (_, _, item) in enumerate(seq):
                if position.get((system, item)) is None:
                    self.p("admission.jsonl", seq[a_line][1], "lane_order", f"item {item} is not planned for {system}")
        for (system, lane), spans in on_lane.items():
            seq = admits.get((system, lane), [])
            times = [s[0] for s in seq]
            # per (invocation, item): the runs in start order must go in passes of drawn arm order
            order: dict[tuple[int, int], list[tuple[float, int, dict[str, Any]]]] = {}
            for started, _, line, rec in spans:
                i = bisect.bisect_right(times, started) - 1
                req = self.requests[rec["run_id"]]
                if i < 0 or seq[i][2] != req.item or self.invocation_of(seq[i][0]) != self.invocation_of(started):
                    self.p("run.jsonl", line, "lane_order",
                           f"{system} lane {lane}: an attempt on item {req.item} that is not the item last admitted")
                    continue
                if rec["attempt"] == 1:
                    order.setdefault((i, 0), []).append((started, line, rec))
            for runs in order.values():
                prev: tuple[int, int] | None = None
                for _, line, rec in runs:
                    req = self.requests[rec["run_id"]]
                    key = (req.arm_position, req.repeat)
                    if prev is not None and key <= prev and rec["rerun"] == 0:
                        self.p("run.jsonl", line, "lane_order",
                               f"{req.run_id}: arm {req.arm} run out of its drawn order")
                    prev = key

    # ---- spend, ceiling, conservation

    def check_spend(self) -> None:
        reserve = self.rules.reserve if self.rules.reserve is not None else 0.0
        # (time, kind order, system, amount, where)
        spend: list[tuple[float, str, float]] = []
        abandoned = {(r["run_id"], r["rerun"], r["attempt"]) for r, _ in self.by_line.values()
                     if r.get("error_code") in ("AttemptDeadline", "budget_stop")}
        lates: set[tuple[str, int, int]] = set()
        for rec, _ in self.by_line.values():
            spend.append((float(rec["ended"]), self.requests[rec["run_id"]].system,
                          cost_for_spend(rec["cost_usd"], reserve)))
        for line, e in enumerate(self.events, start=1):
            if e.get("event") != "late_cost":
                continue
            key = (e.get("run_id"), e.get("rerun"), e.get("attempt"))
            if key not in abandoned or key in lates:
                self.p("run.jsonl", line, "late_cost", f"late cost for {key}: no abandoned attempt, or a second one")
            lates.add(key)  # type: ignore[arg-type]
            spend.append((float(e["at"]), str(e["system"]), cost_for_spend(e["cost_usd"], reserve)))
        spend.sort(key=lambda s: s[0])
        self.spend = spend
        self.spend_times = [s[0] for s in spend]
        before = self.rules.spend_before or 0.0
        ceiling = self.rules.ceiling
        crossing: tuple[float, float] | None = None
        parts: list[float] = [before]
        for t, _, amount in spend:
            parts.append(amount)
            total = math.fsum(parts)
            if ceiling is not None and total > ceiling and crossing is None:
                crossing = (t, total)
        self.crossing = crossing
        events = [(line, e) for line, e in enumerate(self.events, start=1) if e.get("event") == "ceiling"]
        if crossing is None and events:
            # a crossing counted from spend before alone, or a logged total the files don't imply
            for line, e in events:
                self.p("run.jsonl", line, "conservation",
                       f"a ceiling event (total {e.get('total_usd')}) although spend never crosses {ceiling}")
        if crossing is not None:
            systems = {r.system for r in self.requests.values()}
            if {e.get("system") for _, e in events} != systems:
                self.p("run.jsonl", None, "ceiling", f"spend crossed the ceiling at {crossing[0]} "
                       f"but systems {sorted(systems - {e.get('system') for _, e in events})} have no ceiling event")
            for line, e in events:
                at = float(e["crossed_at"])
                if at < crossing[0]:
                    self.p("run.jsonl", line, "ceiling", f"crossed_at {at} before the crossing record at {crossing[0]}")
                nxt = bisect.bisect_right(self.spend_times, crossing[0])
                if nxt < len(self.spend_times) and at > self.spend_times[nxt]:
                    self.p("run.jsonl", line, "ceiling", f"crossed_at {at} logged late (after spend at "
                           f"{self.spend_times[nxt]})")
                if not _close(float(e["total_usd"]), crossing[1]):
                    self.p("run.jsonl", line, "conservation",
                           f"ceiling total {e['total_usd']} is not spend before + records + late costs = {crossing[1]}")
            self.crossed_at = min([crossing[0], *(float(e["crossed_at"]) for _, e in events)])

    def finished(self, system: str | None, t: float, *, inclusive: bool) -> float:
        end = (bisect.bisect_right if inclusive else bisect.bisect_left)(self.spend_times, t)
        return math.fsum(a for _, s, a in self.spend[:end] if system is None or s == system)

    # ---- admission

    def check_admissions(self, records: list[dict[str, Any]]) -> None:
        refused: set[str] = set()
        reserve, before = self.rules.reserve, self.rules.spend_before or 0.0
        admits: dict[tuple[str, int], list[tuple[float, str]]] = {}
        ends: dict[tuple[str, int], list[float]] = {}
        for e in self.events:
            if e.get("event") == "lane" and e.get("what") == "end":
                ends.setdefault((e["system"], int(e["lane"])), []).append(float(e["at"]))
        for a in records:
            if a.get("decision") == "admit":
                admits.setdefault((a["system"], int(a["lane"])), []).append((float(a["at"]), a["item"]))
        for line, a in enumerate(records, start=1):
            if "kind" not in a:
                continue
            try:
                inputs = AdmissionInputs(
                    system=a["system"], item=a["item"], lane=int(a["lane"]), finished_usd=float(a["finished_usd"]),
                    reserve_usd=float(a["reserve_usd"]), under_way=int(a["under_way"]), cap_usd=float(a["cap_usd"]),
                    refused_before=bool(a["refused_before"]), total_usd=float(a["ceiling"]["total_usd"]),
                    ceiling_usd=float(a["ceiling"]["ceiling_usd"]), crossed=bool(a["ceiling"]["crossed"]))
            except (KeyError, TypeError, ValueError) as exc:
                self.p("admission.jsonl", line, "admission_rule", f"unreadable inputs: {exc!r}")
                continue
            if (a.get("decision"), a.get("reason")) != admission_decision(inputs):
                self.p("admission.jsonl", line, "admission_rule", f"{a.get('decision')}/{a.get('reason')} is not "
                       f"the rule's {'/'.join(admission_decision(inputs))} for its inputs")
            if not _close(float(a.get("projected_usd", math.nan)), inputs.projected_usd):
                self.p("admission.jsonl", line, "admission_rule", "projected_usd is not finished + reserve x under_way")
            t, system = float(a["at"]), inputs.system

            def bad(what: str, line: int = line) -> None:
                self.p("admission.jsonl", line, "admission_inputs", what)

            lo, hi = self.finished(system, t, inclusive=False), self.finished(system, t, inclusive=True)
            if not (_close(inputs.finished_usd, lo) or _close(inputs.finished_usd, hi)):
                bad(f"finished_usd {inputs.finished_usd} is not the system's spend before it ({lo})")
            tlo = math.fsum([before, self.finished(None, t, inclusive=False)])
            thi = math.fsum([before, self.finished(None, t, inclusive=True)])
            if not (_close(inputs.total_usd, tlo) or _close(inputs.total_usd, thi)):
                bad(f"ceiling total {inputs.total_usd} is not spend before + all spend before it ({tlo})")
            if reserve is not None and not _close(inputs.reserve_usd, reserve):
                bad(f"reserve_usd {inputs.reserve_usd} is not the registered {reserve}")
            if system in self.rules.caps and not _close(inputs.cap_usd, self.rules.caps[system]):
                bad(f"cap_usd {inputs.cap_usd} is not the registered {self.rules.caps[system]}")
            if self.rules.ceiling is not None and not _close(inputs.ceiling_usd, self.rules.ceiling):
                bad(f"ceiling_usd {inputs.ceiling_usd} is not the registered {self.rules.ceiling}")
            if inputs.refused_before != (system in refused):
                bad(f"refused_before {inputs.refused_before} but the log says {system in refused}")
            crossed = self.crossing is not None and self.crossed_at <= t
            maybe = self.crossing is not None and self.crossing[0] <= t
            if inputs.crossed != crossed and not (maybe and inputs.crossed):
                bad(f"crossed {inputs.crossed} but the files say {crossed}")
            # items under way: this one, and at most one per other lane whose admitted item is not yet done
            hi_way, lo_way = 1, 1
            for (s, lane), seq in admits.items():
                if s != system or lane == inputs.lane:
                    continue
                prior = [x for x in seq if x[0] < t and self.invocation_of(x[0]) == self.invocation_of(t)]
                if not prior:
                    continue
                last_at, item = prior[-1]
                ended = [x for x in ends.get((s, lane), []) if last_at <= x]
                if ended and ended[0] < t:
                    continue
                hi_way += 1
                if any(self.requests[r["run_id"]].item == item and self.requests[r["run_id"]].lane == lane
                       and float(r["started"]) >= t for r, _ in self.by_line.values()):
                    lo_way += 1
            if not lo_way <= inputs.under_way <= hi_way:
                bad(f"under_way {inputs.under_way}: the files imply {lo_way}..{hi_way}")
            if a.get("decision") == "refuse":
                refused.add(system)

    # ---- pauses, stops, signals, the ceiling

    def check_halts(self) -> None:
        # per system: intervals in which nothing may start, [from, until)
        systems = {r.system for r in self.requests.values()}
        halts: dict[str, list[tuple[float, float, str]]] = {s: [] for s in systems}
        starts = [*self.start_times, math.inf]
        paused: dict[str, float] = {}
        for e in self.events:
            ev, at = e.get("event"), float(e.get("at", 0.0))
            if ev == "pause":
                paused.setdefault(str(e["system"]), at)
            elif ev == "resume_paused" and str(e["system"]) in paused:
                halts[str(e["system"])].append((paused.pop(str(e["system"])), at, "a pause"))
            elif ev in ("stop", "signal"):
                until = starts[bisect.bisect_right(starts, at)]
                targets = systems if e.get("system") is None else {str(e["system"])}
                for s in targets:
                    halts.setdefault(s, []).append((at, until, "a stop" if ev == "stop" else "a signal"))
        for s, at in paused.items():
            halts[s].append((at, math.inf, "a pause"))
        if self.crossing is not None:
            for s in systems:
                halts[s].append((self.crossed_at, math.inf, "the ceiling's crossing"))
        for line, e in self.attempt_events:
            got = self.by_line.get(int(e.get("attempts_line", -1)))
            if got is None:
                continue
            rec = got[0]
            system, t = self.requests[rec["run_id"]].system, float(rec["started"])
            for lo, hi, why in halts.get(system, []):
                if lo < t < hi:
                    self.p("run.jsonl", line, "halted", f"{rec['run_id']} started at {t} after {why} at {lo}")
        for line, a in enumerate(self.admissions, start=1):
            if a.get("decision") != "admit":
                continue
            t = float(a["at"])
            for lo, hi, why in halts.get(a["system"], []):
                if lo < t < hi:
                    self.p("admission.jsonl", line, "halted", f"item {a['item']} admitted at {t} after {why} at {lo}")
        self.check_skipped(halts)

    def check_skipped(self, halts: Mapping[str, list[tuple[float, float, str]]]) -> None:
        ends = [(float(e["at"]), e) for e in self.events if e.get("event") == "end"]
        for rid, fs in self.finals.items():
            if not fs or fs[-1][1].get("action") != "rerun":
                continue
            line, final = fs[-1]
            if (rid, int(final["rerun"]) + 1) in self.runs:
                continue
            t = float(final["at"])
            inv = self.invocation_of(t)
            end = next((at for at, _ in ends if at >= t and self.invocation_of(at) == inv), None)
            if end is None:
                continue  # the invocation did not end (a crash): the next one owes the rerun
            system = self.requests[rid].system
            if any(lo <= end and hi > t for lo, hi, _ in halts.get(system, [])):
                continue
            self.p("finals.jsonl", line, "rerun_skipped",
                   f"{rid}: rerun {final['rerun'] + 1} owed but never run though the invocation ended at {end}")
        # A run's end owes its final at once; only a failed verifier (a harness stop) or a runner error
        # leaves it owed when the invocation goes on to its end (a crash leaves no end).
        failed = [(float(e["at"]), e.get("system")) for e in self.events
                  if e.get("event") == "stop" and e.get("cause") in ("harness", "runner-error")]
        for (rid, rerun), run in self.runs.items():
            line, rec, _ = run[-1]
            if not run_ended(rec, self.rules.transport_retries) or any(
                    f.get("rerun") == rerun for _, f in self.finals.get(rid, [])):
                continue
            t = float(rec["ended"])
            inv = self.invocation_of(t)
            end = next((at for at, _ in ends if at >= t and self.invocation_of(at) == inv), None)
            system = self.requests[rid].system
            if end is None or any(t <= at <= end and s in (None, system) for at, s in failed):
                continue
            self.p("attempts.jsonl", line, "final_missing",
                   f"{rid}: rerun {rerun} ended at {t} without a final though its invocation ended at {end}")
        for at, e in ends:
            if e.get("complete") is True:
                inv = self.invocation_of(at)
                for rid in self.requests:
                    done = [f for _, f in self.finals.get(rid, []) if self.invocation_of(float(f["at"])) <= inv]
                    if not done or done[-1].get("action") != "stand":
                        self.p("run.jsonl", None, "incomplete", f"complete logged at {at} but {rid} does not stand")
                        break

    # ---- anchors

    def check_anchors(self, records: list[dict[str, Any]]) -> None:
        for line, a in enumerate(records, start=1):
            for name, got in (a.get("logs") or {}).items():
                heads = self.heads.get(name)
                if heads is None or not isinstance(got, dict):
                    self.p("anchors.jsonl", line, "anchor", f"an anchor for an unknown log {name!r}")
                    continue
                n, head = int(got.get("lines", -1)), got.get("head")
                if n == 0:
                    ok = head is None or head == _seed_hash(log_seed(self.study, self.stage, name))
                else:
                    ok = 0 < n <= len(heads) and heads[n - 1] == head
                if not ok:
                    self.p("anchors.jsonl", line, "anchor",
                           f"{name}: {n} lines with head {head} is not a prefix of the log ({len(heads)} lines)")
            for name, sha in (a.get("manifests") or {}).items():
                path = self.rules.manifests.get(name)
                if path is None:
                    continue
                now = sha256_hex(read_bytes(path)) if os.path.exists(path) else None
                if sha != now:
                    self.p("anchors.jsonl", line, "anchor", f"manifest {name}: sha256 {sha} is not the file's {now}")


def _seed_hash(seed: str) -> str:
    from harness.evidence.chain import seed_hash

    return seed_hash(seed)
