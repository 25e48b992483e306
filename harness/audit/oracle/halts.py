"""Pauses, stops, signals and the ceiling: `halted`, `breaker`, `rerun_skipped`, `final_missing`, `incomplete`.

The manual: docs/oracle.md.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

from harness.audit.oracle.base import CheckBase
from harness.run.rules import (
    BREAKER_CODE,
    BREAKER_FAILURES,
    INCONCLUSIVE_ITEMS_LIMIT,
    exhausted,
    run_ended,
    unreachable,
)

__all__ = ["HaltRules"]


class HaltRules(CheckBase):
    """Pauses, stops, signals and the ceiling: `halted`, `breaker`, `rerun_skipped`, `final_missing`, `incomplete`."""

    def check_breaker(self) -> set[int]:
        """The circuit breaker, in run-log order: `BREAKER_FAILURES` unreachable attempts of a system in a
        row (within one invocation, while it is not paused) owe a `pause` of it with `BREAKER_CODE` before
        its next attempt or the invocation's `end`; every such pause follows such a streak. Returns the
        run-log lines of the breaker's pauses that are owed (no pause final asks for them)."""
        streak: dict[str, int] = {}
        pending: dict[str, int] = {}  # system -> the attempt event that owes a pause
        paused: set[str] = set()
        justified: set[int] = set()
        for line, e in self.events:
            ev = e["event"]
            if ev == "start":
                streak, pending = {}, {}  # a crash (no end) excuses a pause it cut off
            elif ev == "attempt" and not e.get("recovered"):
                got = self.by_line.get(e["attempts_line"])
                if got is None:
                    continue
                system = self.requests[got[0]["run_id"]].system
                owed = pending.pop(system, None)
                if owed is not None:
                    self.p("run.jsonl", owed, "breaker", f"{system}: {BREAKER_FAILURES} unreachable attempts in a "
                           f"row without a pause ({BREAKER_CODE}) before its next attempt")
                if not unreachable(got[0]):
                    streak[system] = 0
                    continue
                streak[system] = streak.get(system, 0) + 1
                if streak[system] >= BREAKER_FAILURES and system not in paused:
                    pending[system] = line
            elif ev == "pause":
                paused.add(e["system"])
                if e.get("error_code") == BREAKER_CODE:
                    if pending.pop(e["system"], None) is None:
                        self.p("run.jsonl", line, "breaker", f"a {BREAKER_CODE} pause of {e['system']} without "
                               f"{BREAKER_FAILURES} unreachable attempts in a row before it")
                    justified.add(line)
            elif ev == "resume_paused":
                paused.discard(e["system"])
            elif ev == "end":
                for system, owed in sorted(pending.items()):
                    self.p("run.jsonl", owed, "breaker", f"{system}: {BREAKER_FAILURES} unreachable attempts in a "
                           f"row without a pause ({BREAKER_CODE}) before the invocation's end")
                pending = {}
        return justified

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

    def check_required_halts(self) -> None:
        """The pauses and stops the rules require are logged.

        A pause final owes a `pause` event for its system and run before the system's next
        `resume_paused` (a later invocation writes one a crash cut off); a stop final, an
        inconclusive final past the limit, the ceiling's crossing and a first signal owe a stop
        of their systems in their invocation, unless it crashed (no `end`).
        """
        last = len(self.start_times) - 1
        pauses = [(line, e) for line, e in self.events if e["event"] == "pause"]
        used: set[int] = self.check_breaker()
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
            # admission per attempt (records naming their attempt): a refusal before the end excuses it
            if any(a["system"] == system and a["decision"] == "refuse" and "run_id" in a
                   and self.invocation_of(float(a["at"])) == inv and float(a["at"]) <= end for _, a in self.admissions):
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
                    if exhausted(done[-1].get("class"), done[-1].get("action")):
                        self.p("run.jsonl", None, "incomplete", f"complete logged at {at} but {rid} is exhausted "
                               "(it stands on a transport failure)")
                        break
