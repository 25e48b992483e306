"""The host sample (`host-sample.v1`, host.jsonl): load, memory, pressure and disk, as measured.

A source that could not be read is null, with its error in `errors`. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code
from harness.records._shape import NUM, STR, Field, Fields, Shape, is_int, kind_is

__all__ = ["HOST_FIELDS", "HOST_KIND", "HostSample"]

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

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> HostSample:
        """A sample read strictly (`run_log_invalid`): its kind and every field with its type."""
        return cls(**Fields(obj, line, path, code=Code.RUN_LOG_INVALID).values(HOST_FIELDS))


def _nullable(what: str, ok: Any) -> Field:
    return Field(f"{what} or null", lambda v: v is None or ok(v))


HOST_FIELDS: Shape = {
    "kind": kind_is(HOST_KIND), "at": NUM, "wall": NUM, "monotonic": NUM, "reason": STR,
    "load": _nullable("a list of 3 numbers", lambda v: isinstance(v, list) and len(v) == 3
                      and all(NUM.ok(x) for x in v)),
    "memory": _nullable("{total_bytes, available_bytes}", lambda v: isinstance(v, dict)
                        and set(v) == {"total_bytes", "available_bytes"} and all(is_int(x) for x in v.values())),
    "pressure": _nullable("an object of PSI lines", lambda v: isinstance(v, dict)
                          and all(isinstance(x, str) for x in v.values())),
    "disk": _nullable("{path, total_bytes, free_bytes}", lambda v: isinstance(v, dict)
                      and set(v) == {"path", "total_bytes", "free_bytes"}),
    "errors": Field("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
}
"""Every field of a host sample (JSON names, `kind` included) and what it must be."""
