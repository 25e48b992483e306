"""The admission record (`admission.v1`, admission.jsonl): one decision to admit or refuse an item.

Every input of the decision is logged with it: finished spend, reserve, attempts
under way (this one included; items under way in logs written before issue 13, which
lack the attempt's `run_id`, `rerun` and `attempt`), the projection, the cap, an
earlier refusal and the ceiling's state. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    Fields,
    Shape,
    build,
    kind_is,
    one_of,
    optional_keys,
    shape_of,
    write,
)

__all__ = ["ADMISSION_FIELDS", "ADMISSION_KIND", "ADMISSION_OPTIONAL", "DECISIONS", "Admission", "CeilingState",
           "admission_shape"]

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
    # the attempt the decision is for (admission per attempt, issue 13); absent from logs written before
    run_id: str | None = None
    rerun: int | None = None
    attempt: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": ADMISSION_KIND, **write(self, omit_none=frozenset({"run_id", "rerun", "attempt"}))}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> Admission:
        """An admission read strictly (`run_log_invalid`): its kind and every field with its type."""
        Fields(obj, line, path, code=Code.RUN_LOG_INVALID).shape(admission_shape(obj))
        return build(cls, obj)


ADMISSION_FIELDS: Final[Shape] = {"kind": kind_is(ADMISSION_KIND),
                                  **{k: f for k, f in shape_of(Admission).items() if k not in optional_keys(Admission)}}
"""Every field an admission always carries (JSON names, `kind` included) and what it must be, from `Admission`."""
ADMISSION_OPTIONAL: Final[Shape] = {k: f for k, f in shape_of(Admission).items() if k in optional_keys(Admission)}
"""The fields naming the attempt admitted (`run_id`, `rerun`, `attempt`): checked when present."""


def admission_shape(obj: Mapping[str, Any]) -> Shape:
    """The shape `obj` must have: every always-carried field, and the attempt's three when it names any."""
    return {**ADMISSION_FIELDS, **(ADMISSION_OPTIONAL if any(k in obj for k in ADMISSION_OPTIONAL) else {})}
