"""Repository-task attempts' work (`work`): each work folder file is the one its attempt recorded, the
wire log verifies and holds the attempt's exchanges, its metered sum is the attempt's cost (spend
conserved across many requests per attempt), and the final's verdict is the work's.

The manual: docs/oracle.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from harness.audit.oracle.base import CheckBase, close, file_bytes
from harness.errors import Refusal
from harness.evidence.jsonio import sha256_hex
from harness.gate.decision import DispatchOutcome, Verification, decide_next
from harness.meter.cost import Cost, meter, total_cost
from harness.meter.pricing import Price
from harness.meter.wire import read_wire
from harness.records.work import AttemptWork, CascadeStep, step_wire

__all__ = ["WorkRules", "work_paths"]


def work_paths(folder: str, attempts: list[dict[str, Any]]) -> list[str]:
    """The work folder files the attempts name (what this rule family checks), as absolute paths."""
    out: list[str] = []
    for rec in attempts:
        work = rec.get("work")
        if isinstance(work, dict) and isinstance(work.get("folder"), str) and isinstance(work.get("files"), dict):
            out.extend(os.path.join(folder, work["folder"], str(n)) for n in work["files"])
    return out


class WorkRules(CheckBase):
    """Repository-task attempts' work folders, wire logs, metered cost and verdicts: rule `work`."""

    def _prices(self) -> dict[str, Price | None] | None:
        """Each system's price under the preregistration's pricing, or None without a preregistration."""
        if self.prereg is None or "pricing" not in self.rules.manifests:
            return None
        from harness.meter.pricing import load_pricing
        from harness.prereg.frozen import check_frozen

        pricing = load_pricing(self.rules.manifests["pricing"])
        return {s.slot: pricing.get(s.pricing_key) for s in check_frozen(self.prereg).design.systems}

    def _repairs_registered(self, arm: str) -> bool | None:
        """Whether the cascade arm registered `targeted_repair` (None: no preregistration to read it from)."""
        if self.prereg is None:
            return None
        from harness.prereg.frozen import check_frozen

        return check_frozen(self.prereg).design.arm(arm).targeted_repair

    def check_work(self) -> None:
        prices = self._prices()
        self.work_verdicts: dict[int, bool | None] = {}
        for line, (rec, _) in self.by_line.items():
            if "work" not in rec:
                continue
            try:
                work = AttemptWork.from_json(rec["work"], line=line)
            except Refusal as exc:  # validate_run_attempt read it already; kept for a direct caller
                self.p("attempts.jsonl", line, "work", exc.message)
                continue
            self.work_verdicts[line] = work.passed
            where = os.path.join(self.folder, work.folder)
            for name, digest in sorted(work.files.items()):
                data = file_bytes(os.path.join(where, name))
                if data is None or sha256_hex(data) != digest:
                    self.p(f"{work.folder}/{name}", None, "work", f"missing, or not the file attempts.jsonl line "
                           f"{line} recorded (sha256 {digest[:16]})")
            if work.cascade is not None:
                self._check_cascade(line, rec, work, where, prices)
                continue
            if "wire.jsonl" not in work.files:
                if work.exchanges != 0 or (rec["cost_usd"] != "unknown" and rec["cost_usd"] != 0):
                    self.p("attempts.jsonl", line, "work", "an attempt without a wire log must have no exchanges "
                           "and cost 0")
                continue
            try:
                wire = read_wire(os.path.join(where, "wire.jsonl"))
            except (Refusal, OSError) as exc:
                self.p(f"{work.folder}/wire.jsonl", None, "work", f"the wire log does not verify: {exc}")
                continue
            if len(wire) != work.exchanges:
                self.p("attempts.jsonl", line, "work", f"{work.exchanges} exchanges recorded, the wire log holds "
                       f"{len(wire)}")
            if prices is None:
                continue
            system = self.requests[rec["run_id"]].system
            metered = total_cost(meter(w.usage, prices.get(system)) for w in wire if w.sent)  # a stop cost $0
            self._check_cost(line, rec["cost_usd"], metered, "its wire log")

    def _check_cost(self, line: int, cost: Any, metered: Cost, what: str) -> None:
        if (metered.total is None) != (cost == "unknown") or (
                metered.total is not None and not close(float(cost), metered.total)):
            self.p("attempts.jsonl", line, "work", f"cost_usd {cost!r} is not the metered sum of {what} "
                   f"({'unknown' if metered.total is None else metered.total})")

    def _check_cascade(self, line: int, rec: dict[str, Any], work: AttemptWork, where: str,
                       prices: dict[str, Price | None] | None) -> None:
        """A live cascade: its first system is the cell's, its steps run its systems in order, a step after a
        passed gate never runs, each step's wire log holds its exchanges, and the attempt's cost is the sum of
        every step's wire metered at that step's system's price (docs/oracle.md, rule `work`)."""
        assert work.cascade is not None
        c = work.cascade
        cell = self.requests[rec["run_id"]].system
        ran = tuple(s.system for s in c.steps)
        distinct = tuple(s for i, s in enumerate(ran) if i == 0 or ran[i - 1] != s)
        if not c.systems or c.systems[0] != cell or distinct != c.systems[:len(distinct)]:
            self.p("attempts.jsonl", line, "work", f"the cascade's steps {list(ran)} do not run its systems "
                   f"{list(c.systems)} in order from the cell's system {cell}")
            return
        for problem in _repair_problems(c.steps, self._repairs_registered(self.requests[rec["run_id"]].arm)):
            self.p("attempts.jsonl", line, "work", problem)
        for step in c.steps[:-1]:
            if step.gate is None or step.gate.passed:
                self.p("attempts.jsonl", line, "work", f"cascade step {step.system} is followed by another without "
                       "a failed gate")
        costs: list[Cost] = []
        held = 0
        for number, step in enumerate(c.steps, start=1):
            if step.wire is None:
                if step.exchanges != 0 or step.cost_usd not in (0, 0.0):
                    self.p("attempts.jsonl", line, "work", f"cascade step {step.system} without a wire log must "
                           "have no exchanges and cost 0")
                continue
            if step.wire != step_wire(number) or step.wire not in work.files:
                self.p("attempts.jsonl", line, "work", f"cascade step {number} names wire log {step.wire!r}")
                continue
            try:
                wire = read_wire(os.path.join(where, step.wire))
            except (Refusal, OSError) as exc:
                self.p(f"{work.folder}/{step.wire}", None, "work", f"the wire log does not verify: {exc}")
                return
            held += len(wire)
            if len(wire) != step.exchanges:
                self.p("attempts.jsonl", line, "work", f"cascade step {step.system}: {step.exchanges} exchanges "
                       f"recorded, its wire log holds {len(wire)}")
            if prices is not None:
                costs.append(total_cost(meter(w.usage, prices.get(step.system)) for w in wire if w.sent))
        if held != work.exchanges:
            self.p("attempts.jsonl", line, "work", f"{work.exchanges} exchanges recorded, the cascade's wire logs "
                   f"hold {held}")
        if prices is not None:
            self._check_cost(line, rec["cost_usd"], total_cost(costs) if costs else Cost(0.0),
                             "its steps' wire logs, each at its system's price")

    def check_work_verdicts(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        """A delivered final of a work attempt carries the work's verdict."""
        for line, rec in records:
            n = rec.get("attempt_line")
            if rec.get("class") != "delivered" or not isinstance(n, int) or n not in self.work_verdicts:
                continue
            if rec.get("passed") is not (self.work_verdicts[n] is True):
                self.p("finals.jsonl", line, "work", f"passed {rec.get('passed')!r} is not the work's verdict "
                       f"{self.work_verdicts[n]!r}")


def _repair_problems(steps: Sequence[CascadeStep], registered: bool | None) -> list[str]:
    """A cascade's steps against the switch rule (`harness.gate.decision.decide_next`, replayed on each
    system's gates): a step repeating its system's must be a `localized_defect` step the rule decided on the
    gate before it, in an arm that registered `targeted_repair` (`registered`; None: not known); a step on the
    next system an `escalation` (records made before targeted repairs: no class)."""
    problems: list[str] = []
    if registered is False and any(s.switch_class == "localized_defect" for s in steps):
        problems.append("a cascade step is a targeted repair, but its arm did not register targeted_repair")
    history: list[DispatchOutcome] = []
    for number, step in enumerate(steps, start=1):
        repeat = number > 1 and steps[number - 2].system == step.system
        if step.switch_class is not None and step.switch_class != (
                "first" if number == 1 else "localized_defect" if repeat else "escalation"):
            problems.append(f"cascade step {number} ({step.system}) has switch_class {step.switch_class!r}, not "
                            "what its place in the cascade makes it")
        if repeat:
            decided = decide_next(step.system, history, 0).switch_class if history else None
            if step.switch_class != "localized_defect" or decided != "localized_defect":
                problems.append(f"cascade step {number} repeats system {step.system} but the switch rule found no "
                                f"localized defect to repair on the gate before it (it says {decided!r})")
        else:
            history = []
        gate = step.gate
        if gate is not None and not gate.passed:
            history.append(DispatchOutcome(
                lane=step.system, model=step.model, switch_class="localized_defect" if repeat else "first",
                verification=Verification(receipt_id=f"gate.s{number}", passed=False, fingerprint=gate.fingerprint,
                                          tests_expected=gate.tests_expected, tests_failing=gate.tests_failing)))
    return problems
