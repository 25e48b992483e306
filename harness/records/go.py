"""The go record (GO.jsonl in a preregistration folder): one dated authorization to run a stage.

`proctor prereg go DIR --stage S --by NAME [--note TEXT]` appends one; a stage whose systems
call a paid provider runs only with a go for the freeze it runs under. See docs/prereg.md ("The go").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["GO_KEYS", "Go"]

GO_KEYS: Final = ("go", "at", "stage", "by", "note", "frozen_sha256", "ceiling_usd", "caps_usd")


@dataclass(frozen=True)
class Go:
    """One go: its number, when, which stage, who, an optional note, the freeze and budget it authorizes."""

    number: int
    at: str
    stage: str
    by: str
    note: str | None
    frozen_sha256: str
    """The sha256 of FROZEN.json the go was given under (an amendment needs a new go)."""
    ceiling_usd: float
    caps_usd: dict[str, float]
    """The stage's systems' caps by slot, as shown when the go was given."""
    line_sha256: str = ""
    """The sha256 of its line in the log (empty before it is written)."""

    def to_json(self) -> dict[str, Any]:
        return {"go": self.number, "at": self.at, "stage": self.stage, "by": self.by, "note": self.note,
                "frozen_sha256": self.frozen_sha256, "ceiling_usd": self.ceiling_usd, "caps_usd": dict(self.caps_usd)}
