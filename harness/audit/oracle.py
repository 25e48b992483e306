"""The run oracle: every invariant a stage folder's files must satisfy, checked from the files alone.

The manual: docs/audit.md.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.errors import Refusal
from harness.evidence.chain import verify_log
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.meter.pricing import BUNDLED_PRICING
from harness.run.attempts import PlanRequest, read_plan
from harness.run.records import (
    ADMISSION_KIND,
    ANCHOR_KIND,
    FINAL_KIND,
    INCONCLUSIVE_ITEMS_LIMIT,
    LOGS,
    RUN_EVENT_KIND,
    STOP_CAUSES,
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
_ABANDONED = ("AttemptDeadline", "budget_stop")
"""The error codes of an attempt abandoned while its request was under way (its spend may come late)."""


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

    def _log(self, name: str) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
        """The intact records of a log as (line, record), without repair lines, and every intact line's sha256.

        A chain problem, or a path that is no regular file, is reported (rule `chain`).
        """
        path = os.path.join(self.folder, f"{name}.jsonl")
        if not os.path.lexists(path):
            return [], []
        try:
            status = verify_log(path, log_seed(self.study, self.stage, name))
            raw = read_bytes(path).split(b"\n")[: status.lines]
        except Refusal as exc:
            self.p(f"{name}.jsonl", None, "chain", f"{exc.code}: {exc.message}")
            return [], []
        if status.problem is not None:
            self.p(f"{name}.jsonl", status.problem.line, "chain",
                   f"{status.problem.kind}: {status.problem.message}")
        records = [(line, json.loads(r)) for line, r in enumerate(raw, start=1)]
        return [(line, r) for line, r in records if not _repair(r)], [sha256_hex(r) for r in raw]

    def _shaped(self, name: str, records: list[tuple[int, dict[str, Any]]],
                problem: Callable[[Any], tuple[str, str] | None]) -> list[tuple[int, dict[str, Any]]]:
        """The records whose fields the rules can read; each other one is a problem under its log's rule."""
        out = []
        for line, rec in records:
            bad = problem(rec)
            if bad is None:
                out.append((line, rec))
            else:
                self.p(f"{name}.jsonl", line, bad[0], f"malformed record: {bad[1]}")
        return out

    def _rules(self, requests: tuple[PlanRequest, ...]) -> _Rules:
        if self.prereg is not None:
            from harness.prereg.freeze import check_frozen

            frozen = check_frozen(self.prereg)
            d = frozen.design
            local = os.path.join(self.prereg, "pricing.yaml")
            manifests = {"plan.jsonl": os.path.join(self.folder, "plan.jsonl"),
                         "FROZEN.json": os.path.join(frozen.path, "FROZEN.json"),
                         "pricing": local if os.path.exists(local) else str(BUNDLED_PRICING)}
            return _Rules(d.run.reruns, d.run.transport_retries, d.budgets.reserve_per_item_usd,
                          d.budgets.ceiling_usd, d.budgets.spend_before_usd,
                          {s.slot: s.cap_usd for s in d.systems}, manifests)
        starts = [e for _, e in self.events if e["event"] == "start"]
        caps = {s["slot"]: float(s["cap_usd"]) for e in starts[:1] for s in e["systems"]}
        reserve = next((float(a["reserve_usd"]) for _, a in self.admissions), None)
        most = max((r["attempt"] for _, r in self.attempts if _is_int(r.get("attempt"))), default=1)
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
        self.systems = {r.system for r in plan.requests}
        self.study = str(plan.header["study"])
        self.stage = str(plan.header.get("stage") or os.path.basename(self.folder))
        logs = {name: self._log(name) for name in LOGS}
        self.heads = {name: v[1] for name, v in logs.items()}
        self.attempts = logs["attempts"][0]
        self.events = self._shaped("run", logs["run"][0], _event_problem)
        self.admissions = self._shaped("admission", logs["admission"][0], _admission_problem)
        self.start_times = [float(e["at"]) for _, e in self.events if e["event"] == "start"]
        self.end_times = [float(e["at"]) for _, e in self.events if e["event"] == "end"]
        self.rules = self._rules(plan.requests)
        self.check_attempts(logs["attempts"])
        self.check_run_log()
        self.check_finals(self._shaped("finals", logs["finals"][0], _final_problem))
        self.check_archives()
        self.check_lanes()
        self.check_spend()
        self.check_late_costs_owed()
        self.check_admissions()
        self.check_halts()
        self.check_required_halts()
        self.check_anchors(self._shaped("anchors", logs["anchors"][0], _anchor_problem))
        return self.problems

    # ---- attempts and the run log's attempt lines

    def check_attempts(self, log: tuple[list[tuple[int, dict[str, Any]]], list[str]]) -> None:
        records, shas = log
        # (run_id, rerun) -> [(line, record, sha)]
        self.runs: dict[tuple[str, int], list[tuple[int, dict[str, Any], str]]] = {}
        self.by_line: dict[int, tuple[dict[str, Any], str]] = {}
        for line, rec in records:
            sha = shas[line - 1]
            body = {k: v for k, v in rec.items() if k not in ("prev", "seed")}
            try:
                validate_run_attempt(body, line, reruns=10**6)
            except Refusal as exc:
                self.p("attempts.jsonl", line, "attempt_invalid", exc.message)
                continue
            except (TypeError, ValueError, KeyError) as exc:  # the validator tripping on a wrong type
                self.p("attempts.jsonl", line, "attempt_invalid", f"malformed record: {type(exc).__name__}: {exc}")
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

    def check_run_log(self) -> None:
        seen: dict[int, int] = {}
        self.attempt_events: list[tuple[int, dict[str, Any]]] = []
        for line, e in self.events:
            if e["event"] != "attempt":
                continue
            self.attempt_events.append((line, e))
            n = int(e["attempts_line"])
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

    def check_finals(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        self.finals: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        reruns = self.rules.reruns
        for line, rec in records:
            rid = rec.get("run_id")
            if rid not in self.requests:
                self.p("finals.jsonl", line, "final_link", f"run id {rid!r} not in the plan")
                continue
            mine = self.finals.setdefault(str(rid), [])
            req = self.requests[str(rid)]
            if [rec.get(k) for k in ("kind", "system", "item", "arm", "repeat")] != [
                    FINAL_KIND, req.system, req.item, req.arm, req.repeat]:
                self.p("finals.jsonl", line, "final_link", "kind, system, item, arm or repeat is not the plan's")
            rerun: int = rec["rerun"]
            if rerun != len(mine):
                self.p("finals.jsonl", line, "final_link", f"rerun {rerun!r}: expected {len(mine)}")
            if mine and mine[-1][1].get("action") == "stand":
                self.p("finals.jsonl", line, "final_link", "a final after the cell's standing final")
            got = self.by_line.get(rec["attempt_line"])
            run = self.runs.get((str(rid), rerun), [])
            if got is None or not run or run[-1][0] != rec.get("attempt_line") or got[1] != rec.get("attempt_sha256"):
                self.p("finals.jsonl", line, "final_link", "attempt_line/attempt_sha256 is not its run's last attempt")
            else:
                attempt = got[0]
                if not run_ended(attempt, self.rules.transport_retries):
                    self.p("finals.jsonl", line, "final_link", "the linked attempt did not end its run")
                cls = classify(attempt)
                want = action_for(cls, rerun, reruns)
                if rec.get("class") != cls or rec.get("action") != want:
                    self.p("finals.jsonl", line, "class_action",
                           f"{rec.get('class')}/{rec.get('action')} is not the recomputed {cls}/{want}")
                if rec.get("attempt") != attempt["attempt"] or rec.get("error_code") != attempt.get("error_code"):
                    self.p("finals.jsonl", line, "final_link", "attempt or error_code is not the record's")
                if cls != "delivered" and any(rec.get(k) is not None for k in ("passed", "receipt", "receipt_sha256")):
                    # the report scores `passed`: only a verified delivered answer may carry one
                    self.p("finals.jsonl", line, "final_link", f"a {cls} final carries a verdict or a receipt")
                if cls == "delivered":
                    name = receipt_name(str(rid), rerun)
                    data = _file_bytes(os.path.join(self.folder, name))
                    if rec.get("receipt") != name or data is None:
                        self.p("finals.jsonl", line, "final_link", f"the receipt {name} is missing")
                    elif sha256_hex(data) != rec.get("receipt_sha256"):
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
        data = _file_bytes(os.path.join(self.folder, want))
        if not isinstance(entry, dict) or entry.get("archive") != want or data is None:
            self.p("finals.jsonl", line, "archive", f"{want} is missing or not listed")
            return
        if data != canonical_bytes(old) + b"\n":
            self.p(want, None, "archive", "not a byte copy of the replaced final")
        if entry.get("sha256") != sha256_hex(data):
            self.p("finals.jsonl", line, "archive", f"{want}: sha256 is not the archive's")
        if entry.get("attempt_sha256") != old.get("attempt_sha256"):
            self.p("finals.jsonl", line, "archive", f"{want}: attempt_sha256 is not the replaced final's")

    def check_archives(self) -> None:
        adir = os.path.join(self.folder, "archive")
        finals = {archive_name(rid, int(rec["rerun"])): rec for rid, fs in self.finals.items() for _, rec in fs}
        try:
            names = sorted(os.listdir(adir)) if os.path.isdir(adir) else []
        except OSError as exc:
            self.p("archive", None, "archive", f"the archive folder cannot be listed: {exc.strerror}")
            names = []
        for name in names:
            rel = f"archive/{name}"
            rec = finals.get(rel)
            if rec is None or _file_bytes(os.path.join(adir, name)) != canonical_bytes(rec) + b"\n":
                self.p(rel, None, "archive", "an archive that is no final's byte copy")

    # ---- invocations, lanes

    def invocation_of(self, t: float) -> int:
        """The index of the invocation (start event) in force at time t (-1 before any)."""
        return bisect.bisect_right(self.start_times, t) - 1

    def invocation_ended(self, t: float) -> float | None:
        """The time of the `end` event of the invocation in force at time t, or None (it crashed or runs on)."""
        inv = self.invocation_of(t)
        return next((at for at in self.end_times if at >= t and self.invocation_of(at) == inv), None)

    def check_lanes(self) -> None:
        on_lane: dict[tuple[str, int], list[tuple[float, float, int, dict[str, Any]]]] = {}
        for line, e in self.attempt_events:
            logged = self.by_line.get(e["attempts_line"])
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
        for line, adm in self.admissions:
            if adm["decision"] == "admit":
                admits.setdefault((adm["system"], adm["lane"]), []).append((float(adm["at"]), line, adm["item"]))
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
        self.check_refused_lanes()

    def check_refused_lanes(self) -> None:
        """A lane that ended `refused` refused its last admission of the invocation (and then stopped)."""
        decisions: dict[tuple[str, int], list[tuple[float, str]]] = {}
        for _, adm in self.admissions:
            decisions.setdefault((adm["system"], adm["lane"]), []).append((float(adm["at"]), adm["decision"]))
        for line, e in self.events:
            if e["event"] != "lane" or e["what"] != "end" or e.get("cause") != "refused":
                continue
            at, inv = float(e["at"]), self.invocation_of(float(e["at"]))
            mine = [d for t, d in decisions.get((e["system"], e["lane"]), []) if t <= at and self.invocation_of(t) == inv]
            if not mine or mine[-1] != "refuse":
                self.p("run.jsonl", line, "lane_order", f"{e['system']} lane {e['lane']} ended `refused` at {at} "
                       "but its last admission in the invocation is no refusal")

    # ---- spend, ceiling, conservation

    def check_spend(self) -> None:
        reserve = self.rules.reserve if self.rules.reserve is not None else 0.0
        # (time, kind order, system, amount, where)
        spend: list[tuple[float, str, float]] = []
        abandoned = {(r["run_id"], r["rerun"], r["attempt"]): r for r, _ in self.by_line.values()
                     if r.get("error_code") in _ABANDONED}
        self.late_costs: dict[tuple[str, int, int], float] = {}  # (run_id, rerun, attempt) -> its first late cost
        for rec, _ in self.by_line.values():
            spend.append((float(rec["ended"]), self.requests[rec["run_id"]].system,
                          cost_for_spend(rec["cost_usd"], reserve)))
        for line, e in self.events:
            if e["event"] != "late_cost":
                continue
            key = (e["run_id"], e["rerun"], e["attempt"])
            owner = abandoned.get(key)
            if owner is None or key in self.late_costs:
                self.p("run.jsonl", line, "late_cost", f"late cost for {key}: no abandoned attempt, or a second one")
            elif e["system"] != self.requests[key[0]].system or float(e["at"]) < float(owner["ended"]):
                self.p("run.jsonl", line, "late_cost", f"late cost for {key}: not its attempt's system, or logged "
                       "before the attempt was abandoned")
            self.late_costs.setdefault(key, float(e["at"]))
            spend.append((float(e["at"]), e["system"], cost_for_spend(e["cost_usd"], reserve)))
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
        self.crossed_at = math.inf
        events = [(line, e) for line, e in self.events if e["event"] == "ceiling"]
        if crossing is None and events:
            # a crossing counted from spend before alone, or a logged total the files don't imply
            for line, e in events:
                self.p("run.jsonl", line, "conservation",
                       f"a ceiling event (total {e.get('total_usd')}) although spend never crosses {ceiling}")
        if crossing is not None:
            systems = self.systems
            if {e["system"] for _, e in events} != systems:
                self.p("run.jsonl", None, "ceiling", f"spend crossed the ceiling at {crossing[0]} "
                       f"but systems {sorted(systems - {e['system'] for _, e in events})} have no ceiling event")
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
        """A system's spend (None: every system's, plus spend before) up to t, as one exact sum."""
        end = (bisect.bisect_right if inclusive else bisect.bisect_left)(self.spend_times, t)
        before = [self.rules.spend_before or 0.0] if system is None else []
        return math.fsum([*before, *(a for _, s, a in self.spend[:end] if system is None or s == system)])

    def check_late_costs_owed(self) -> None:
        """Every abandoned attempt's late cost is logged before its invocation's `end`.

        The runner waits for an abandoned request at the end (at most a deadline) and
        then cancels it, logging its cost or "unknown" either way; only a crash (no `end`)
        leaves one owed.
        """
        for line, (rec, _) in self.by_line.items():
            if rec.get("error_code") not in _ABANDONED:
                continue
            key = (rec["run_id"], rec["rerun"], rec["attempt"])
            end = self.invocation_ended(float(rec["started"]))
            at = self.late_costs.get(key)
            if end is not None and (at is None or at > end):
                self.p("attempts.jsonl", line, "late_cost", f"{key} abandoned without its late cost, though its "
                       f"invocation ended at {end}" + ("" if at is None else f" (one logged at {at})"))

    # ---- admission

    def check_admissions(self) -> None:
        refused: set[str] = set()
        reserve = self.rules.reserve
        admits: dict[tuple[str, int], list[tuple[float, str]]] = {}
        ends: dict[tuple[str, int], list[float]] = {}
        for _, e in self.events:
            if e["event"] == "lane" and e["what"] == "end":
                ends.setdefault((e["system"], e["lane"]), []).append(float(e["at"]))
        for _, a in self.admissions:
            if a["decision"] == "admit":
                admits.setdefault((a["system"], a["lane"]), []).append((float(a["at"]), a["item"]))
        for line, a in self.admissions:
            c = a["ceiling"]
            inputs = AdmissionInputs(
                system=a["system"], item=a["item"], lane=a["lane"], finished_usd=float(a["finished_usd"]),
                reserve_usd=float(a["reserve_usd"]), under_way=a["under_way"], cap_usd=float(a["cap_usd"]),
                refused_before=a["refused_before"], total_usd=float(c["total_usd"]),
                ceiling_usd=float(c["ceiling_usd"]), crossed=c["crossed"])
            if (a["decision"], a["reason"]) != admission_decision(inputs):
                self.p("admission.jsonl", line, "admission_rule", f"{a['decision']}/{a['reason']} is not "
                       f"the rule's {'/'.join(admission_decision(inputs))} for its inputs")
            if not _close(float(a["projected_usd"]), inputs.projected_usd):
                self.p("admission.jsonl", line, "admission_rule", "projected_usd is not finished + reserve x under_way")
            t, system = float(a["at"]), inputs.system

            def bad(what: str, line: int = line) -> None:
                self.p("admission.jsonl", line, "admission_inputs", what)

            lo, hi = self.finished(system, t, inclusive=False), self.finished(system, t, inclusive=True)
            if not (_close(inputs.finished_usd, lo) or _close(inputs.finished_usd, hi)):
                bad(f"finished_usd {inputs.finished_usd} is not the system's spend before it ({lo})")
            tlo, thi = self.finished(None, t, inclusive=False), self.finished(None, t, inclusive=True)
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
        systems = self.systems
        halts: dict[str, list[tuple[float, float, str]]] = {s: [] for s in systems}
        starts = [*self.start_times, math.inf]
        paused: dict[str, float] = {}
        for _, e in self.events:
            ev, at = e["event"], float(e["at"])
            if ev == "pause":
                paused.setdefault(e["system"], at)
            elif ev == "resume_paused" and e["system"] in paused:
                halts.setdefault(e["system"], []).append((paused.pop(e["system"]), at, "a pause"))
            elif ev in ("stop", "signal"):
                until = starts[bisect.bisect_right(starts, at)]
                targets = systems if e.get("system") is None else {e["system"]}
                for s in targets:
                    halts.setdefault(s, []).append((at, until, "a stop" if ev == "stop" else "a signal"))
        for s, at in paused.items():
            halts.setdefault(s, []).append((at, math.inf, "a pause"))
        # a final asking for a pause or a stop halts its system from its own time, whatever the run log says
        for rid, fs in self.finals.items():
            system = self.requests[rid].system
            for _, f in fs:
                t = float(f["at"])
                if f["action"] == "pause":
                    halts[system].append((t, self.resumed_after(system, t), "a pause final"))
                elif f["action"] == "stop":
                    halts[system].append((t, starts[bisect.bisect_right(starts, t)], "a stop final"))
        if self.crossing is not None:
            for s in systems:
                halts[s].append((self.crossed_at, math.inf, "the ceiling's crossing"))
        for line, e in self.attempt_events:
            got = self.by_line.get(e["attempts_line"])
            if got is None:
                continue
            rec = got[0]
            system, t = self.requests[rec["run_id"]].system, float(rec["started"])
            for lo, hi, why in halts.get(system, []):
                if lo < t < hi:
                    self.p("run.jsonl", line, "halted", f"{rec['run_id']} started at {t} after {why} at {lo}")
        for line, a in self.admissions:
            if a["decision"] != "admit":
                continue
            t = float(a["at"])
            for lo, hi, why in halts.get(a["system"], []):
                if lo < t < hi:
                    self.p("admission.jsonl", line, "halted", f"item {a['item']} admitted at {t} after {why} at {lo}")
        self.check_skipped(halts)

    def resumed_after(self, system: str, t: float) -> float:
        """The time of the first `resume_paused` of `system` after t (inf: none)."""
        return min((float(e["at"]) for _, e in self.events
                    if e["event"] == "resume_paused" and e["system"] == system and float(e["at"]) > t), default=math.inf)

    def stopped(self, system: str, t: float, cause: str) -> bool:
        """Whether `system` is stopped at t as the runner stops it: by a stop logged earlier in t's
        invocation, or else by the next stop covering it, which must then have this cause."""
        inv = self.invocation_of(t)
        covering = [(float(e["at"]), e) for _, e in self.events if e["event"] == "stop"
                    and e["system"] in (None, system) and self.invocation_of(float(e["at"])) == inv]
        if any(at <= t for at, _ in covering):
            return True
        return bool(covering) and covering[0][1]["cause"] == cause

    def check_required_halts(self) -> None:
        """The pauses and stops the rules require are logged.

        A pause final owes a `pause` event for its system and run before the system's next
        `resume_paused` (a later invocation writes one a crash cut off); a stop final, an
        inconclusive final past the limit, the ceiling's crossing and a first signal owe a stop
        of their systems in their invocation, unless it crashed (no `end`).
        """
        last = len(self.start_times) - 1
        pauses = [(line, e) for line, e in self.events if e["event"] == "pause"]
        used: set[int] = set()
        inconclusive: dict[str, set[str]] = {}
        finals = sorted((line, rid, f) for rid, fs in self.finals.items() for line, f in fs)
        for line, rid, f in finals:
            system, t = self.requests[rid].system, float(f["at"])
            ended = self.invocation_ended(t) is not None
            if f["action"] == "pause" and (ended or self.invocation_of(t) < last):
                until = self.resumed_after(system, t)
                match = next((n for n, e in pauses if n not in used and e["system"] == system
                              and e["run_id"] == rid and t <= float(e["at"]) < until), None)
                if match is None:
                    self.p("finals.jsonl", line, "halted", f"{rid}: a pause final at {t} without its pause event")
                else:
                    used.add(match)
            if f["action"] == "stop" and ended:
                cause = "deadline" if f["error_code"] == "AttemptDeadline" else str(f["class"])
                if not self.stopped(system, t, cause):
                    self.p("finals.jsonl", line, "halted", f"{rid}: a stop final at {t} without a {cause} stop "
                           f"of {system}")
            if f["class"] == "inconclusive":
                items = inconclusive.setdefault(system, set())
                items.add(self.requests[rid].item)
                if len(items) > INCONCLUSIVE_ITEMS_LIMIT and ended and not self.stopped(system, t, "inconclusive"):
                    self.p("finals.jsonl", line, "halted", f"{system}: inconclusive failures in {len(items)} items "
                           f"(limit {INCONCLUSIVE_ITEMS_LIMIT}) at {t} without an inconclusive stop")
        for line, e in pauses:
            if line not in used:
                self.p("run.jsonl", line, "halted", f"a pause of {e['system']} that no pause final of "
                       f"{e['run_id']} asks for")
        required: list[tuple[int | None, float, str, str]] = []
        if self.crossing is not None:
            required.append((None, self.crossed_at, "ceiling", "the ceiling's crossing"))
        required += [(line, float(e["at"]), "interrupt", "a first signal") for line, e in self.events
                     if e["event"] == "signal" and e["count"] == 1]
        for where, t, cause, why in required:
            if self.invocation_ended(t) is None:
                continue
            for system in sorted(self.systems):
                if not self.stopped(system, t, cause):
                    self.p("run.jsonl", where, "halted", f"{why} at {t} without a {cause} stop of {system}")

    def check_skipped(self, halts: Mapping[str, list[tuple[float, float, str]]]) -> None:
        ends = [(float(e["at"]), e) for _, e in self.events if e["event"] == "end"]
        for rid, fs in self.finals.items():
            if not fs or fs[-1][1].get("action") != "rerun":
                continue
            line, final = fs[-1]
            if (rid, final["rerun"] + 1) in self.runs:
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
        failed = [(float(e["at"]), e["system"]) for _, e in self.events
                  if e["event"] == "stop" and e["cause"] in ("harness", "runner-error")]
        for (rid, rerun), run in self.runs.items():
            line, rec, _ = run[-1]
            if not run_ended(rec, self.rules.transport_retries) or any(
                    f.get("rerun") == rerun for _, f in self.finals.get(rid, [])):
                continue
            t = float(rec["ended"])
            inv = self.invocation_of(t)
            end = next((at for at, _ in ends if at >= t and self.invocation_of(at) == inv), None)
            system = self.requests[rid].system
            # a harness stop anywhere in the invocation excuses it: an attempt of another lane may end
            # after the stop, with the verifier already gone
            if end is None or any(self.invocation_of(at) == inv and at <= end and s in (None, system)
                                  for at, s in failed):
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

    def check_anchors(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        for line, a in records:
            for name, got in a["logs"].items():
                heads = self.heads.get(name)
                if heads is None:
                    self.p("anchors.jsonl", line, "anchor", f"an anchor for an unknown log {name!r}")
                    continue
                n, head = got["lines"], got["head"]
                if n == 0:
                    ok = head is None or head == _seed_hash(log_seed(self.study, self.stage, name))
                else:
                    ok = 0 < n <= len(heads) and heads[n - 1] == head
                if not ok:
                    self.p("anchors.jsonl", line, "anchor",
                           f"{name}: {n} lines with head {head} is not a prefix of the log ({len(heads)} lines)")
            for name, sha in a["manifests"].items():
                path = self.rules.manifests.get(name)
                if path is None:
                    continue
                data = _file_bytes(path)
                now = None if data is None else sha256_hex(data)
                if sha != now:
                    self.p("anchors.jsonl", line, "anchor", f"manifest {name}: sha256 {sha} is not the file's {now}")


def _seed_hash(seed: str) -> str:
    from harness.evidence.chain import seed_hash

    return seed_hash(seed)


def _repair(record: Mapping[str, Any]) -> bool:
    """A torn-tail repair line of a chained log (no record of the run's own)."""
    return record.get("event") == "log_repair" and "kind" not in record


def _file_bytes(path: str) -> bytes | None:
    """The bytes of a regular file (a link to one followed), or None: missing, not a file, unreadable."""
    if not os.path.isfile(path):
        return None
    try:
        return read_bytes(path)
    except (Refusal, OSError):
        return None


# --------------------------------------------------------------------------
# Record shapes: the fields (and their types) the rules read, checked before any rule reads them.
# A record that lacks one is a problem under its log's rule and takes no further part in the check.

_Field = tuple[str, Callable[[Any], bool]]  # (what the value must be, the test)
_Shape = Mapping[str, _Field]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_STR: _Field = ("a string", lambda v: isinstance(v, str))
_OPT_STR: _Field = ("a string or null", lambda v: v is None or isinstance(v, str))
_INT: _Field = ("an integer", _is_int)
_NUM: _Field = ("a finite number", _is_num)
_BOOL: _Field = ("true or false", lambda v: isinstance(v, bool))
_OPT_BOOL: _Field = ("true, false or null", lambda v: v is None or isinstance(v, bool))
_COST: _Field = ('a non-negative number or "unknown"', lambda v: v == "unknown" or (_is_num(v) and v >= 0))
_LIST: _Field = ("a list", lambda v: isinstance(v, list))


def _one_of(*values: str) -> _Field:
    return (f"one of {', '.join(values)}", lambda v: v in values)


def _kind(kind: str) -> _Field:
    return (repr(kind), lambda v: v == kind)


def _shape_error(rec: Any, shape: _Shape) -> str | None:
    if not isinstance(rec, dict):
        return "not an object"
    for key, (what, ok) in shape.items():
        if key not in rec:
            return f"no field {key!r}"
        if not ok(rec[key]):
            return f"{key} {rec[key]!r} is not {what}"
    return None


def _each(shape: _Shape, what: str) -> _Field:
    """A list of objects of `shape`."""
    return (what, lambda v: isinstance(v, list) and all(_shape_error(x, shape) is None for x in v))


def _object(shape: _Shape, what: str) -> _Field:
    return (what, lambda v: _shape_error(v, shape) is None)


def _values(shape: _Shape | _Field, what: str) -> _Field:
    """An object whose every value is of `shape` (an object shape, or one check)."""
    def ok(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        if isinstance(shape, tuple):
            return all(shape[1](x) for x in v.values())
        return all(_shape_error(x, shape) is None for x in v.values())

    return (what, ok)


_EVENT_FIELDS: Mapping[str, _Shape] = {
    "start": {"ceiling_usd": _NUM, "spend_before_usd": _NUM,
              "systems": _each({"slot": _STR, "cap_usd": _NUM}, "a list of {slot, cap_usd}")},
    "attempt": {"system": _STR, "lane": _INT, "run_id": _STR, "rerun": _INT, "attempt": _INT, "attempts_line": _INT,
                "attempt_sha256": _STR, "started": _NUM, "ended": _NUM, "cost_usd": _COST, "class": _STR},
    "lane": {"system": _STR, "lane": _INT, "what": _one_of("start", "end"), "cause": _OPT_STR},
    "stop": {"system": _OPT_STR, "cause": _one_of(*STOP_CAUSES)},
    "pause": {"system": _STR, "run_id": _STR},
    "resume_paused": {"system": _STR},
    "signal": {"signum": _INT, "count": _INT},
    "ceiling": {"system": _STR, "crossed_at": _NUM, "total_usd": _NUM, "ceiling_usd": _NUM},
    "late_cost": {"system": _STR, "run_id": _STR, "rerun": _INT, "attempt": _INT, "cost_usd": _COST},
    "end": {"complete": _BOOL},
    "anchor_push": {},
}
_EVENT_RULE: Mapping[str, str] = {
    "start": "halted", "attempt": "attempt_logged", "lane": "lane_order", "stop": "halted", "pause": "halted",
    "resume_paused": "halted", "signal": "halted", "ceiling": "ceiling", "late_cost": "late_cost",
    "end": "incomplete", "anchor_push": "anchor",
}
_ADMISSION: _Shape = {
    "kind": _kind(ADMISSION_KIND), "at": _NUM, "system": _STR, "item": _STR, "lane": _INT, "finished_usd": _NUM,
    "reserve_usd": _NUM, "under_way": _INT, "projected_usd": _NUM, "cap_usd": _NUM, "refused_before": _BOOL,
    "ceiling": _object({"total_usd": _NUM, "ceiling_usd": _NUM, "crossed": _BOOL}, "{total_usd, ceiling_usd, crossed}"),
    "decision": _one_of("admit", "refuse"), "reason": _STR,
}
_FINAL: _Shape = {
    "kind": _STR, "at": _NUM, "run_id": _STR, "system": _STR, "item": _STR, "arm": _STR, "repeat": _INT,
    "rerun": _INT, "class": _STR, "action": _STR, "error_code": _OPT_STR, "attempt": _INT, "attempt_line": _INT,
    "attempt_sha256": _STR, "passed": _OPT_BOOL, "receipt": _OPT_STR, "receipt_sha256": _OPT_STR, "replaced": _LIST,
}
_ANCHOR: _Shape = {
    "kind": _kind(ANCHOR_KIND), "at": _NUM,
    "logs": _values({"lines": _INT, "head": _OPT_STR}, "an object of {lines, head}"),
    "manifests": _values(_OPT_STR, "an object of sha256 strings or null"),
}


def _event_problem(e: Mapping[str, Any]) -> tuple[str, str] | None:
    """(rule, what is wrong) for a run event the rules cannot read, else None."""
    event = e.get("event")
    if e.get("kind") != RUN_EVENT_KIND or not isinstance(event, str) or event not in _EVENT_FIELDS:
        return "chain", f"kind {e.get('kind')!r}, event {event!r}: not a {RUN_EVENT_KIND} event"
    bad = _shape_error(e, {"at": _NUM, **_EVENT_FIELDS[event]})
    return None if bad is None else (_EVENT_RULE[event], f"{event} event: {bad}")


def _admission_problem(a: Mapping[str, Any]) -> tuple[str, str] | None:
    bad = _shape_error(a, _ADMISSION)
    return None if bad is None else ("admission_rule", bad)


def _final_problem(f: Mapping[str, Any]) -> tuple[str, str] | None:
    bad = _shape_error(f, _FINAL)
    return None if bad is None else ("final_link", bad)


def _anchor_problem(a: Mapping[str, Any]) -> tuple[str, str] | None:
    bad = _shape_error(a, _ANCHOR)
    return None if bad is None else ("anchor", bad)
