"""The admission record (`admission.v1`, admission.jsonl): one decision to admit or refuse an item.

Every input of the decision is logged with it: finished spend, reserve, items
under way (this one included), the projection, the cap, an earlier refusal and
the ceiling's state. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code
from harness.records._shape import BOOL, INT, NUM, STR, Fields, Shape, kind_is, object_of, one_of

__all__ = ["ADMISSION_FIELDS", "ADMISSION_KIND", "DECISIONS", "Admission", "CeilingState"]

ADMISSION_KIND: Final = "admission.v1"
DECISIONS: Final = ("admit", "refuse")


@dataclass(frozen=True)
class CeilingState:
    """The ceiling as the decision saw it: the total spend, the ceiling, and whether it is crossed."""

    total_usd: float
    ceiling_usd: float
    crossed: bool

    def to_json(self) -> dict[str, Any]:
        return {"total_usd": self.total_usd, "ceiling_usd": self.ceiling_usd, "crossed": self.crossed}


@dataclass(frozen=True)
class Admission:
    """One `admission.v1` line."""

    system: str
    item: str
    lane: int
    finished_usd: float
    reserve_usd: float
    under_way: int
    projected_usd: float
    cap_usd: float
    refused_before: bool
    ceiling: CeilingState
    decision: str
    reason: str
    at: float

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": ADMISSION_KIND}
        out.update({k: getattr(self, k) for k in ADMISSION_FIELDS if k != "kind"})
        out["ceiling"] = self.ceiling.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> Admission:
        """An admission read strictly (`run_log_invalid`): its kind and every field with its type."""
        values = Fields(obj, line, path, code=Code.RUN_LOG_INVALID).values(ADMISSION_FIELDS)
        values["ceiling"] = CeilingState(**{k: obj["ceiling"][k] for k in _CEILING})
        return cls(**values)


_CEILING: Shape = {"total_usd": NUM, "ceiling_usd": NUM, "crossed": BOOL}
ADMISSION_FIELDS: Shape = {
    "kind": kind_is(ADMISSION_KIND),
    "at": NUM, "system": STR, "item": STR, "lane": INT, "finished_usd": NUM,
    "reserve_usd": NUM, "under_way": INT, "projected_usd": NUM, "cap_usd": NUM, "refused_before": BOOL,
    "ceiling": object_of(_CEILING, "{total_usd, ceiling_usd, crossed}"),
    "decision": one_of(*DECISIONS), "reason": STR,
}
"""Every field of an admission (JSON names, `kind` included) and what it must be."""
