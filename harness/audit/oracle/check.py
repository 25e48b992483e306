"""The whole check of one stage folder: read its plan and logs, take the registered rules, and run
every rule family in order.

The manual: docs/oracle.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from harness.audit.oracle.admission import AdmissionRules
from harness.audit.oracle.anchors import AnchorRules
from harness.audit.oracle.attempts import AttemptRules
from harness.audit.oracle.base import Problem, Rules, repair
from harness.audit.oracle.finals import FinalRules
from harness.audit.oracle.halts import HaltRules
from harness.audit.oracle.intents import IntentRules
from harness.audit.oracle.lanes import LaneRules
from harness.audit.oracle.shapes import (
    admission_problem,
    anchor_problem,
    event_problem,
    final_problem,
)
from harness.audit.oracle.spend import SpendRules
from harness.audit.oracle.work import WorkRules
from harness.errors import Refusal
from harness.evidence.chain_read import verify_log
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.meter.pricing import BUNDLED_PRICING
from harness.records._shape import is_int
from harness.records.plan import PlanCell
from harness.run.attempts import read_plan
from harness.run.layout import LOGS, log_seed

__all__ = ["Check", "run_problems"]

PathArg = str | os.PathLike[str]


class Check(AttemptRules, FinalRules, LaneRules, SpendRules, AdmissionRules, IntentRules, HaltRules, AnchorRules,
            WorkRules):
    """Every rule family over one stage folder."""

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
        return [(line, r) for line, r in records if not repair(r)], [sha256_hex(r) for r in raw]

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

    def _rules(self, requests: tuple[PlanCell, ...]) -> Rules:
        if self.prereg is not None:
            from harness.prereg.frozen import check_frozen

            frozen = check_frozen(self.prereg)
            d = frozen.design
            local = os.path.join(self.prereg, "pricing.yaml")
            manifests = {"plan.jsonl": os.path.join(self.folder, "plan.jsonl"),
                         "FROZEN.json": os.path.join(frozen.path, "FROZEN.json"),
                         "pricing": local if os.path.exists(local) else str(BUNDLED_PRICING)}
            freezes = frozen.freezes()
            ran = self.plan_freeze if self.plan_freeze in freezes else freezes[-1]
            earlier = {"FROZEN.json": frozenset(freezes[freezes.index(ran):])}
            return Rules(d.run.reruns, d.run.transport_retries, d.budgets.reserve_per_item_usd,
                          d.budgets.ceiling_usd, d.budgets.spend_before_usd,
                          {s.slot: s.cap_usd for s in d.systems}, manifests, earlier)
        starts = [e for _, e in self.events if e["event"] == "start"]
        caps = {s["slot"]: float(s["cap_usd"]) for e in starts[:1] for s in e["systems"]}
        reserve = next((float(a["reserve_usd"]) for _, a in self.admissions), None)
        most = max((r["attempt"] for _, r in self.attempts if is_int(r.get("attempt"))), default=1)
        # the rules a start event logs (newer runs), else the registered default reruns and the most
        # attempts seen (an outage the breaker paused may not show every transport retry)
        logged = next((e for e in starts if is_int(e.get("reruns")) and is_int(e.get("transport_retries"))), None)
        reruns, retries = (int(logged["reruns"]), int(logged["transport_retries"])) if logged else (2, max(0, most - 1))
        return Rules(reruns, retries, reserve,
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
        self.plan_freeze = plan.header.get("frozen_sha256")
        logs = {name: self._log(name) for name in LOGS}
        self.heads = {name: v[1] for name, v in logs.items()}
        self.attempts = logs["attempts"][0]
        self.events = self._shaped("run", logs["run"][0], event_problem)
        self.admissions = self._shaped("admission", logs["admission"][0], admission_problem)
        self.start_times = [float(e["at"]) for _, e in self.events if e["event"] == "start"]
        self.end_times = [float(e["at"]) for _, e in self.events if e["event"] == "end"]
        self.rules = self._rules(plan.requests)
        self.check_attempts(logs["attempts"])
        self.check_run_log()
        self.check_work()
        finals = self._shaped("finals", logs["finals"][0], final_problem)
        self.check_finals(finals)
        self.check_work_verdicts(finals)
        self.check_archives()
        self.check_lanes()
        self.check_spend()
        self.check_late_costs_owed()
        self.check_admissions()
        self.check_intents()
        self.check_halts()
        self.check_required_halts()
        self.check_anchors(self._shaped("anchors", logs["anchors"][0], anchor_problem))
        return self.problems



def _stages_in(folder: str) -> list[str]:
    """The stage folders (holding plan.jsonl) directly inside `folder`."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return [os.path.join(folder, n) for n in names if os.path.exists(os.path.join(folder, n, "plan.jsonl"))]


def _stage_folders(results_dir: str, study: str | None = None) -> list[str]:
    """The stage folders of a stage folder, a study folder (RESULTS/<study>) or a results root.

    In a results root only `study`'s folder is taken when `study` is given: a
    shared root holds other studies, which the preregistration's rules do not govern.
    """
    if os.path.exists(os.path.join(results_dir, "plan.jsonl")):
        return [results_dir]
    stages = _stages_in(results_dir)
    if stages:  # a study folder: its stages
        return stages
    out = []
    for name in sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []:
        if study is None or name == study:
            out.extend(_stages_in(os.path.join(results_dir, name)))
    return out


def run_problems(results_dir: PathArg, *, prereg_dir: PathArg | None = None) -> list[Problem]:
    """Every problem with the run files under `results_dir`: a stage folder, a study folder or a results root.

    With `prereg_dir` the registered rules (reruns, transport retries, reserve, caps,
    ceiling, spend before, manifests) come from the frozen preregistration, and in a
    results root only that study's stages are checked (`RESULTS/<study>/`); without it
    the rules come from the run log's `start` events and the admission records (reruns
    defaults to the registered default, 2) and every study's stages are checked.
    """
    root = os.path.abspath(os.fspath(results_dir))
    study = None
    if prereg_dir is not None:
        from harness.prereg.frozen import check_frozen

        study = check_frozen(prereg_dir).design.study_id
    folders = _stage_folders(root, study)
    if not folders:
        what = "" if study is None else f" of study {study!r}"
        return [Problem(root, None, "chain", f"no stage folder{what} (plan.jsonl) found: give a stage folder, "
                        "a study folder (RESULTS/<study>) or a results root")]
    problems: list[Problem] = []
    for folder in folders:
        problems.extend(Check(folder, None if prereg_dir is None else os.fspath(prereg_dir)).run())
    return problems
