"""Lanes: `lane`, `lane_overlap`, `lane_order` (admission and arm order within an invocation, a lane
ended `refused`).

The manual: docs/oracle.md.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from harness.audit.oracle.base import CheckBase

__all__ = ["LaneRules"]


class LaneRules(CheckBase):
    """Lanes: `lane`, `lane_overlap`, `lane_order` (admission and arm order within an invocation, a lane"""

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
        self.attempt_admissions = {(a["system"], a["lane"], float(a["at"])) for _, a in self.admissions if "run_id" in a}
        for line, adm in self.admissions:
            if adm["decision"] == "admit":
                admits.setdefault((adm["system"], adm["lane"]), []).append((float(adm["at"]), line, adm["item"]))
        position = {(r.system, r.item): r.lane_position for r in self.requests.values()}
        for (system, lane), seq in admits.items():
            for (t0, _, i0), (t1, line, i1) in itertools.pairwise(seq):
                if i0 == i1 and (system, lane, t1) in self.attempt_admissions:
                    continue  # admission per attempt: the item's next attempt
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
