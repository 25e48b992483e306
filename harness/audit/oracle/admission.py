"""Admission: `admission_rule` (the decision of its logged inputs) and `admission_inputs` (the inputs
the files imply).

The manual: docs/oracle.md.
"""

from __future__ import annotations

from typing import Any

from harness.audit.oracle.base import CheckBase, close
from harness.run.rules import AdmissionInputs, admission_decision

__all__ = ["AdmissionRules"]


class AdmissionRules(CheckBase):
    """Admission: `admission_rule` (the decision of its logged inputs) and `admission_inputs` (the inputs
    the files imply): items under way in logs before issue 13, attempts under way since."""

    def check_admissions(self) -> None:
        refused: set[str] = set()
        reserve = self.rules.reserve
        admits: dict[tuple[str, int], list[tuple[float, str]]] = {}
        ends: dict[tuple[str, int], list[float]] = {}
        for _, e in self.events:
            if e["event"] == "lane" and e["what"] == "end":
                ends.setdefault((e["system"], e["lane"]), []).append(float(e["at"]))
        admits_at: dict[tuple[str, int], list[tuple[float, dict[str, Any]]]] = {}
        seen: set[tuple[Any, ...]] = set()
        for line, a in self.admissions:
            if a["decision"] == "admit" and "run_id" in a:
                # one admission per attempt in an invocation (a crash before its intent may admit it again)
                key = (self.invocation_of(float(a["at"])), a["run_id"], a["rerun"], a["attempt"])
                if key in seen:
                    self.p("admission.jsonl", line, "admission_inputs", f"attempt {a['attempt']} of run "
                           f"{a['run_id']!r} (rerun {a['rerun']}) admitted twice in one invocation")
                seen.add(key)
            if a["decision"] == "admit":
                admits.setdefault((a["system"], a["lane"]), []).append((float(a["at"]), a["item"]))
                admits_at.setdefault((a["system"], a["lane"]), []).append((float(a["at"]), a))
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
            if not close(float(a["projected_usd"]), inputs.projected_usd):
                self.p("admission.jsonl", line, "admission_rule", "projected_usd is not finished + reserve x under_way")
            t, system = float(a["at"]), inputs.system

            def bad(what: str, line: int = line) -> None:
                self.p("admission.jsonl", line, "admission_inputs", what)

            lo, hi = self.finished(system, t, inclusive=False), self.finished(system, t, inclusive=True)
            if not (close(inputs.finished_usd, lo) or close(inputs.finished_usd, hi)):
                bad(f"finished_usd {inputs.finished_usd} is not the system's spend before it ({lo})")
            tlo, thi = self.finished(None, t, inclusive=False), self.finished(None, t, inclusive=True)
            if not (close(inputs.total_usd, tlo) or close(inputs.total_usd, thi)):
                bad(f"ceiling total {inputs.total_usd} is not spend before + all spend before it ({tlo})")
            if reserve is not None and not close(inputs.reserve_usd, reserve):
                bad(f"reserve_usd {inputs.reserve_usd} is not the registered {reserve}")
            if system in self.rules.caps and not close(inputs.cap_usd, self.rules.caps[system]):
                bad(f"cap_usd {inputs.cap_usd} is not the registered {self.rules.caps[system]}")
            if self.rules.ceiling is not None and not close(inputs.ceiling_usd, self.rules.ceiling):
                bad(f"ceiling_usd {inputs.ceiling_usd} is not the registered {self.rules.ceiling}")
            if inputs.refused_before != (system in refused):
                bad(f"refused_before {inputs.refused_before} but the log says {system in refused}")
            crossed = self.crossing is not None and self.crossed_at <= t
            maybe = self.crossing is not None and self.crossing[0] <= t
            if inputs.crossed != crossed and not (maybe and inputs.crossed):
                bad(f"crossed {inputs.crossed} but the files say {crossed}")
            if "run_id" in a:
                self.check_attempt_admission(line, a, admits_at)
                if a.get("decision") == "refuse":
                    refused.add(system)
                continue
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

    def check_attempt_admission(self, line: int, a: dict[str, Any],
                                admits: dict[tuple[str, int], list[tuple[float, dict[str, Any]]]]) -> None:
        """An admission naming its attempt (admission per attempt): the attempt is its plan cell's, and
        `under_way` is this attempt plus, per other lane of the system, the attempt it last admitted in the
        invocation when that attempt's record is not yet written (ended after this decision, or missing)."""
        t, system = float(a["at"]), a["system"]
        req = self.requests.get(a["run_id"])
        if req is None or req.system != system or req.item != a["item"] or req.lane != a["lane"]:
            self.p("admission.jsonl", line, "admission_inputs", f"run id {a['run_id']!r} is not a cell of "
                   f"{system}, item {a['item']}, lane {a['lane']} in the plan")
        records = {(r["run_id"], r["rerun"], r["attempt"]): r for r, _ in self.by_line.values()}
        lo_way = hi_way = 1
        for (s, lane), seq in admits.items():
            if s != system or lane == a["lane"]:
                continue
            prior = [x for at, x in seq if at < t and self.invocation_of(at) == self.invocation_of(t)]
            if not prior or "run_id" not in prior[-1]:
                continue
            last = prior[-1]
            rec = records.get((last["run_id"], last["rerun"], last["attempt"]))
            if rec is None:
                hi_way += 1  # in flight at a crash, or never sent (a crash between admission and intent)
            elif float(rec["ended"]) > t:
                lo_way, hi_way = lo_way + 1, hi_way + 1
        if not lo_way <= a["under_way"] <= hi_way:
            self.p("admission.jsonl", line, "admission_inputs",
                   f"under_way {a['under_way']}: the files imply {lo_way}..{hi_way} attempts under way")
