"""The final of a run (`run-final.v1`, finals.jsonl): how one run of a cell ended and what it asks for.

One line when a run (cell x rerun) ends; the cell's latest final decides what
happens next (`action`). `replaced` lists every earlier final of the cell, oldest
first, with its archived byte copy. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    LIST,
    OPT_BOOL,
    Fields,
    Key,
    Shape,
    build,
    shape_error,
    shape_of,
    write,
)

__all__ = ["ACTIONS", "CLASSES", "FINAL_FIELDS", "FINAL_KIND", "REPLACED_FIELDS", "Replaced", "RunFinal"]

FINAL_KIND: Final = "run-final.v1"
CLASSES: Final = ("delivered", "provider", "operator", "harness", "inconclusive", "model", "ceiling")
ACTIONS: Final = ("stand", "rerun", "pause", "stop")


@dataclass(frozen=True)
class Replaced:
    """An earlier final of the cell: its rerun, its archive (path and sha256) and its attempt's sha256."""

    rerun: int
    archive: str
    sha256: str
    attempt_sha256: str

    def to_json(self) -> dict[str, Any]:
        return write(self)


@dataclass(frozen=True)
class RunFinal:
    """One `run-final.v1` line. `cls` is written as `class`; `passed`, `receipt*` only when delivered.

    `replaced` is checked as a list here, each entry against `Replaced` by `from_json` (the oracle
    checks the list only)."""

    at: float
    run_id: str
    system: str
    item: str
    arm: str
    repeat: int
    rerun: int
    cls: Annotated[str, Key("class")]
    action: str
    error_code: str | None
    attempt: int
    attempt_line: int
    attempt_sha256: str
    passed: Annotated[bool | None, OPT_BOOL]
    receipt: str | None
    receipt_sha256: str | None
    replaced: Annotated[tuple[Replaced, ...], LIST]

    def to_json(self) -> dict[str, Any]:
        return {"kind": FINAL_KIND, **write(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> RunFinal:
        """A final read strictly (`run_final_invalid`): its kind, then every field with its type."""
        f = Fields(obj, line, path, code=Code.RUN_FINAL_INVALID)
        if obj.get("kind") != FINAL_KIND:
            raise f.bad(f"kind must be {FINAL_KIND}")
        f.shape(FINAL_FIELDS)
        for entry in obj["replaced"]:
            bad = shape_error(entry, REPLACED_FIELDS)
            if bad is not None:
                raise f.bad(f"replaced: {bad}")
        return build(cls, obj)


FINAL_FIELDS: Final[Shape] = shape_of(RunFinal)
"""Every field of a final (JSON names) and what it must be, from `RunFinal`: what every reader checks."""
REPLACED_FIELDS: Final[Shape] = shape_of(Replaced)
