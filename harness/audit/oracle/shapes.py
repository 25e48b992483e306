"""The record shapes the oracle's rules read, taken from `harness.records` (declared there once).

Before any rule reads a record, its declared fields are checked for presence and
type; a record that lacks one is a problem under its log's rule and takes no
further part in the check.

The manual: docs/oracle.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from harness.records._shape import NUM, STR, Shape, shape_error
from harness.records.admission import admission_shape
from harness.records.anchor import ANCHOR_FIELDS
from harness.records.final import FINAL_FIELDS
from harness.records.run_event import EVENT_FIELDS, OPTIONAL_FIELDS, RUN_EVENT_KIND

__all__ = ["EVENT_RULE", "FINAL_SHAPE", "admission_problem", "anchor_problem", "event_problem", "final_problem"]

EVENT_RULE: Final[Mapping[str, str]] = {
    "start": "halted", "attempt": "attempt_logged", "lane": "lane_order", "stop": "halted", "pause": "halted",
    "resume_paused": "halted", "signal": "halted", "ceiling": "ceiling", "late_cost": "late_cost",
    "intent": "intent", "end": "incomplete", "anchor_push": "anchor",
}
"""The rule under which a malformed run event of each kind is reported."""
FINAL_SHAPE: Final[Shape] = {"kind": STR, **FINAL_FIELDS}
"""A final's fields; its kind is any string here (a wrong kind is a `final_link` problem of the rules)."""


def event_problem(e: Mapping[str, Any]) -> tuple[str, str] | None:
    """(rule, what is wrong) for a run event the rules cannot read, else None."""
    event = e.get("event")
    if e.get("kind") != RUN_EVENT_KIND or not isinstance(event, str) or event not in EVENT_FIELDS:
        return "chain", f"kind {e.get('kind')!r}, event {event!r}: not a {RUN_EVENT_KIND} event"
    optional = {k: v for k, v in OPTIONAL_FIELDS.get(event, {}).items() if k in e}
    bad = shape_error(e, {"at": NUM, **EVENT_FIELDS[event], **optional})
    return None if bad is None else (EVENT_RULE[event], f"{event} event: {bad}")


def admission_problem(a: Mapping[str, Any]) -> tuple[str, str] | None:
    bad = shape_error(a, admission_shape(a))
    return None if bad is None else ("admission_rule", bad)


def final_problem(f: Mapping[str, Any]) -> tuple[str, str] | None:
    bad = shape_error(f, FINAL_SHAPE)
    return None if bad is None else ("final_link", bad)


def anchor_problem(a: Mapping[str, Any]) -> tuple[str, str] | None:
    bad = shape_error(a, ANCHOR_FIELDS)
    return None if bad is None else ("anchor", bad)
