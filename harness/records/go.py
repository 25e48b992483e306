"""The go record (`go.v1`, GO.jsonl in a preregistration folder): one dated authorization to run a stage.

`proctor prereg go DIR --stage S --by NAME [--note TEXT]` appends one; a stage whose systems
call a paid provider runs only with a go for the freeze it runs under. See docs/prereg.md ("The go").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    CHAIN_KEYS,
    NUM,
    Fields,
    Key,
    Shape,
    build,
    kind_is,
    shape_of,
    values_of,
    write,
)

__all__ = ["GO_FIELDS", "GO_KIND", "Go"]

GO_KIND: Final = "go.v1"


@dataclass(frozen=True)
class Go:
    """One `go.v1` line: its number, when, which stage, who, an optional note, the freeze and budget it authorizes."""

    number: Annotated[int, Key("go")]
    at: str
    stage: str
    by: str
    note: str | None
    frozen_sha256: str
    """The sha256 of FROZEN.json the go was given under (an amendment needs a new go)."""
    ceiling_usd: float
    caps_usd: Annotated[Mapping[str, float], values_of(NUM, "an object of numbers")]
    """The stage's systems' caps by slot, as shown when the go was given."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": GO_KIND, **write(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> Go:
        """A go read strictly (`go_invalid`): its kind and exactly its fields, each of its type."""
        checked = Fields(obj, line, path, code=Code.GO_INVALID)
        checked.keys(frozenset(GO_FIELDS), ignore=CHAIN_KEYS)
        checked.shape(GO_FIELDS)
        return build(cls, {**obj, "ceiling_usd": float(obj["ceiling_usd"]),
                           "caps_usd": {k: float(v) for k, v in obj["caps_usd"].items()}})


GO_FIELDS: Final[Shape] = {"kind": kind_is(GO_KIND), **shape_of(Go)}
"""Every field of a go (JSON names, `kind` included) and what it must be, from `Go`."""
