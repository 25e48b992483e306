"""The report: a stage folder checked whole, then its standing finals as one polars frame.

The manual: docs/audit.md.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from harness.audit.frame import ATTEMPT_COLUMNS, TOKEN_COLUMNS, validate_attempts
from harness.audit.oracle import Problem, run_problems
from harness.errors import AuditRefusal, Code, Refusal
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.prereg.amended import check_stage_plan
from harness.prereg.folder import locked
from harness.prereg.frozen import FrozenPrereg, check_frozen
from harness.prereg.go import read_gos
from harness.records.plan import Plan
from harness.records.usage import CATEGORIES
from harness.run.attempts import read_plan
from harness.run.layout import log_seed, receipt_name
from harness.run.rules import exhausted

__all__ = ["EXHAUSTED_SCHEMA", "Report", "build_report", "check_stage"]

PathArg = str | os.PathLike[str]
EXHAUSTED_SCHEMA: dict[str, Any] = {"stage": pl.String, "system": pl.String, "arm": pl.String, "item": pl.String,
                                    "repeat": pl.Int64, "run_id": pl.String}


@dataclass(frozen=True)
class Report:
    """The scored attempts (`frame`), the validation summary (JSON-safe) and the exhausted cells
    (`exhausted`: stage, system, arm, item, repeat, run_id; standing on a transport failure, never scored)."""

    frame: pl.DataFrame
    summary: dict[str, Any]
    exhausted: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=EXHAUSTED_SCHEMA))


def _problem(file: str, line: int | None, rule: str, message: str) -> Problem:
    return Problem(file, line, rule, message)


def _fresh_plan_bytes(frozen: FrozenPrereg, stage: str) -> bytes:
    from harness.run.setup import stage_plan_bytes

    return stage_plan_bytes(frozen.path, frozen.design, stage)


def _records(folder: str, study: str, stage: str, name: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, f"{name}.jsonl")
    if not os.path.lexists(path):
        return []
    out = []
    for rec in read_log(path, log_seed(study, stage, name)):
        if rec.get("event") == "log_repair" and "kind" not in rec:
            continue
        out.append({k: v for k, v in rec.items() if k not in ("prev", "seed")})
    return out


def _standing(finals: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    last: dict[str, dict[str, Any]] = {}
    for f in finals:
        last[str(f.get("run_id"))] = f  # a final without a run id is the oracle's (final_link)
    return {rid: f for rid, f in last.items() if f.get("action") == "stand"}


def _check_receipts(folder: str, standing: dict[str, dict[str, Any]]) -> list[Problem]:
    problems = []
    for rid, f in standing.items():
        if f.get("class") != "delivered" or not isinstance(f.get("rerun"), int):
            continue
        if f.get("receipt") != receipt_name(rid, f["rerun"]):
            continue  # the oracle names a receipt that is not the run's (never read another path)
        path = os.path.join(folder, f["receipt"])
        if not os.path.exists(path):
            continue  # the oracle names a missing receipt
        data = read_bytes(path)
        if sha256_hex(data) != f.get("receipt_sha256"):
            continue  # the oracle names a receipt that does not hash as its final says
        try:
            receipt = json.loads(data)
        except ValueError as exc:
            problems.append(_problem(path, None, "receipt", f"not JSON: {exc}"))
            continue
        want = {"run_id": rid, "rerun": f.get("rerun"), "attempt_sha256": f.get("attempt_sha256"),
                "passed": f.get("passed")}
        for key, value in want.items():
            if not isinstance(receipt, dict) or receipt.get(key) != value:
                got = receipt.get(key) if isinstance(receipt, dict) else None
                problems.append(_problem(path, None, "receipt", f"{key} {got!r} is not the final's {value!r}"))
    return problems


def _check(folder: str, prereg: str) -> tuple[list[Problem], FrozenPrereg | None, Plan | None]:
    problems: list[Problem] = []
    frozen: FrozenPrereg | None
    try:
        frozen = check_frozen(prereg)
    except Refusal as exc:
        frozen = None
        problems.append(_problem(exc.path or prereg, exc.details.get("line"), exc.code, exc.message))
    plan_path = os.path.join(folder, "plan.jsonl")
    plan: Plan | None
    try:
        plan = read_plan(plan_path)
    except Refusal as exc:
        plan = None  # the oracle names an unreadable plan
        if not os.path.exists(plan_path):
            problems.append(_problem(plan_path, None, "plan_changed", f"{exc.code}: {exc.message}"))
    if frozen is not None and plan is not None:
        stage = str(plan.header.get("stage") or os.path.basename(folder))
        try:
            fresh = _fresh_plan_bytes(frozen, stage)
        except Refusal as exc:
            problems.append(_problem(plan_path, None, "plan_changed",
                                     f"the frozen preregistration does not plan stage {stage!r}: {exc.message}"))
        else:
            verdict = check_stage_plan(read_bytes(plan_path), fresh, frozen, stage)
            if verdict.code == Code.AMENDMENT_CHANGES_STAGE:
                problems.append(_problem(plan_path, None, verdict.code, verdict.message))
            elif not verdict.ok:
                problems.append(_problem(plan_path, None, "plan_changed",
                                         f"plan.jsonl (sha256 {plan.sha256}) is not the frozen preregistration's "
                                         f"plan of stage {stage!r} (sha256 {sha256_hex(fresh)}): {verdict.message}"))
    # the oracle: with the registered rules when the freeze holds, else from the run's own files
    try:
        problems.extend(run_problems(folder, prereg_dir=prereg if frozen is not None else None))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # an intact chain whose records lack a field or have a wrong type (an edited last line): a problem,
        # never a traceback
        problems.append(_problem(folder, None, "malformed", f"the oracle cannot read the stage's records: "
                                 f"{type(exc).__name__}: {exc}"))
    if plan is not None and os.path.exists(plan_path):
        try:
            stage = str(plan.header.get("stage") or os.path.basename(folder))
            finals = _records(folder, plan.study, stage, "finals")
        except Refusal:
            finals = []  # the oracle names the broken chain
        problems.extend(_check_receipts(folder, _standing(finals)))
    return problems, frozen, plan


def check_stage(stage_folder: PathArg, prereg_dir: PathArg) -> list[Problem]:
    """Every problem `build_report` refuses a stage folder for (freeze, plan, oracle, receipts); [] when it validates.

    `proctor audit` runs exactly this check on every stage folder it audits.
    """
    problems, _, _ = _check(os.path.abspath(os.fspath(stage_folder)), os.path.abspath(os.fspath(prereg_dir)))
    return problems


def _sum_or_none(values: list[Any]) -> float | None:
    if any(v == "unknown" or v is None for v in values):
        return None
    return math.fsum(float(v) for v in values)


def _frame(folder: str, plan: Plan) -> tuple[pl.DataFrame, dict[str, int], list[dict[str, Any]]]:
    """The scored frame, the count of scored cells without an answer by class, and the exhausted
    cells by system (standing on a transport failure: infrastructure, never scored)."""
    stage = str(plan.header.get("stage") or os.path.basename(folder))
    attempts = _records(folder, plan.study, stage, "attempts")
    finals = _records(folder, plan.study, stage, "finals")
    by_run: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        by_run.setdefault(str(a["run_id"]), []).append(a)
    lines = {i: a for i, a in enumerate(attempts, start=1)}
    rows: list[dict[str, Any]] = []
    unanswered: dict[str, int] = {}
    dropped: list[dict[str, Any]] = []
    standing = _standing(finals)
    for req in plan.requests:
        f = standing.get(req.run_id)
        if f is None:
            continue
        if exhausted(f.get("class"), f.get("action")):
            dropped.append({"stage": stage, "system": req.system, "arm": req.arm, "item": req.item,
                            "repeat": req.repeat, "run_id": req.run_id})
            continue
        mine = by_run.get(req.run_id, [])
        last = lines[int(f["attempt_line"])]
        if f.get("passed") is None:
            unanswered[str(f["class"])] = unanswered.get(str(f["class"]), 0) + 1
        tokens: dict[str, int | None] = {}
        for cat, col in zip(CATEGORIES, TOKEN_COLUMNS, strict=True):
            vals: list[int | None] = [None if a.get("tokens") is None else int(a["tokens"][cat]) for a in mine]
            known = [v for v in vals if v is not None]
            tokens[col] = sum(known) if len(known) == len(vals) else None
        rows.append({
            "study": req.study, "stage": stage, "system": req.system, "arm": req.arm, "item": req.item,
            "repeat": req.repeat, "run_id": req.run_id, "passed": bool(f.get("passed")),
            "cost_usd": _sum_or_none([a["cost_usd"] for a in mine]), "latency_s": float(last["latency_s"]),
            **tokens, "lane": str(req.lane),
        })
    schema: dict[str, Any] = {
        "study": pl.String, "stage": pl.String, "system": pl.String, "arm": pl.String, "item": pl.String,
        "repeat": pl.Int64, "run_id": pl.String, "passed": pl.Boolean, "cost_usd": pl.Float64,
        "latency_s": pl.Float64, **{c: pl.Int64 for c in TOKEN_COLUMNS}, "lane": pl.String,
    }
    assert list(schema) == list(ATTEMPT_COLUMNS)
    frame = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    validate_attempts(frame)
    return frame, unanswered, dropped


def _by_system(plan: Plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for req in plan.requests:  # plan order: the design's systems
        counts[req.system] = counts.get(req.system, 0) + 1
    return counts


def build_report(stage_folder: PathArg, *, prereg_dir: PathArg) -> Report:
    """Check a stage folder against its frozen preregistration, then score its standing finals.

    Raises:
        Refusal: `report_refused`, naming every problem (file, line, rule, message) in
            `details["problems"]`; nothing is scored when there is any.
    """
    folder = os.path.abspath(os.fspath(stage_folder))
    prereg = os.path.abspath(os.fspath(prereg_dir))
    problems, frozen, plan = _check(folder, prereg)
    if problems or frozen is None or plan is None:
        rules = sorted({p.rule for p in problems})
        raise AuditRefusal(
            Code.REPORT_REFUSED,
            f"{len(problems)} problems ({', '.join(rules)}); nothing is scored:\n"
            + "\n".join(f"  {p}" for p in problems),
            folder,
            problems=[{"file": p.file, "line": p.line, "rule": p.rule, "message": p.message} for p in problems],
        )
    frame, unanswered, dropped = _frame(folder, plan)
    n_exhausted = len(dropped)
    by_system: dict[str, list[str]] = {}
    for d in dropped:
        by_system.setdefault(d["system"], []).append(d["run_id"])
    summary: dict[str, Any] = {
        "ok": True,
        "folder": folder,
        "study": plan.study,
        "stage": str(plan.header.get("stage") or os.path.basename(folder)),
        "cells": len(plan.requests),
        "cells_by_system": _by_system(plan),
        "standing": frame.height,
        "not_standing": len(plan.requests) - frame.height - n_exhausted,
        "exhausted": n_exhausted,
        "exhausted_cells": {system: by_system[system] for system in sorted(by_system)},
        "passed": int(frame.get_column("passed").sum()),
        "standing_without_answer": unanswered,
        "cost_unknown": frame.get_column("cost_usd").null_count(),
        "plan_sha256": plan.sha256,
        "frozen_sha256": frozen.frozen_sha256,
        "prereg": frozen.path,
        "amendments": [a.to_json() for a in frozen.amendments],
        "gos": _gos(frozen, str(plan.header.get("stage") or os.path.basename(folder))),
        "problems": 0,
    }
    exhausted = pl.DataFrame(dropped, schema=EXHAUSTED_SCHEMA, orient="row") if dropped else None
    return Report(frame, summary) if exhausted is None else Report(frame, summary, exhausted)


def _gos(frozen: FrozenPrereg, stage: str) -> list[dict[str, Any]]:
    """The stage's gos (`proctor prereg go`), under whichever freeze each was given, in order."""
    with locked(frozen.path, exclusive=False):
        gos = read_gos(frozen.path, frozen.design.study_id)
    return [g.to_json() for g in gos if g.stage == stage]
