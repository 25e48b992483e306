"""A row of the task record (`proctor-task-record.v1`): what ran, what passed, what it cost.

`proctor record` appends one per call to the chained `task-record.jsonl`;
`metering` says how cost was measured (`wire`, `flat_rate`, `none`) and
which of the optional fields a row has. `to_json` gives today's keys in
today's order; `from_json` reads a row back strictly (chain fields aside).

The manual: docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    CHAIN_KEYS,
    STR,
    Field,
    Fields,
    Shape,
    build,
    is_num,
    kind_is,
    one_of,
    optional_keys,
    shape_of,
)

__all__ = ["RECORD_SCHEMA", "TaskRecord", "WireMetering"]

RECORD_SCHEMA: Final = "proctor-task-record.v1"
METERINGS: Final = ("wire", "flat_rate", "none")

_OBJECTS: Final = Field("a list of objects", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v))
_OPT_NUM: Final = Field("a number or null", lambda v: v is None or is_num(v))
_OPT_INT: Final = Field("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_TEXTS: Final = Field("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))


@dataclass(frozen=True)
class WireMetering:
    """What a row metered from wire logs: the logs checked, the pricing, exchange counts, cost by model."""

    wire_logs: Annotated[tuple[dict[str, Any], ...], _OBJECTS]
    pricing: dict[str, Any]
    exchanges: int
    errors_unbilled: int
    not_metered: int
    by_model: dict[str, Any]


@dataclass(frozen=True)
class TaskRecord:
    """One row of the task record; `wire` (spread into the row), `note`, `unmetered_dispatch_ids` and the
    journal mark (`journal_lines`, `journal_head`) only when set."""

    task_id: str
    task_sha256: str
    lane: str
    initial_lane: str
    lane_switches: Annotated[tuple[dict[str, Any], ...], _OBJECTS]
    dispatches: dict[str, Any]
    receipt: dict[str, Any] | None
    accept: dict[str, Any]
    metering: Annotated[str, one_of(*METERINGS)]
    wire_source: str | None
    tokens: dict[str, Any] | None
    cost: Annotated[float | None, _OPT_NUM]
    known_cost: Annotated[float | None, _OPT_NUM]
    cost_status: str
    usage_unknown: int
    price_unknown: int
    wire: WireMetering | None = None
    note: Annotated[str | None, STR] = None
    unmetered_dispatch_ids: Annotated[tuple[str, ...] | None, _TEXTS] = None
    journal_lines: Annotated[int | None, _OPT_INT] = None
    """The journal's line count when the row was written (absent in older rows)."""
    journal_head: Annotated[str | None, STR] = None
    """The sha256 of the journal's last line then: `record` and accept notice a shortened or rewritten journal."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": RECORD_SCHEMA,
            "task_id": self.task_id,
            "task_sha256": self.task_sha256,
            "lane": self.lane,
            "initial_lane": self.initial_lane,
            "lane_switches": list(self.lane_switches),
            "dispatches": self.dispatches,
            "receipt": self.receipt,
            "accept": self.accept,
            "metering": self.metering,
            "wire_source": self.wire_source,
        }
        if self.wire is not None:
            out.update(wire_logs=list(self.wire.wire_logs), pricing=self.wire.pricing, exchanges=self.wire.exchanges,
                       errors_unbilled=self.wire.errors_unbilled, not_metered=self.wire.not_metered)  # fmt: skip
        if self.note is not None:
            out["note"] = self.note
        out.update(tokens=self.tokens, cost=self.cost, known_cost=self.known_cost, cost_status=self.cost_status,
                   usage_unknown=self.usage_unknown, price_unknown=self.price_unknown)  # fmt: skip
        if self.wire is not None:
            out["by_model"] = self.wire.by_model
        if self.unmetered_dispatch_ids is not None:
            out["unmetered_dispatch_ids"] = list(self.unmetered_dispatch_ids)
        if self.journal_lines is not None:
            out["journal_lines"] = self.journal_lines
        if self.journal_head is not None:
            out["journal_head"] = self.journal_head
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], path: str | None = None) -> TaskRecord:
        """Read a row strictly (its chain fields `prev` and `seed` aside); `log_record_invalid` otherwise."""
        checked = Fields(obj, None, path, Code.LOG_RECORD_INVALID)
        checked.shape({k: _ROW[k] for k in ("schema", "metering")})
        wired = obj["metering"] == "wire"
        shape = {**_ROW, **(_WIRE if wired else {})}
        extra = frozenset(obj) & _OPTIONAL
        checked.keys(frozenset(shape), ignore=CHAIN_KEYS | extra)
        checked.shape({**shape, **{k: v for k, v in _OPTIONAL_SHAPE.items() if k in extra}})
        return build(cls, {**obj, "wire": {k: obj[k] for k in _WIRE} if wired else None})


_ROW: Final[Shape] = {
    "schema": kind_is(RECORD_SCHEMA),
    **{k: f for k, f in shape_of(TaskRecord).items() if k not in optional_keys(TaskRecord)},
}
"""The fields of every row (JSON names) and what each must be."""
_WIRE: Final[Shape] = shape_of(WireMetering)
"""The fields a `wire` row adds."""
_OPTIONAL_SHAPE: Final[Shape] = {
    k: f for k, f in shape_of(TaskRecord).items() if k in optional_keys(TaskRecord) - {"wire"}
}
"""The fields a row may carry (`note`, `unmetered_dispatch_ids`), checked when present."""
_OPTIONAL: Final = frozenset(_OPTIONAL_SHAPE)
