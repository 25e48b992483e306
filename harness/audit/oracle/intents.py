"""Intents: `intent` (every intent resolved by its attempt record, every attempt of an invocation that
admits per attempt sent after its intent, every `runner_lost` attempt an intent's resolution).

The manual: docs/oracle.md.
"""

from __future__ import annotations

from typing import Any

from harness.audit.oracle.base import CheckBase, close

__all__ = ["IntentRules"]


class IntentRules(CheckBase):
    """Intents: `intent` (each written before its request, resolved by its attempt record or on resume)."""

    def check_intents(self) -> None:
        records = {(r["run_id"], r["rerun"], r["attempt"]): (line, r) for line, (r, _) in self.by_line.items()}
        admitted = {(a["run_id"], a["rerun"], a["attempt"]) for _, a in self.admissions
                    if "run_id" in a and a["decision"] == "admit"}
        last = len(self.start_times) - 1
        intents: dict[tuple[str, int, int], tuple[int, dict[str, Any]]] = {}
        for line, e in self.events:
            if e["event"] != "intent":
                continue
            key = (e["run_id"], e["rerun"], e["attempt"])
            bad = []
            req = self.requests.get(e["run_id"])
            if req is None or req.system != e["system"] or req.lane != e["lane"]:
                bad.append("names no cell of its system and lane in the plan")
            if key in intents:
                bad.append("is a second intent for its attempt")
            if key not in admitted:
                bad.append("has no admission of its attempt")
            if self.rules.reserve is not None and not close(float(e["reserve_usd"]), self.rules.reserve):
                bad.append(f"holds {e['reserve_usd']}, not the registered reserve {self.rules.reserve}")
            at = float(e["at"])
            got = records.get(key)
            if got is None:
                # owed by the invocation's end, or else by the next invocation's start (its recovery)
                if self.invocation_ended(at) is not None or self.invocation_of(at) < last:
                    bad.append("is never resolved: no attempt record, though its invocation ended or a later "
                               "one started")
            elif float(got[1]["started"]) < at:
                bad.append(f"is resolved by an attempt started at {got[1]['started']}, before it")
            for what in bad:
                self.p("run.jsonl", line, "intent", f"intent for {key} {what}")
            intents.setdefault(key, (line, e))
        per_attempt = {self.invocation_of(float(a["at"])) for _, a in self.admissions if "run_id" in a}
        for key, (line, rec) in sorted(records.items(), key=lambda kv: kv[1][0]):
            if rec.get("error_code") == "runner_lost":
                intent = intents.get(key)
                if intent is None or float(intent[1]["at"]) != float(rec["started"]):
                    self.p("attempts.jsonl", line, "intent", f"a runner_lost attempt {key} that resolves no intent "
                           "(started at the intent's time)")
            elif self.invocation_of(float(rec["started"])) in per_attempt and key not in intents:
                self.p("attempts.jsonl", line, "intent", f"attempt {key} was sent without an intent")
