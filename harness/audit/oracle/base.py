"""The oracle's state and the helpers every rule family shares: problems, invocations, spend up to a time.

Each rule family (`attempts`, `finals`, `lanes`, `spend`, `admission`, `intents`, `halts`, `anchors`) is a
mixin over `CheckBase`; `check.Check` runs them in order. The rules are listed in docs/oracle.md.
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Refusal
from harness.evidence.jsonio import read_bytes
from harness.records.plan import PlanCell

__all__ = ["ABANDONED", "CheckBase", "Problem", "Rules", "abandoned", "close", "file_bytes", "repair", "seed_hash_of"]

_REL: Final = 1e-9
_ABS: Final = 1e-12
ABANDONED: Final = ("AttemptDeadline", "budget_stop")
"""The error codes of an attempt abandoned while its request was under way (its spend may come late)."""


def abandoned(rec: dict[str, Any]) -> bool:
    """Whether an attempt record was abandoned with spend still to come (a late cost owed). A repository-task
    attempt (`work`) never is: its worker is waited for and its wire metered whole, a budget stop included."""
    return rec.get("error_code") in ABANDONED and "work" not in rec

Line = tuple[int, dict[str, Any]]


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



def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=_ABS)


@dataclass(frozen=True)
class Rules:
    reruns: int
    transport_retries: int
    reserve: float | None
    ceiling: float | None
    spend_before: float | None
    caps: Mapping[str, float]
    manifests: Mapping[str, str]
    earlier: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Hashes an anchor may hold for a manifest besides the file's own: FROZEN.json's earlier freezes
    from the one the stage ran under (the chained amendments lead from them to the current one)."""

def seed_hash_of(seed: str) -> str:
    from harness.evidence.chain_read import seed_hash

    return seed_hash(seed)


def repair(record: Mapping[str, Any]) -> bool:
    """A torn-tail repair line of a chained log (no record of the run's own)."""
    return record.get("event") == "log_repair" and "kind" not in record


def file_bytes(path: str) -> bytes | None:
    """The bytes of a regular file (a link to one followed), or None: missing, not a file, unreadable."""
    if not os.path.isfile(path):
        return None
    try:
        return read_bytes(path)
    except (Refusal, OSError):
        return None


class CheckBase:
    """One stage folder under check: what has been read so far, and the problems found."""

    requests: dict[str, PlanCell]
    systems: set[str]
    study: str
    stage: str
    heads: dict[str, list[str]]
    attempts: list[Line]
    events: list[Line]
    admissions: list[Line]
    start_times: list[float]
    end_times: list[float]
    rules: Rules
    runs: dict[tuple[str, int], list[tuple[int, dict[str, Any], str]]]
    by_line: dict[int, tuple[dict[str, Any], str]]
    attempt_events: list[Line]
    attempt_admissions: set[tuple[str, int, float]]
    finals: dict[str, list[Line]]
    late_costs: dict[tuple[str, int, int], float]
    spend: list[tuple[float, str, float]]
    spend_times: list[float]
    crossing: tuple[float, float] | None
    crossed_at: float
    plan_freeze: Any
    """The plan header's `frozen_sha256`: the freeze the stage ran under."""

    def __init__(self, folder: str, prereg: str | None) -> None:
        self.folder = folder
        self.prereg = prereg
        self.plan_freeze = None
        self.problems: list[Problem] = []

    def p(self, name: str, line: int | None, rule: str, message: str) -> None:
        self.problems.append(Problem(os.path.join(self.folder, name), line, rule, message))

    def invocation_of(self, t: float) -> int:
        """The index of the invocation (start event) in force at time t (-1 before any)."""
        return bisect.bisect_right(self.start_times, t) - 1

    def invocation_ended(self, t: float) -> float | None:
        """The time of the `end` event of the invocation in force at time t, or None (it crashed or runs on)."""
        inv = self.invocation_of(t)
        return next((at for at in self.end_times if at >= t and self.invocation_of(at) == inv), None)

    def finished(self, system: str | None, t: float, *, inclusive: bool) -> float:
        """A system's spend (None: every system's, plus spend before) up to t, as one exact sum."""
        end = (bisect.bisect_right if inclusive else bisect.bisect_left)(self.spend_times, t)
        before = [self.rules.spend_before or 0.0] if system is None else []
        return math.fsum([*before, *(a for _, s, a in self.spend[:end] if system is None or s == system)])

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
