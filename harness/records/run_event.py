"""The run log's events (`run-event.v1`, run.jsonl): every event's name and fields, declared once.

Each line has `event` and `at` plus the fields `EVENT_FIELDS` declares for its
event (`recovered: true` may be added to a line written on resume for what a crash
cut off; `anchor_push` carries the push's outcome). See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code
from harness.records._shape import (
    BOOL,
    CHAIN_KEYS,
    COST,
    INT,
    LIST,
    NUM,
    OPT_STR,
    STR,
    Field,
    Fields,
    Shape,
    each,
    is_int,
    one_of,
)

__all__ = ["EVENT_FIELDS", "OPTIONAL_FIELDS", "RUN_EVENTS", "RUN_EVENT_KIND", "STOP_CAUSES", "RunEvent"]

RUN_EVENT_KIND: Final = "run-event.v1"
STOP_CAUSES: Final = ("harness", "inconclusive", "deadline", "ceiling", "interrupt", "runner-error", "sampler")
_OPT_INT = Field("an integer or null", lambda v: v is None or is_int(v))

EVENT_FIELDS: Mapping[str, Shape] = {
    "start": {"pid": INT, "dry_run": BOOL, "resume_paused": BOOL, "plan_sha256": STR, "ceiling_usd": NUM,
              "spend_before_usd": NUM,
              "systems": each({"slot": STR, "cap_usd": NUM, "lanes": INT}, "a list of {slot, cap_usd, lanes}")},
    "attempt": {"system": STR, "lane": INT, "run_id": STR, "rerun": INT, "attempt": INT, "attempts_line": INT,
                "attempt_sha256": STR, "started": NUM, "ended": NUM, "cost_usd": COST, "class": STR},
    "lane": {"system": STR, "lane": INT, "what": one_of("start", "end"), "cause": OPT_STR},
    "stop": {"system": OPT_STR, "cause": one_of(*STOP_CAUSES), "detail": STR},
    "pause": {"system": STR, "run_id": STR, "error_code": OPT_STR},
    "resume_paused": {"system": STR},
    "signal": {"signum": INT, "count": INT},
    "ceiling": {"system": STR, "crossed_at": NUM, "total_usd": NUM, "ceiling_usd": NUM},
    "late_cost": {"system": STR, "run_id": STR, "rerun": INT, "attempt": INT, "cost_usd": COST,
                  "cost_status": STR, "wire_line": _OPT_INT},
    "end": {"exit_code": INT, "complete": BOOL, "stops": LIST},
    "anchor_push": {"reason": STR},
}
"""Every event and the fields it always carries (besides kind, event and at)."""
OPTIONAL_FIELDS: Mapping[str, Shape] = {
    "attempt": {"recovered": BOOL}, "pause": {"recovered": BOOL},
    "start": {"reruns": INT, "transport_retries": INT},  # the run rules, for an oracle without the freeze
}
RUN_EVENTS: Final = tuple(EVENT_FIELDS)


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
