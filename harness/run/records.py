"""The records of a study run: every file of a results folder, its fields, and the pure rules.

A stage runs into `<results>/<study>/<stage>/` (`stage_folder`). Every
`*.jsonl` there except `plan.jsonl` is a chained log (DESIGN.md "Chained
logs": canonical lines, `prev`, `seed` on line 1). Each seed names the study,
the stage and the log (`log_seed`), so no log can stand in for another:

    plan.jsonl       NOT chained. The stage's cells from the frozen preregistration
                     (`harness.prereg.plan` scope `pilot`, or `matrix-once` for stage
                     `matrix`, `full` for `full`) filtered to the stage: a
                     `plan-header.v1` line (the plan's header with `requests` counting
                     the stage's cells and `stage` added), then its `plan-request.v1`
                     lines. Written once; every later invocation re-plans and refuses
                     (`run_plan_changed`) unless the bytes are identical. Read with
                     `harness.run.attempts.read_plan`.
    attempts.jsonl   seed `attempts_seed(study, stage)` ("proctor-attempts:<study>:<stage>").
                     One `model-attempt.v1` record per request sent or abandoned
                     (`harness.run.attempts`), plus one field:
                         rerun   integer 0..run.reruns: which run of the cell this attempt
                                 belongs to (0 = the first run). Attempt numbers are 1, 2, ...
                                 within (run_id, rerun); transport retries are attempts
                                 within one run (resume's rule: at most
                                 transport_retries + 1 attempts, only after a
                                 transport-class error).
                     `validate_run_attempt` checks it (the rerun field, then
                     `validate_attempt` on the rest).
    finals.jsonl     seed log "finals". One `run-final.v1` line when a run (cell x rerun)
                     ends; the cell's latest final decides what happens next:
                         run_id, system, item, arm, repeat, rerun
                         class          `classify`: delivered | provider | operator | harness |
                                        inconclusive | model | ceiling
                         action         `action_for`: stand | rerun | pause | stop
                         error_code     the last attempt's error code, or null
                         attempt        the last attempt's number (within the rerun)
                         attempt_line   its 1-based line in attempts.jsonl
                         attempt_sha256 sha256 of that line's bytes (no newline)
                         passed         the hidden tests' verdict (delivered only), else null
                         receipt        "receipts/<run_id>.r<rerun>.json" (delivered only), else null
                         receipt_sha256 sha256 of the receipt file's bytes, else null
                         replaced       [{rerun, archive, sha256, attempt_sha256}] for EVERY earlier
                                        final of this cell, oldest first: `archive` is the byte copy
                                        under archive/, `sha256` the sha256 of the archived bytes
                         at             the clock's time when the final was written
                     A cell stands when its latest final's action is `stand`.
    archive/         "<run_id>.r<rerun>.final.jsonl": the exact bytes of a replaced
                     final's line plus "\\n", written (atomically) before the rerun's first
                     attempt.
    receipts/        "<run_id>.r<rerun>.json": the canonical JSON of the warm verifier's
                     `proctor-item-receipt.v1` (`verify_receipt`) plus `run_id`, `rerun`,
                     `attempt_sha256` (the delivered attempt's line).
    run.jsonl        seed log "run". `run-event.v1` lines, each with `event` and `at`:
                         start        invocation, pid, dry_run, resume_paused, plan_sha256,
                                      ceiling_usd, spend_before_usd, systems [{slot, cap_usd, lanes}]
                         attempt      system, lane, run_id, rerun, attempt, attempts_line,
                                      attempt_sha256, started, ended, cost_usd, class (one line
                                      per attempt; `recovered: true` when written on resume for a
                                      record a crash left without its line)
                         lane         system, lane, what: start | end, cause (at end: done |
                                      stopped | paused | refused | interrupt)
                         stop         system (null: every system), cause (`STOP_CAUSES`), detail
                         pause        system, run_id, error_code (operator failure; `recovered:
                                      true` when written on resume for a pause final a crash left
                                      without it)
                         resume_paused system (written by --resume-paused after a pause)
                         signal       signum, count (1: stop admitting; 2: exit at once)
                         ceiling      system, crossed_at, total_usd, ceiling_usd (one per system)
                         late_cost    system, run_id, rerun, attempt, cost_usd, cost_status, wire_line:
                                      spend of an abandoned attempt that arrived after its record
                         end          exit_code, complete, stops
    admission.jsonl  seed log "admission". `admission.v1`: system, item, lane, finished_usd,
                     reserve_usd, under_way (items under way for the system, this one
                     included), projected_usd (= finished + reserve x under_way), cap_usd,
                     refused_before, ceiling {total_usd, ceiling_usd, crossed}, decision
                     (admit | refuse), reason (`admission_decision`), at.
    host.jsonl       seed log "host". `host-sample.v1`: at (run clock), wall (time.time()),
                     monotonic, reason (start | periodic | end), load [1, 5, 15] or null,
                     memory {total_bytes, available_bytes} or null, pressure {cpu, memory, io:
                     the kernel's PSI lines} or null, disk {path, total_bytes, free_bytes} or
                     null, errors [text]. Every 30 s; a sampler failing (no load, memory and
                     disk) for 5 minutes stops the run with cause `sampler`.
    anchors.jsonl    seed log "anchors". `anchor.v1`: at, reason (periodic | end), logs
                     {name: {lines, head}}, manifests {name: sha256} (plan.jsonl, the
                     preregistration's FROZEN.json, the pricing table). Every 15 minutes and
                     at the end of each invocation.
    wire.jsonl       `harness.meter.wire.WireLog` named "<study>:<stage>" (seed
                     "proctor-wire:<study>:<stage>"): every exchange as it came back.
    .invocation.lock one invocation at a time (`invocation_locked`).

Spend. A system's finished spend is the `math.fsum` of its attempts' costs and
its late costs, where an "unknown" cost counts as `reserve_per_item_usd` (the
registered amount a runner must hold for an item whose cost it cannot see):
conservative, never zero. The ceiling's total (`ceiling_total`) is ONE `math.fsum`
of `spend_before_usd` and every part of every system's finished spend: the
correctly rounded total, not a sum of the systems' rounded sums (that double
rounding can put the total one ulp past the ceiling where the exact one is not).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code, Refusal, RunRefusal
from harness.evidence.chain import read_log
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.money import sum_costs
from harness.run.attempts import PlanRequest, attempts_seed, validate_attempt
from harness.run.resume import ERROR_CLASSES, TRANSPORT_CODES

__all__ = [
    "ACTIONS",
    "ADMISSION_KIND",
    "ANCHOR_KIND",
    "CLASSES",
    "FINAL_KIND",
    "HOST_KIND",
    "LOGS",
    "RUN_EVENTS",
    "RUN_EVENT_KIND",
    "STOP_CAUSES",
    "AdmissionInputs",
    "CellState",
    "Ledger",
    "RunProgress",
    "RunSummary",
    "SystemProgress",
    "action_for",
    "admission_decision",
    "archive_name",
    "ceiling_total",
    "classify",
    "cost_for_spend",
    "load_ledger",
    "log_seed",
    "receipt_name",
    "stage_folder",
    "validate_run_attempt",
]

RUN_EVENT_KIND: Final = "run-event.v1"
FINAL_KIND: Final = "run-final.v1"
ADMISSION_KIND: Final = "admission.v1"
HOST_KIND: Final = "host-sample.v1"
ANCHOR_KIND: Final = "anchor.v1"
CLASSES: Final = ("delivered", "provider", "operator", "harness", "inconclusive", "model", "ceiling")
ACTIONS: Final = ("stand", "rerun", "pause", "stop")
STOP_CAUSES: Final = ("harness", "inconclusive", "deadline", "ceiling", "interrupt", "runner-error", "sampler")
RUN_EVENTS: Final = (
    "start", "attempt", "lane", "stop", "pause", "resume_paused", "signal", "ceiling", "late_cost", "end",
    "anchor_push",
)
LOGS: Final = ("attempts", "finals", "run", "admission", "host", "anchors", "wire")
"""The chained logs of a stage folder (`<name>.jsonl`)."""
INCONCLUSIVE_ITEMS_LIMIT: Final = 5
"""A system stops when inconclusive failures have ended runs in more than this many items."""

PathArg = str | os.PathLike[str]


def stage_folder(results_dir: PathArg, study: str, stage: str) -> str:
    """`<results_dir>/<study>/<stage>` (absolute)."""
    return os.path.join(os.path.abspath(os.fspath(results_dir)), study, stage)


def log_seed(study: str, stage: str, log: str) -> str:
    """The seed of a stage's chained log: it names the study, the stage and the log."""
    if log == "attempts":
        return attempts_seed(study, stage)
    if log == "wire":
        return f"proctor-wire:{study}:{stage}"
    if log not in LOGS:
        raise ValueError(f"unknown log {log!r}")
    return f"proctor-run-{log}:{study}:{stage}"


def receipt_name(run_id: str, rerun: int) -> str:
    """The receipt's path relative to the stage folder."""
    return f"receipts/{run_id}.r{rerun}.json"


def archive_name(run_id: str, rerun: int) -> str:
    """The archived final's path relative to the stage folder."""
    return f"archive/{run_id}.r{rerun}.final.jsonl"


# --------------------------------------------------------------------------
# Classes and actions


def classify(attempt: Mapping[str, Any]) -> str:
    """The class of the attempt that ended a run: `delivered`, or its error code's class."""
    if attempt.get("outcome") == "delivered":
        return "delivered"
    return ERROR_CLASSES[str(attempt["error_code"])]


def action_for(cls: str, rerun: int, reruns: int) -> str:
    """What a run's end asks for.

    delivered, model: stand (a result). provider, inconclusive: rerun at once while
    `rerun < reruns`, else stand (labelled by its class). operator: pause the
    system's lanes (after `--resume-paused` the cell gets its next rerun).
    harness, ceiling: stop the system's lanes (a later invocation reruns the cell
    while reruns remain).
    """
    if cls in ("delivered", "model"):
        return "stand"
    if cls in ("provider", "inconclusive"):
        return "rerun" if rerun < reruns else "stand"
    if cls == "operator":
        return "pause" if rerun < reruns else "stand"
    if cls in ("harness", "ceiling"):
        return "stop" if rerun < reruns else "stand"
    raise ValueError(f"unknown class {cls!r}")


def run_ended(attempt: Mapping[str, Any], transport_retries: int) -> bool:
    """Whether `attempt` ends its run: delivered, a non-transport error, or the last transport retry."""
    if attempt.get("outcome") == "delivered":
        return True
    return attempt["error_code"] not in TRANSPORT_CODES or int(attempt["attempt"]) >= transport_retries + 1


# --------------------------------------------------------------------------
# Admission


@dataclass(frozen=True)
class AdmissionInputs:
    """What one admission decision is made from (all logged with it)."""

    system: str
    item: str
    lane: int
    finished_usd: float
    reserve_usd: float
    under_way: int
    cap_usd: float
    refused_before: bool
    total_usd: float
    ceiling_usd: float
    crossed: bool

    @property
    def projected_usd(self) -> float:
        return self.finished_usd + self.reserve_usd * self.under_way


def admission_decision(inputs: AdmissionInputs) -> tuple[str, str]:
    """(decision, reason): refuse after a refusal, after the ceiling's crossing, or past the cap."""
    if inputs.refused_before:
        return "refuse", "refused_before"
    if inputs.crossed:
        return "refuse", "ceiling_crossed"
    if inputs.projected_usd > inputs.cap_usd:
        return "refuse", "over_cap"
    return "admit", "within_cap"


def admission_record(inputs: AdmissionInputs, at: float) -> dict[str, Any]:
    """The `admission.v1` line for `inputs` (decision included)."""
    decision, reason = admission_decision(inputs)
    return {
        "kind": ADMISSION_KIND, "at": at, "system": inputs.system, "item": inputs.item, "lane": inputs.lane,
        "finished_usd": inputs.finished_usd, "reserve_usd": inputs.reserve_usd, "under_way": inputs.under_way,
        "projected_usd": inputs.projected_usd, "cap_usd": inputs.cap_usd, "refused_before": inputs.refused_before,
        "ceiling": {"total_usd": inputs.total_usd, "ceiling_usd": inputs.ceiling_usd, "crossed": inputs.crossed},
        "decision": decision, "reason": reason,
    }


def cost_for_spend(cost_usd: Any, reserve_usd: float) -> float:
    """What a recorded cost adds to spend: the number, or the reserve when it is "unknown"."""
    return reserve_usd if cost_usd == "unknown" else float(cost_usd)


def ceiling_total(spend_before_usd: float, parts: Mapping[str, Sequence[float]]) -> float:
    """The ceiling's total: one exact (`math.fsum`) sum of spend before and every system's spend parts.

    Summing the systems' own rounded sums instead would round twice, and the ceiling's
    crossing would then depend on how the spend is split between systems. An overflow is
    refused (`cost_overflow`).
    """
    return sum_costs([spend_before_usd, *(p for system_parts in parts.values() for p in system_parts)])


# --------------------------------------------------------------------------
# Attempt records with their rerun


def validate_run_attempt(record: Any, line: int | None, *, reruns: int, path: str | None = None) -> None:
    """A `model-attempt.v1` record of a run: `rerun` in 0..reruns, the rest as `validate_attempt`."""
    if isinstance(record, Mapping) and "rerun" in record:
        rerun = record["rerun"]
        if isinstance(rerun, bool) or not isinstance(rerun, int) or not 0 <= rerun <= reruns:
            where = "" if line is None else f"line {line}: "
            raise RunRefusal(Code.ATTEMPT_INVALID, f"{where}rerun must be an integer 0..{reruns}", path,
                          **({} if line is None else {"line": line}))
        record = {k: v for k, v in record.items() if k != "rerun"}
    else:
        where = "" if line is None else f"line {line}: "
        raise RunRefusal(Code.ATTEMPT_INVALID, f"{where}missing rerun", path, **({} if line is None else {"line": line}))
    validate_attempt(record, line, path=path)


# --------------------------------------------------------------------------
# What the library returns


@dataclass(frozen=True)
class SystemProgress:
    """One system's counts: items admitted (this invocation), attempts and spend (all invocations)."""

    system: str
    items_admitted: int
    items_refused: int
    attempts: int
    standing: int
    cells: int
    spend_usd: float
    cap_usd: float
    state: str  # running | paused | stopped | refused | done

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RunProgress:
    """What a progress callback receives after every admission, attempt and stop."""

    study: str
    stage: str
    total_usd: float
    ceiling_usd: float
    crossed: bool
    systems: tuple[SystemProgress, ...]

    def to_json(self) -> dict[str, Any]:
        return {"study": self.study, "stage": self.stage, "total_usd": self.total_usd,
                "ceiling_usd": self.ceiling_usd, "crossed": self.crossed,
                "systems": [s.to_json() for s in self.systems]}


@dataclass(frozen=True)
class RunSummary:
    """What `run_stage` returns.

    Attributes:
        exit_code: 0 when every selected system has a standing final for every cell
            of the stage; 1 otherwise (stopped, paused, refused, interrupted, or a
            preflight problem). Refusals are raised, not returned.
        mode: run | dry_run | preflight.
        folder: the stage folder.
        complete: every cell stands.
        stops: [{system, cause, detail}] of this invocation.
        cells: per cell (dry run and run): run_id, system, item, arm, repeat, state
            (standing | owed | paused | stopped), final class/action, next {rerun, attempt}.
        problems: preflight problems [{check, message, ...}] (preflight only).
    """

    ok: bool
    exit_code: int
    mode: str
    study: str
    stage: str
    folder: str
    complete: bool
    progress: RunProgress
    stops: tuple[dict[str, Any], ...] = ()
    cells: tuple[dict[str, Any], ...] = ()
    problems: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "exit_code": self.exit_code, "mode": self.mode, "study": self.study,
                "stage": self.stage, "folder": self.folder, "complete": self.complete,
                "progress": self.progress.to_json(), "stops": list(self.stops), "cells": list(self.cells),
                "problems": list(self.problems), **self.extra}


# --------------------------------------------------------------------------
# The ledger: where a stage stands, from its files alone


@dataclass
class CellState:
    """One cell (run id) as the files say.

    `finals` are (line, record, line bytes) oldest first; `attempts` maps a rerun
    to its (attempts line, record, line sha256) in order.
    """

    request: PlanRequest
    finals: list[tuple[int, dict[str, Any], bytes]] = field(default_factory=list)
    attempts: dict[int, list[tuple[int, dict[str, Any], str]]] = field(default_factory=dict)

    @property
    def last_final(self) -> dict[str, Any] | None:
        return self.finals[-1][1] if self.finals else None

    @property
    def standing(self) -> bool:
        last = self.last_final
        return last is not None and last["action"] == "stand"

    @property
    def rerun(self) -> int:
        """The run owed next (or under way): one after the last final's."""
        return 0 if not self.finals else int(self.finals[-1][1]["rerun"]) + 1

    def current(self) -> list[tuple[int, dict[str, Any], str]]:
        return self.attempts.get(self.rerun, [])

    def unfinalised(self, transport_retries: int) -> bool:
        """The current run's last attempt ended it but no final was written (a crash in between)."""
        cur = self.current()
        return bool(cur) and not self.standing and run_ended(cur[-1][1], transport_retries)

    def next_attempt(self) -> int:
        return len(self.current()) + 1


@dataclass
class Ledger:
    """A stage folder read whole and cross-checked."""

    cells: dict[str, CellState]
    attempt_lines: int
    attempts_head: str | None
    finals_lines: int
    run_events: list[dict[str, Any]]
    admissions: list[dict[str, Any]]
    logged_attempt_lines: set[int]
    spend: dict[str, float]
    spend_parts: dict[str, list[float]]
    late_costs: int
    last_time: float

    def paused(self, system: str) -> bool:
        state = False
        for e in self.run_events:
            if e.get("system") == system and e["event"] == "pause":
                state = True
            elif e.get("system") == system and e["event"] == "resume_paused":
                state = False
        return state

    def refused_before(self, system: str) -> bool:
        return any(a["system"] == system and a["decision"] == "refuse" for a in self.admissions)

    def inconclusive_items(self, system: str) -> int:
        return len({c.request.item for c in self.cells.values() if c.request.system == system
                    and any(f["class"] == "inconclusive" for _, f, _ in c.finals)})


def _bad(code: Code, message: str, path: str, line: int | None = None) -> Refusal:
    where = "" if line is None else f"line {line}: "
    return Refusal(code, where + message, path, **({} if line is None else {"line": line}))


def _read(folder: str, name: str, study: str, stage: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, f"{name}.jsonl")
    if not os.path.lexists(path):
        return []
    return read_log(path, log_seed(study, stage, name))


def load_ledger(
    folder: str, study: str, stage: str, requests: Sequence[PlanRequest], *,
    reruns: int, transport_retries: int, reserve_usd: float,
) -> Ledger:
    """Read every log of a stage folder, check each link, and say where every cell stands.

    Refusals: the chain reader's (`log_broken`, `log_torn_tail`, seed mismatch), the
    attempt validators' (`attempt_invalid`, ...), `attempt_unknown_run_id`,
    `attempt_request_changed`, `attempt_numbering_invalid` (a gap or repeat in attempt
    or rerun numbers), `attempt_after_final` (an attempt after its run ended),
    `run_final_invalid` (a final whose link, class, action, receipt or archive
    disagrees with the files), `run_log_invalid` (an unknown event).
    """
    cells = {r.run_id: CellState(r) for r in requests}
    apath = os.path.join(folder, "attempts.jsonl")
    attempts = _read(folder, "attempts", study, stage)
    head: str | None = None
    for line, rec in enumerate(attempts, start=1):
        raw = canonical_bytes(rec)
        head = sha256_hex(raw)
        if rec.get("event") == "log_repair" and "kind" not in rec:
            continue
        body = {k: v for k, v in rec.items() if k not in ("prev", "seed")}
        validate_run_attempt(body, line, reruns=reruns, path=apath)
        cell = cells.get(body["run_id"])
        if cell is None:
            raise _bad(Code.ATTEMPT_UNKNOWN_RUN_ID, f"run id {body['run_id']!r} is not in this stage's plan", apath, line)
        if body["request_sha256"] != cell.request.request_sha256:
            raise _bad(Code.ATTEMPT_REQUEST_CHANGED, "request_sha256 is not the plan's", apath, line)
        rerun = body["rerun"]
        if rerun > 0 and rerun - 1 not in cell.attempts:
            raise _bad(Code.ATTEMPT_NUMBERING_INVALID, f"rerun {rerun} follows no rerun {rerun - 1}", apath, line)
        if any(r > rerun for r in cell.attempts):
            raise _bad(Code.ATTEMPT_NUMBERING_INVALID, f"rerun {rerun} after a later rerun", apath, line)
        run = cell.attempts.setdefault(rerun, [])
        if body["attempt"] != len(run) + 1:
            raise _bad(Code.ATTEMPT_NUMBERING_INVALID, f"attempt {body['attempt']}: expected {len(run) + 1}", apath, line)
        if run and run_ended(run[-1][1], transport_retries):
            raise _bad(Code.ATTEMPT_AFTER_FINAL, "an attempt after its run ended", apath, line)
        run.append((line, body, head))
    by_line = {line: (rid, rec, sha) for rid, c in cells.items() for runs in c.attempts.values()
               for line, rec, sha in runs}

    fpath = os.path.join(folder, "finals.jsonl")
    finals = _read(folder, "finals", study, stage)
    for line, rec in enumerate(finals, start=1):
        _check_final(folder, fpath, line, rec, cells, by_line, reruns, transport_retries)
    for c in cells.values():  # a rerun's attempts need the earlier run's final, and not a standing one
        for rerun in c.attempts:
            if rerun > 0 and (len(c.finals) < rerun or c.finals[rerun - 1][1]["action"] == "stand"):
                raise _bad(Code.ATTEMPT_NUMBERING_INVALID,
                           f"run {c.request.run_id}: rerun {rerun} has no final for rerun {rerun - 1} that asks for it",
                           apath)

    events = _read(folder, "run", study, stage)
    rpath = os.path.join(folder, "run.jsonl")
    logged: set[int] = set()
    spend = {r.system: 0.0 for r in requests}
    late: list[tuple[str, float]] = []
    last = 0.0
    for line, e in enumerate(events, start=1):
        if e.get("event") == "log_repair" and "kind" not in e:
            continue
        if e.get("kind") != RUN_EVENT_KIND or e.get("event") not in RUN_EVENTS:
            raise _bad(Code.RUN_LOG_INVALID, f"unknown event {e.get('event')!r}", rpath, line)
        last = max(last, float(e.get("at", 0.0)))
        if e["event"] == "attempt":
            got = by_line.get(int(e["attempts_line"]))
            if got is None or got[2] != e["attempt_sha256"]:
                raise _bad(Code.RUN_LOG_INVALID, "an attempt line that disagrees with attempts.jsonl", rpath, line)
            logged.add(int(e["attempts_line"]))
        elif e["event"] == "late_cost":
            late.append((str(e["system"]), cost_for_spend(e["cost_usd"], reserve_usd)))
    for rid, rec, _ in by_line.values():
        spend[cells[rid].request.system] += 0.0  # keep every system present
        last = max(last, float(rec["ended"]))
    parts: dict[str, list[float]] = {}
    for system in spend:
        parts[system] = [cost_for_spend(rec["cost_usd"], reserve_usd) for rid, rec, _ in by_line.values()
                         if cells[rid].request.system == system]
        parts[system] += [c for s, c in late if s == system]
        spend[system] = math.fsum(parts[system])
    admissions = _read(folder, "admission", study, stage)
    for a in admissions:
        last = max(last, float(a.get("at", 0.0)))
    return Ledger(cells, len(attempts), head, len(finals), events, admissions, logged, spend, parts, len(late), last)


def _check_final(
    folder: str, path: str, line: int, rec: dict[str, Any], cells: dict[str, CellState],
    by_line: dict[int, tuple[str, dict[str, Any], str]], reruns: int, transport_retries: int,
) -> None:
    def bad(message: str) -> Refusal:
        return _bad(Code.RUN_FINAL_INVALID, message, path, line)

    if rec.get("kind") != FINAL_KIND:
        raise bad(f"kind must be {FINAL_KIND}")
    cell = cells.get(rec.get("run_id", ""))
    if cell is None:
        raise bad(f"run id {rec.get('run_id')!r} is not in this stage's plan")
    if rec.get("rerun") != len(cell.finals):
        raise bad(f"rerun {rec.get('rerun')!r}: expected {len(cell.finals)} (a gap or repeat)")
    if cell.standing:
        raise bad("a final after the cell's standing final")
    got = by_line.get(rec.get("attempt_line", -1))
    if got is None or got[0] != cell.request.run_id or got[1]["rerun"] != rec["rerun"]:
        raise bad("attempt_line does not point at an attempt of this run")
    _, attempt, sha = got
    if sha != rec["attempt_sha256"] or attempt["attempt"] != rec["attempt"]:
        raise bad("attempt_sha256 or attempt disagrees with attempts.jsonl")
    if attempt is not cell.attempts[rec["rerun"]][-1][1] or not run_ended(attempt, transport_retries):
        raise bad("the linked attempt is not the one that ended its run")
    cls = classify(attempt)
    if rec["class"] != cls or rec["action"] != action_for(cls, rec["rerun"], reruns):
        raise bad(f"class/action {rec['class']}/{rec['action']} are not the recomputed "
                  f"{cls}/{action_for(cls, rec['rerun'], reruns)}")
    if cls == "delivered":
        receipt = os.path.join(folder, str(rec.get("receipt")))
        if rec.get("receipt") != receipt_name(cell.request.run_id, rec["rerun"]) or not os.path.exists(receipt):
            raise bad("the receipt is missing")
        if sha256_hex(read_bytes(receipt)) != rec["receipt_sha256"]:
            raise bad("receipt_sha256 is not the receipt file's")
    replaced = rec.get("replaced")
    if not isinstance(replaced, list) or len(replaced) != len(cell.finals):
        raise bad("replaced must list every earlier final of the cell")
    for entry, (_, old, old_bytes) in zip(replaced, cell.finals, strict=True):
        want = archive_name(cell.request.run_id, old["rerun"])
        apath = os.path.join(folder, want)
        if entry.get("archive") != want or not os.path.exists(apath):
            raise bad(f"the archive {want} is missing")
        data = read_bytes(apath)
        if data != old_bytes + b"\n" or entry.get("sha256") != sha256_hex(data):
            raise bad(f"the archive {want} is not a byte copy of the replaced final")
    cell.finals.append((line, rec, canonical_bytes(rec)))
