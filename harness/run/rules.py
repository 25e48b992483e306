"""The pure rules of a run: a run's class and action, when it ends, admission, and spend.

Pure functions of records: the runner, the ledger and the oracle all apply them.
See docs/run.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from harness.evidence.money import sum_costs
from harness.records.admission import Admission, CeilingState
from harness.run.resume import ERROR_CLASSES, TRANSPORT_CODES

__all__ = [
    "BREAKER_CODE",
    "BREAKER_FAILURES",
    "INCONCLUSIVE_ITEMS_LIMIT",
    "AdmissionInputs",
    "Room",
    "action_for",
    "admission_decision",
    "admission_record",
    "booked_spend",
    "ceiling_total",
    "classify",
    "cost_for_spend",
    "exhausted",
    "run_ended",
    "unreachable",
]

INCONCLUSIVE_ITEMS_LIMIT: Final = 5
"""A system stops when inconclusive failures have ended runs in more than this many items."""


BREAKER_FAILURES: Final = 5
"""The circuit breaker: this many attempts in a row that reached no endpoint (`unreachable`: no HTTP
answer at all), in run-log order within one invocation, pause their system as an operator failure
(`BREAKER_CODE`). An HTTP answer of any kind (a 429 or 500 too) resets the count."""
BREAKER_CODE: Final = "endpoint_unreachable"
"""The `error_code` of the breaker's `pause` event; `--resume-paused` lifts it like any pause."""


def exhausted(cls: str | None, action: str | None) -> bool:
    """Whether a final leaves its cell `exhausted`: it stands on a transport failure (class `provider`,
    every transport retry and rerun spent). Infrastructure, not the model: never scored, and a stage
    with an exhausted cell is not complete."""
    return cls == "provider" and action == "stand"


def unreachable(attempt: Mapping[str, Any]) -> bool:
    """Whether an attempt got no HTTP answer at all: a transport failure or timeout without a status."""
    return (attempt.get("outcome") == "error" and attempt.get("error_code") in ("transport", "timeout")
            and attempt.get("http_status") is None)


def classify(attempt: Mapping[str, Any]) -> str:
    """The class of the attempt that ended a run: `delivered`, or its error code's class."""
    if attempt.get("outcome") == "delivered":
        return "delivered"
    return ERROR_CLASSES[str(attempt["error_code"])]


def action_for(cls: str, rerun: int, reruns: int) -> str:
    """What a run's end asks for.

    delivered, model: stand (a result). provider, inconclusive: rerun at once while
    `rerun < reruns`, else stand (labelled by its class). operator: pause the
    system's lanes (after `--resume-paused` the cell gets its next rerun).
    harness, ceiling: stop the system's lanes (a later invocation reruns the cell
    while reruns remain).
    """
    if cls in ("delivered", "model"):
        return "stand"
    if cls in ("provider", "inconclusive"):
        return "rerun" if rerun < reruns else "stand"
    if cls == "operator":
        return "pause" if rerun < reruns else "stand"
    if cls in ("harness", "ceiling"):
        return "stop" if rerun < reruns else "stand"
    raise ValueError(f"unknown class {cls!r}")


def run_ended(attempt: Mapping[str, Any], transport_retries: int) -> bool:
    """Whether `attempt` ends its run: delivered, a non-transport error, or the last transport retry."""
    if attempt.get("outcome") == "delivered":
        return True
    return attempt["error_code"] not in TRANSPORT_CODES or int(attempt["attempt"]) >= transport_retries + 1


@dataclass(frozen=True)
class AdmissionInputs:
    """What one admission decision is made from (all logged with it). `under_way` counts the system's
    attempts under way, this one included (each holds the reserve until its record is written)."""

    system: str
    item: str
    lane: int
    finished_usd: float
    reserve_usd: float
    under_way: int
    cap_usd: float
    refused_before: bool
    total_usd: float
    ceiling_usd: float
    crossed: bool

    @property
    def projected_usd(self) -> float:
        return self.finished_usd + self.reserve_usd * self.under_way


def admission_decision(inputs: AdmissionInputs) -> tuple[str, str]:
    """(decision, reason): refuse after a refusal, after the ceiling's crossing, or past the cap."""
    if inputs.refused_before:
        return "refuse", "refused_before"
    if inputs.crossed:
        return "refuse", "ceiling_crossed"
    if inputs.projected_usd > inputs.cap_usd:
        return "refuse", "over_cap"
    return "admit", "within_cap"


def admission_record(inputs: AdmissionInputs, at: float,
                     attempt: tuple[str, int, int] | None = None) -> Admission:
    """The `admission.v1` record for `inputs` (decision included), naming the attempt (run_id, rerun,
    attempt) it is for."""
    decision, reason = admission_decision(inputs)
    run_id, rerun, number = (None, None, None) if attempt is None else attempt
    return Admission(
        system=inputs.system, item=inputs.item, lane=inputs.lane, finished_usd=inputs.finished_usd,
        reserve_usd=inputs.reserve_usd, under_way=inputs.under_way, projected_usd=inputs.projected_usd,
        cap_usd=inputs.cap_usd, refused_before=inputs.refused_before,
        ceiling=CeilingState(inputs.total_usd, inputs.ceiling_usd, inputs.crossed),
        decision=decision, reason=reason, at=at, run_id=run_id, rerun=rerun, attempt=number,
    )


class Room(NamedTuple):
    """What an attempt of a system may spend inside itself, under each limit (docs/run.md, "Budgets inside an
    attempt"): the system's cap, and the run's ceiling, each less what is already spent or held."""

    cap: float
    ceiling: float

    @property
    def usd(self) -> float:
        """The smaller of the two, never below 0."""
        return max(0.0, min(self.cap, self.ceiling))


def cost_for_spend(cost_usd: Any, reserve_usd: float) -> float:
    """What a recorded cost adds to spend: the number, or the reserve when it is "unknown"."""
    return reserve_usd if cost_usd == "unknown" else float(cost_usd)


def booked_spend(record: Mapping[str, Any], system: str, reserve_usd: float,
                 systems: Collection[str]) -> list[tuple[str, float]]:
    """What an attempt record adds to each system's spend, in order: (system, amount) parts (docs/run.md,
    "Cascade arms", "Which cap each request hits").

    A live cascade's attempt (`work.cascade`) whose cost is a number and whose every step's `cost_usd` is a
    number, each step of a registered system (`systems`), books each step to its own system; anything else
    books `cost_for_spend` of the whole attempt to the cell's `system` (an unknown cost: the reserve, once).
    The runner, the ledger and the oracle all split spend here, so they agree part by part.
    """
    whole = [(system, cost_for_spend(record.get("cost_usd"), reserve_usd))]
    work, cost = record.get("work"), record.get("cost_usd")
    if not isinstance(work, Mapping) or isinstance(cost, bool) or not isinstance(cost, (int, float)):
        return whole
    cascade = work.get("cascade")
    steps = cascade.get("steps") if isinstance(cascade, Mapping) else None
    if not isinstance(steps, Sequence) or isinstance(steps, (str, bytes)) or not steps:
        return whole
    parts: list[tuple[str, float]] = []
    for step in steps:
        if not isinstance(step, Mapping):
            return whole
        owner, amount = step.get("system"), step.get("cost_usd")
        if owner not in systems or isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return whole
        parts.append((str(owner), float(amount)))
    return parts


def ceiling_total(spend_before_usd: float, parts: Mapping[str, Sequence[float]]) -> float:
    """The ceiling's total: one exact (`math.fsum`) sum of spend before and every system's spend parts.

    Summing the systems' own rounded sums instead would round twice, and the ceiling's
    crossing would then depend on how the spend is split between systems. An overflow is
    refused (`cost_overflow`).
    """
    return sum_costs([spend_before_usd, *(p for system_parts in parts.values() for p in system_parts)])
