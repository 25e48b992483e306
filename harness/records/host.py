"""The host sample (`host-sample.v1`, host.jsonl): load, memory, pressure and disk, as measured.

A source that could not be read is null, with its error in `errors`. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["HOST_KIND", "HostSample"]

HOST_KIND: Final = "host-sample.v1"


@dataclass(frozen=True)
class HostSample:
    """One sample: `at` (run clock), `wall` (time.time()), `monotonic`, and what was measured."""

    at: float
    wall: float
    monotonic: float
    reason: str
    load: Sequence[float] | None
    memory: Mapping[str, int] | None
    pressure: Mapping[str, str] | None
    disk: Mapping[str, Any] | None
    errors: Sequence[str]

    @property
    def failed(self) -> bool:
        """A sample that measured nothing (load, memory and disk all failed)."""
        return self.load is None and self.memory is None and self.disk is None

    def to_json(self) -> dict[str, Any]:
        return {"kind": HOST_KIND, "at": self.at, "wall": self.wall, "monotonic": self.monotonic,
                "reason": self.reason, "load": None if self.load is None else list(self.load),
                "memory": None if self.memory is None else dict(self.memory),
                "pressure": None if self.pressure is None else dict(self.pressure),
                "disk": None if self.disk is None else dict(self.disk), "errors": list(self.errors)}
