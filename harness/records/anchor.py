"""The anchor record (`anchor.v1`, anchors.jsonl): every chained log's line count and head, every manifest's sha256.

A log with a problem is anchored with its intact lines and `problem`; an absent
log or manifest as absent (lines 0 / head null, sha256 null). See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    INT,
    OPT_STR,
    Fields,
    Shape,
    build,
    kind_is,
    shape_of,
    values_of,
    write,
)

__all__ = ["ANCHOR_FIELDS", "ANCHOR_KIND", "Anchor"]

ANCHOR_KIND: Final = "anchor.v1"


@dataclass(frozen=True)
class Anchor:
    """One `anchor.v1` line: `logs` maps a log name to {lines, head[, problem]}, `manifests` a name to a sha256."""

    at: float
    reason: str
    logs: Annotated[Mapping[str, Mapping[str, Any]],
                    values_of({"lines": INT, "head": OPT_STR}, "an object of {lines, head}")]
    manifests: Annotated[Mapping[str, str | None], values_of(OPT_STR, "an object of sha256 strings or null")]

    def to_json(self) -> dict[str, Any]:
        return {"kind": ANCHOR_KIND, **write(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> Anchor:
        """An anchor read strictly (`run_log_invalid`): its kind and every field with its type."""
        Fields(obj, line, path, code=Code.RUN_LOG_INVALID).shape(ANCHOR_FIELDS)
        return build(cls, {**obj, "at": float(obj["at"])})


ANCHOR_FIELDS: Final[Shape] = {"kind": kind_is(ANCHOR_KIND), **shape_of(Anchor)}
"""Every field of an anchor (JSON names, `kind` included) and what it must be, from `Anchor`."""
