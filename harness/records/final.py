"""The final of a run (`run-final.v1`, finals.jsonl): how one run of a cell ended and what it asks for.

One line when a run (cell x rerun) ends; the cell's latest final decides what
happens next (`action`). `replaced` lists every earlier final of the cell, oldest
first, with its archived byte copy. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from harness.errors import Code
from harness.records._shape import (
    CHAIN_KEYS,
    INT,
    LIST,
    NUM,
    OPT_BOOL,
    OPT_STR,
    STR,
    Fields,
    Shape,
    shape_error,
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
        return {f.name: getattr(self, f.name) for f in fields(self)}


REPLACED_FIELDS: Shape = {"rerun": INT, "archive": STR, "sha256": STR, "attempt_sha256": STR}


@dataclass(frozen=True)
class RunFinal:
    """One `run-final.v1` line. `cls` is written as `class`; `passed`, `receipt*` only when delivered."""

    run_id: str
    system: str
    item: str
    arm: str
    repeat: int
    rerun: int
    cls: str
    action: str
    error_code: str | None
    attempt: int
    attempt_line: int
    attempt_sha256: str
    passed: bool | None
    receipt: str | None
    receipt_sha256: str | None
    replaced: tuple[Replaced, ...]
    at: float

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": FINAL_KIND}
        for f in fields(self):
            out[_json_name(f.name)] = getattr(self, f.name)
        out["replaced"] = [r.to_json() for r in self.replaced]
        return out

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
        values = {_attr_name(k): v for k, v in obj.items() if k not in CHAIN_KEYS and k != "kind"}
        values["replaced"] = tuple(Replaced(**{k: e[k] for k in REPLACED_FIELDS}) for e in obj["replaced"])
        return cls(**{k: values[k] for k in _ATTRS})


def _json_name(attr: str) -> str:
    return "class" if attr == "cls" else attr


def _attr_name(key: str) -> str:
    return "cls" if key == "class" else key


FINAL_FIELDS: Shape = {
    "at": NUM, "run_id": STR, "system": STR, "item": STR, "arm": STR, "repeat": INT,
    "rerun": INT, "class": STR, "action": STR, "error_code": OPT_STR, "attempt": INT, "attempt_line": INT,
    "attempt_sha256": STR, "passed": OPT_BOOL, "receipt": OPT_STR, "receipt_sha256": OPT_STR, "replaced": LIST,
}
"""Every field of a final (JSON names) and what it must be: the one declaration readers check."""
_ATTRS: Final = tuple(f.name for f in fields(RunFinal))
assert {_json_name(a) for a in _ATTRS} == set(FINAL_FIELDS), "RunFinal and FINAL_FIELDS must name the same fields"
