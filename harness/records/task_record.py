"""A row of the task record (`proctor-task-record.v1`): what ran, what passed, what it cost.

`proctor record` appends one per call to the chained `task-record.jsonl`;
`metering` says how cost was measured (`wire`, `flat_rate`, `none`) and
which of the optional fields a row has. `to_json` gives today's keys in
today's order; `from_json` reads a row back strictly (chain fields aside).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from harness.records._typed import Fields

__all__ = ["RECORD_SCHEMA", "TaskRecord", "WireMetering"]

RECORD_SCHEMA: Final = "proctor-task-record.v1"
_BASE: Final = ("schema", "task_id", "task_sha256", "lane", "initial_lane", "lane_switches", "dispatches", "receipt",
                "accept", "metering", "wire_source", "tokens", "cost", "known_cost", "cost_status", "usage_unknown",
                "price_unknown")  # fmt: skip
_WIRE: Final = ("wire_logs", "pricing", "exchanges", "errors_unbilled", "not_metered", "by_model")
_CHAIN: Final = ("prev", "seed")


@dataclass(frozen=True)
class WireMetering:
    """What a row metered from wire logs: the logs checked, the pricing, exchange counts, cost by model."""

    wire_logs: tuple[dict[str, Any], ...]
    pricing: dict[str, Any]
    exchanges: int
    errors_unbilled: int
    not_metered: int
    by_model: dict[str, Any]


@dataclass(frozen=True)
class TaskRecord:
    """One row of the task record."""

    task_id: str
    task_sha256: str
    lane: str
    initial_lane: str
    lane_switches: tuple[dict[str, Any], ...]
    dispatches: dict[str, Any]
    receipt: dict[str, Any] | None
    accept: dict[str, Any]
    metering: str
    wire_source: str | None
    tokens: dict[str, Any] | None
    cost: float | None
    known_cost: float | None
    cost_status: str
    usage_unknown: int
    price_unknown: int
    wire: WireMetering | None = None
    note: str | None = None
    unmetered_dispatch_ids: tuple[str, ...] | None = None

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
        return out

    @classmethod
    def from_json(cls, obj: object, path: str | None = None) -> TaskRecord:
        """Read a row strictly (its chain fields `prev` and `seed` aside); `log_record_invalid` otherwise."""
        f = Fields(obj, "log_record_invalid", path, "task record row")
        if f.obj.get("schema") != RECORD_SCHEMA:
            raise f.bad("schema", RECORD_SCHEMA)
        kind = f.text("metering")
        wired = kind == "wire"
        f.keys(_BASE + (_WIRE if wired else ()), ("note", "unmetered_dispatch_ids", *_CHAIN))
        ids = f.obj.get("unmetered_dispatch_ids")
        switches = f.obj.get("lane_switches")
        if not isinstance(switches, list) or not all(isinstance(s, dict) for s in switches):
            raise f.bad("lane_switches", "a list of objects")
        wire = None
        if wired:
            logs = f.obj.get("wire_logs")
            if not isinstance(logs, list) or not all(isinstance(s, dict) for s in logs):
                raise f.bad("wire_logs", "a list of objects")
            wire = WireMetering(tuple(logs), f.object("pricing"), f.integer("exchanges"), f.integer("errors_unbilled"),
                                f.integer("not_metered"), f.object("by_model"))  # fmt: skip
        return cls(
            task_id=f.text("task_id"),
            task_sha256=f.text("task_sha256"),
            lane=f.text("lane"),
            initial_lane=f.text("initial_lane"),
            lane_switches=tuple(switches),
            dispatches=f.object("dispatches"),
            receipt=f.obj_or_none("receipt"),
            accept=f.object("accept"),
            metering=kind,
            wire_source=f.opt_text("wire_source"),
            tokens=f.obj_or_none("tokens"),
            cost=f.opt_number("cost"),
            known_cost=f.opt_number("known_cost"),
            cost_status=f.text("cost_status"),
            usage_unknown=f.integer("usage_unknown"),
            price_unknown=f.integer("price_unknown"),
            wire=wire,
            note=f.opt_text("note"),
            unmetered_dispatch_ids=None if ids is None else f.texts("unmetered_dispatch_ids"),
        )
