"""Spend, the ceiling and conservation: `ceiling`, `conservation`, `late_cost`.

The manual: docs/oracle.md.
"""

from __future__ import annotations

import bisect
import math

from harness.audit.oracle.base import CheckBase, abandoned, close
from harness.run.rules import booked_spend, cost_for_spend

__all__ = ["SpendRules"]


class SpendRules(CheckBase):
    """Spend, the ceiling and conservation: `ceiling`, `conservation`, `late_cost`."""

    def check_spend(self) -> None:
        reserve = self.rules.reserve if self.rules.reserve is not None else 0.0
        # (time, kind order, system, amount, where)
        spend: list[tuple[float, str, float]] = []
        owed = {(r["run_id"], r["rerun"], r["attempt"]): r for r, _ in self.by_line.values() if abandoned(r)}
        self.late_costs: dict[tuple[str, int, int], float] = {}  # (run_id, rerun, attempt) -> its first late cost
        for rec, _ in self.by_line.values():  # a cascade's steps each to its own system (`booked_spend`)
            for system, amount in booked_spend(rec, self.requests[rec["run_id"]].system, reserve, self.systems):
                spend.append((float(rec["ended"]), system, amount))
        for line, e in self.events:
            if e["event"] != "late_cost":
                continue
            key = (e["run_id"], e["rerun"], e["attempt"])
            owner = owed.get(key)
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
                if not close(float(e["total_usd"]), crossing[1]):
                    self.p("run.jsonl", line, "conservation",
                           f"ceiling total {e['total_usd']} is not spend before + records + late costs = {crossing[1]}")
            self.crossed_at = min([crossing[0], *(float(e["crossed_at"]) for _, e in events)])

    def check_late_costs_owed(self) -> None:
        """Every abandoned attempt's late cost is logged before its invocation's `end`.

        The runner waits for an abandoned request at the end (at most a deadline) and
        then cancels it, logging its cost or "unknown" either way; only a crash (no `end`)
        leaves one owed.
        """
        for line, (rec, _) in self.by_line.items():
            if not abandoned(rec):
                continue
            key = (rec["run_id"], rec["rerun"], rec["attempt"])
            end = self.invocation_ended(float(rec["started"]))
            at = self.late_costs.get(key)
            if end is not None and (at is None or at > end):
                self.p("attempts.jsonl", line, "late_cost", f"{key} abandoned without its late cost, though its "
                       f"invocation ended at {end}" + ("" if at is None else f" (one logged at {at})"))
