"""The switch decision before a dispatch: stagnation, provider failure, localized defect, or none.

A pure function of the dispatch and verification history (no I/O), so the gated
path and a study's cascade arm apply one rule. The manual: docs/models.md,
`harness/gate/decision.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.gate.escalation import LATERAL, STAGNATION_RUN, is_provider_failure

__all__ = [
    "BROAD_SUCCESS_MIN_FRACTION",
    "BROAD_SUCCESS_MIN_TESTS",
    "LOCALIZED_MAX_FAILING",
    "MAX_TARGETED_REPAIRS",
    "SWITCH_CLASSES",
    "DispatchOutcome",
    "SwitchDecision",
    "Verification",
    "decide_next",
    "dispatch_history",
    "localized_defect",
]

BROAD_SUCCESS_MIN_TESTS: Final = 4
"""Broad success needs at least this many expected tests in the per-test report."""
BROAD_SUCCESS_MIN_FRACTION: Final = 0.75
"""Broad success: at least this fraction of the expected tests passed."""
LOCALIZED_MAX_FAILING: Final = 2
"""Localized: one to this many tests did not pass."""
MAX_TARGETED_REPAIRS: Final = 2
"""Targeted repairs allowed since the last lane switch; after them the stagnation rule alone decides."""

SWITCH_CLASSES: Final = ("first", "continue", "stagnation", "stagnation_limit", "provider_failure", "localized_defect")
"""Every class a decision can have (journaled as `switch_class`)."""


@dataclass(frozen=True)
class Verification:
    """The last verification after one dispatch (the verify record).

    `tests_expected` / `tests_failing`: the per-test report (the expected test ids'
    count, and the ids that did not pass or failed); None when the verifier had no
    complete, untampered report.
    """

    receipt_id: str | None
    passed: bool
    fingerprint: str | None
    tests_expected: int | None = None
    tests_failing: tuple[str, ...] | None = None


@dataclass(frozen=True)
class DispatchOutcome:
    """One dispatch: where it ran, the class it ran under, and its verification (None: not verified)."""

    lane: str
    switch_class: str = "continue"
    model: str | None = None
    provider: str | None = None
    provider_failure: bool = False
    verification: Verification | None = None


@dataclass(frozen=True)
class SwitchDecision:
    """What the next dispatch is: its class, lane, the model to repeat (a targeted repair), and why."""

    switch_class: str
    lane: str
    from_lane: str
    reason: str
    model: str | None = None
    """A `localized_defect` decision: the model of the dispatch to repair (run it again)."""
    fingerprint: str | None = None
    stagnant_count: int = 0
    failing_tests: tuple[str, ...] = ()
    tests_expected: int | None = None
    receipt_id: str | None = None
    targeted_repairs: int = 0
    """Targeted repairs since the last lane switch, this one included."""
    excluded_providers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "switch_class": self.switch_class, "lane": self.lane, "from_lane": self.from_lane,
            "reason": self.reason, "model": self.model, "fingerprint": self.fingerprint,
            "stagnant_count": self.stagnant_count, "failing_tests": list(self.failing_tests),
            "tests_expected": self.tests_expected, "receipt_id": self.receipt_id,
            "targeted_repairs": self.targeted_repairs, "excluded_providers": list(self.excluded_providers),
        }  # fmt: skip


def localized_defect(v: Verification) -> bool:
    """Broad success with a localized defect: a failing verification with a per-test report of at
    least `BROAD_SUCCESS_MIN_TESTS` expected tests, 1 to `LOCALIZED_MAX_FAILING` of them failing,
    and at least `BROAD_SUCCESS_MIN_FRACTION` of them passing (the fingerprint's novelty is the
    history's to judge: `decide_next`)."""
    if v.passed or v.tests_expected is None or v.tests_failing is None or not v.fingerprint:
        return False
    failing = len(v.tests_failing)
    if v.tests_expected < BROAD_SUCCESS_MIN_TESTS or not 1 <= failing <= LOCALIZED_MAX_FAILING:
        return False
    return (v.tests_expected - failing) >= BROAD_SUCCESS_MIN_FRACTION * v.tests_expected


def _since_switch(history: Sequence[DispatchOutcome]) -> Sequence[DispatchOutcome]:
    starts = [i for i, d in enumerate(history) if d.switch_class == "stagnation"]
    return history[starts[-1] :] if starts else history


def decide_next(initial_lane: str, history: Sequence[DispatchOutcome], max_lane_switches: int) -> SwitchDecision:
    """The class and lane of the next dispatch, from the history of dispatches and their verifications.

    In order: stagnation (`STAGNATION_RUN` identical failing fingerprints in a row since the last
    lane switch: lateral, or `stagnation_limit` after `max_lane_switches`), provider failure (the
    last dispatch: same lane, its failed providers excluded), localized defect (the last counted
    verification is one, its fingerprint new since the last lane switch, fewer than
    `MAX_TARGETED_REPAIRS` repairs so far: same lane and model, the failing tests' evidence), else
    continue. docs/models.md, `harness/gate/decision.py`.
    """
    if not history:
        return SwitchDecision("first", initial_lane, initial_lane, "the first dispatch")
    lane = history[-1].lane
    switches = sum(1 for d in history if d.switch_class == "stagnation")
    recent = _since_switch(history)
    counted = [d.verification for d in recent if d.verification is not None and not d.provider_failure]
    run = 0
    for c in reversed(counted):
        if c.passed or not c.fingerprint or c.fingerprint != counted[-1].fingerprint:
            break
        run += 1
    if run >= STAGNATION_RUN:
        stuck = counted[-run:]
        print_ = counted[-1].fingerprint
        ids = ", ".join(str(c.receipt_id) for c in stuck)
        if switches >= max_lane_switches:
            return SwitchDecision(
                "stagnation_limit", lane, lane,
                f"{run} identical failures in lane {lane} after {switches} lane switch(es); the limit is "
                f"{max_lane_switches}", fingerprint=print_, stagnant_count=run,
            )  # fmt: skip
        return SwitchDecision(
            "stagnation", LATERAL[lane], lane,
            f"stagnation: the last {run} verifications after dispatches in lane {lane} ({ids}) failed with "
            f"the same fingerprint {str(print_)[:16]}", fingerprint=print_, stagnant_count=run,
        )  # fmt: skip
    last = history[-1]
    if last.provider_failure:
        failed = tuple(dict.fromkeys(d.provider for d in history if d.provider_failure and d.lane == lane
                                     and d.provider is not None))  # fmt: skip
        return SwitchDecision(
            "provider_failure", lane, lane,
            f"provider failure in the last dispatch ({last.provider or 'no provider named'}): same lane, "
            "another provider", model=None, excluded_providers=failed,
        )  # fmt: skip
    repairs = sum(1 for d in recent if d.switch_class == "localized_defect")
    v = last.verification
    if v is not None and localized_defect(v):
        earlier = {c.fingerprint for c in counted[:-1] if not c.passed and c.fingerprint}
        failing = tuple(v.tests_failing or ())
        share = f"{len(failing)} of {v.tests_expected} tests failing"
        if v.fingerprint in earlier:
            why = f"a localized defect ({share}) but its fingerprint was seen before in lane {lane}"
        elif repairs >= MAX_TARGETED_REPAIRS:
            why = f"a localized defect ({share}) but {repairs} targeted repairs were made in lane {lane} already"
        else:
            return SwitchDecision(
                "localized_defect", lane, lane,
                f"localized defect after broad success: {share} ({', '.join(failing)}), a new fingerprint "
                f"{str(v.fingerprint)[:16]}; targeted repair {repairs + 1} of {MAX_TARGETED_REPAIRS} by the same "
                "lane and model", model=last.model, fingerprint=v.fingerprint, stagnant_count=run,
                failing_tests=failing, tests_expected=v.tests_expected, receipt_id=v.receipt_id,
                targeted_repairs=repairs + 1,
            )  # fmt: skip
        return SwitchDecision("continue", lane, lane, f"{why}: the stagnation rule applies",
                              fingerprint=v.fingerprint, stagnant_count=run, targeted_repairs=repairs)  # fmt: skip
    return SwitchDecision("continue", lane, lane, "no switch: the stagnation rule applies", stagnant_count=run,
                          targeted_repairs=repairs)  # fmt: skip


_CLASS_OF_EVENT: Final = {"lane_switch": "stagnation", "provider_switch": "provider_failure",
                          "targeted_repair": "localized_defect"}  # fmt: skip


def dispatch_history(events: Iterable[Mapping[str, Any]]) -> tuple[DispatchOutcome, ...]:
    """The gate journal as `decide_next`'s history: each dispatch, the class it ran under (the switch
    event naming it), whether its provider failed, and the last verification after it."""
    classes: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    by_seq: dict[int, dict[str, Any]] = {}
    for event in events:
        kind = event.get("event")
        if kind in _CLASS_OF_EVENT and isinstance(event.get("dispatch_id"), str):
            classes[event["dispatch_id"]] = _CLASS_OF_EVENT[str(kind)]
        elif kind == "dispatch_start":
            did = str(event["dispatch_id"])
            item = {"lane": str(event["lane"]), "switch_class": classes.get(did, "first" if not out else "continue"),
                    "model": event.get("model"), "provider": event.get("provider"), "provider_failure": False,
                    "verification": None}  # fmt: skip
            out.append(item)
            by_seq[int(event["seq"])] = item
        elif kind == "dispatch_end" and int(event["seq"]) in by_seq and is_provider_failure(event):
            by_seq[int(event["seq"])]["provider_failure"] = True
        elif kind == "verify" and int(event.get("dispatch_seq", 0)) in by_seq:
            failing = event.get("tests_failing")
            by_seq[int(event["dispatch_seq"])]["verification"] = Verification(
                receipt_id=event.get("receipt_id"),
                passed=bool(event.get("passed")),
                fingerprint=event.get("fingerprint"),
                tests_expected=event.get("tests_expected"),
                tests_failing=None if failing is None else tuple(failing),
            )
    return tuple(DispatchOutcome(**item) for item in out)
