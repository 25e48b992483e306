"""The host sample (`host-sample.v1`, host.jsonl): load, memory, pressure and disk, as measured.

A source that could not be read is null, with its error in `errors`. See docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import (
    NUM,
    Field,
    Fields,
    Shape,
    build,
    is_int,
    kind_is,
    shape_of,
    write,
)

__all__ = ["HOST_FIELDS", "HOST_KIND", "HostSample"]

HOST_KIND: Final = "host-sample.v1"


def _nullable(what: str, ok: Any) -> Field:
    return Field(f"{what} or null", lambda v: v is None or ok(v))


_LOAD: Final = _nullable("a list of 3 numbers",
                         lambda v: isinstance(v, list) and len(v) == 3 and all(NUM.ok(x) for x in v))
_MEMORY: Final = _nullable("{total_bytes, available_bytes}", lambda v: isinstance(v, dict)
                           and set(v) == {"total_bytes", "available_bytes"} and all(is_int(x) for x in v.values()))
_PRESSURE: Final = _nullable("an object of PSI lines",
                             lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))
_DISK: Final = _nullable("{path, total_bytes, free_bytes}",
                         lambda v: isinstance(v, dict) and set(v) == {"path", "total_bytes", "free_bytes"})
_TEXTS: Final = Field("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))


@dataclass(frozen=True)
class HostSample:
    """One sample: `at` (run clock), `wall` (time.time()), `monotonic`, and what was measured."""

    at: float
    wall: float
    monotonic: float
    reason: str
    load: Annotated[Sequence[float] | None, _LOAD]
    memory: Annotated[Mapping[str, int] | None, _MEMORY]
    pressure: Annotated[Mapping[str, str] | None, _PRESSURE]
    disk: Annotated[Mapping[str, Any] | None, _DISK]
    errors: Annotated[Sequence[str], _TEXTS]
    node: str | None = None
    """The Ray node sampled (the ray engine's nodes, docs/ray.md); absent: the driver's own host."""

    @property
    def failed(self) -> bool:
        """A sample that measured nothing (load, memory and disk all failed)."""
        return self.load is None and self.memory is None and self.disk is None

    def to_json(self) -> dict[str, Any]:
        return {"kind": HOST_KIND, **write(self, omit_none=frozenset({"node"}))}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str | None, line: int | None) -> HostSample:
        """A sample read strictly (`run_log_invalid`): its kind and every field with its type."""
        f = Fields(obj, line, path, code=Code.RUN_LOG_INVALID)
        f.shape({k: v for k, v in HOST_FIELDS.items() if k != "node" or k in obj})  # `node`: a node's sample only
        return build(cls, obj)


HOST_FIELDS: Final[Shape] = {"kind": kind_is(HOST_KIND), **shape_of(HostSample)}
"""Every field of a host sample (JSON names, `kind` included) and what it must be, from `HostSample`."""
