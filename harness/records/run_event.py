"""The run log's events (`run-event.v1`, run.jsonl): every event's name and fields, declared once.

Each line has `event` and `at` plus the fields its event's dataclass declares
(`EVENT_TYPES`; the shapes `EVENT_FIELDS` and `OPTIONAL_FIELDS` derive from them;
`recovered: true` may be added to a line written on resume for what a crash
cut off; `anchor_push` carries the push's outcome). See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    CHAIN_KEYS,
    COST,
    NUM,
    Fields,
    Key,
    Shape,
    one_of,
    optional_keys,
    shape_of,
)
from harness.records.provenance import Provenance

__all__ = ["EVENT_FIELDS", "EVENT_TYPES", "OPTIONAL_FIELDS", "RUN_EVENTS", "RUN_EVENT_KIND", "STOP_CAUSES", "RunEvent"]

RUN_EVENT_KIND: Final = "run-event.v1"
STOP_CAUSES: Final = ("harness", "inconclusive", "deadline", "ceiling", "interrupt", "runner-error", "sampler")


# Each event's fields (besides kind, event and at), declared once; a field with a default may be absent.


@dataclass(frozen=True)
class SystemLanes:
    slot: str
    cap_usd: float
    lanes: int


@dataclass(frozen=True)
class EngineNode:
    node: str
    address: str
    slots: int


@dataclass(frozen=True)
class EngineRecord:
    """Where the attempts ran, when not in the runner's own process (docs/ray.md)."""

    kind: Annotated[str, one_of("ray")]
    ray_version: str
    sandbox: str
    nodes: tuple[EngineNode, ...]


@dataclass(frozen=True)
class StartEvent:
    pid: int
    dry_run: bool
    resume_paused: bool
    plan_sha256: str
    ceiling_usd: float
    spend_before_usd: float
    systems: tuple[SystemLanes, ...]
    # the run rules, for an oracle without the freeze (absent from logs written before they were recorded)
    reruns: int = 0
    transport_retries: int = 0
    # the harness version and git commit it ran from (absent from logs written before it was recorded)
    provenance: Provenance | None = None
    # the ray engine's cluster (absent for the local engine: docs/ray.md)
    engine: EngineRecord | None = None


@dataclass(frozen=True)
class AttemptEvent:
    system: str
    lane: int
    run_id: str
    rerun: int
    attempt: int
    attempts_line: int
    attempt_sha256: str
    started: float
    ended: float
    cost_usd: Annotated[float | str, COST]
    cls: Annotated[str, Key("class")]
    recovered: bool = False
    node: str | None = None  # the Ray node that sent it (absent for the local engine)


@dataclass(frozen=True)
class LaneEvent:
    system: str
    lane: int
    what: Annotated[str, one_of("start", "end")]
    cause: str | None


@dataclass(frozen=True)
class StopEvent:
    system: str | None
    cause: Annotated[str, one_of(*STOP_CAUSES)]
    detail: str


@dataclass(frozen=True)
class PauseEvent:
    system: str
    run_id: str
    error_code: str | None
    recovered: bool = False


@dataclass(frozen=True)
class ResumePausedEvent:
    system: str


@dataclass(frozen=True)
class SignalEvent:
    signum: int
    count: int


@dataclass(frozen=True)
class CeilingEvent:
    system: str
    crossed_at: float
    total_usd: float
    ceiling_usd: float


@dataclass(frozen=True)
class LateCostEvent:
    system: str
    run_id: str
    rerun: int
    attempt: int
    cost_usd: Annotated[float | str, COST]
    cost_status: str
    wire_line: int | None


@dataclass(frozen=True)
class IntentEvent:
    """Written (fsynced) before a request is sent: the attempt it will be and the reserve it holds.

    An attempt record of the same (run_id, rerun, attempt) resolves it; one left unresolved by a
    crash is resolved on resume by a `runner_lost` attempt record (docs/run.md)."""

    system: str
    lane: int
    run_id: str
    rerun: int
    attempt: int
    reserve_usd: float


@dataclass(frozen=True)
class EndEvent:
    exit_code: int
    complete: bool
    stops: list[Any]


@dataclass(frozen=True)
class AnchorPushEvent:
    reason: str


EVENT_TYPES: Final[Mapping[str, type]] = {
    "start": StartEvent, "attempt": AttemptEvent, "lane": LaneEvent, "stop": StopEvent, "pause": PauseEvent,
    "resume_paused": ResumePausedEvent, "signal": SignalEvent, "ceiling": CeilingEvent,
    "late_cost": LateCostEvent, "intent": IntentEvent, "end": EndEvent, "anchor_push": AnchorPushEvent,
}
"""Every event and the dataclass declaring its fields."""
EVENT_FIELDS: Final[Mapping[str, Shape]] = {
    event: {k: f for k, f in shape_of(cls).items() if k not in optional_keys(cls)} for event, cls in EVENT_TYPES.items()
}
"""Every event and the fields it always carries (besides kind, event and at)."""
OPTIONAL_FIELDS: Final[Mapping[str, Shape]] = {
    event: {k: f for k, f in shape_of(cls).items() if k in optional_keys(cls)}
    for event, cls in EVENT_TYPES.items() if optional_keys(cls)
}
"""The fields an event may carry (`recovered` on a line written on resume), checked when present."""
RUN_EVENTS: Final = tuple(EVENT_TYPES)


@dataclass(frozen=True)
class RunEvent:
    """One run-log line: its event, its time and the event's fields (JSON names)."""

    event: str
    at: float
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": RUN_EVENT_KIND, "event": self.event, "at": self.at, **self.fields}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> RunEvent:
        """A run event read strictly (`run_log_invalid`): a known event with every declared field."""
        f = Fields(obj, line, path, code=Code.RUN_LOG_INVALID)
        event = obj.get("event")
        if obj.get("kind") != RUN_EVENT_KIND or not isinstance(event, str) or event not in EVENT_FIELDS:
            raise f.bad(f"unknown event {event!r}")
        f.shape({"at": NUM, **EVENT_FIELDS[event], **_present(obj, OPTIONAL_FIELDS.get(event, {}))})
        return cls(event, float(obj["at"]),
                   {k: v for k, v in obj.items() if k not in CHAIN_KEYS and k not in ("kind", "event", "at")})


def _present(obj: Mapping[str, Any], shape: Shape) -> Shape:
    return {k: v for k, v in shape.items() if k in obj}
