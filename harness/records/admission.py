"""The admission record (`admission.v1`, admission.jsonl): one decision to admit or refuse an item.

Every input of the decision is logged with it: finished spend, reserve, items
under way (this one included), the projection, the cap, an earlier refusal and
the ceiling's state. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import Fields, Shape, build, kind_is, one_of, shape_of, write

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
        return write(self)


@dataclass(frozen=True)
class Admission:
    """One `admission.v1` line."""

    at: float
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
    decision: Annotated[str, one_of(*DECISIONS)]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": ADMISSION_KIND, **write(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> Admission:
        """An admission read strictly (`run_log_invalid`): its kind and every field with its type."""
        Fields(obj, line, path, code=Code.RUN_LOG_INVALID).shape(ADMISSION_FIELDS)
        return build(cls, obj)


ADMISSION_FIELDS: Final[Shape] = {"kind": kind_is(ADMISSION_KIND), **shape_of(Admission)}
"""Every field of an admission (JSON names, `kind` included) and what it must be, from `Admission`."""
