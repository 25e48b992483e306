"""Host samples for `host.jsonl`: load, memory, pressure (where the kernel has it) and disk.

Each sampler reads /proc or statvfs and never raises: a source that cannot be
read is null in the sample with its error listed. A sample is a failure when
load, memory and disk all failed; the runner stops with cause `sampler` when
samples have failed for `SAMPLER_FAIL_S` seconds.

The manual: docs/running.md.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

from harness.records.host import HostSample

__all__ = ["SAMPLER_FAIL_S", "SAMPLE_EVERY_S", "host_sample", "sample_failed"]

SAMPLE_EVERY_S: Final = 30.0
SAMPLER_FAIL_S: Final = 300.0


def _meminfo() -> dict[str, int]:
    with open("/proc/meminfo", encoding="ascii") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    def kib(name: str) -> int:
        return int(fields[name].split()[0]) * 1024
    return {"total_bytes": kib("MemTotal"), "available_bytes": kib("MemAvailable")}


def _pressure() -> dict[str, str] | None:
    out: dict[str, str] = {}
    for name in ("cpu", "memory", "io"):
        try:
            with open(f"/proc/pressure/{name}", encoding="ascii") as fh:
                out[name] = fh.read().strip()
        except OSError:
            continue
    return out or None


def host_sample(at: float, reason: str, disk_path: str, node: str | None = None) -> dict[str, Any]:
    """One `host-sample.v1` record (without chain fields), taken now; the disk is `disk_path`'s (the stage
    folder, or a node's temporary folder), recorded as "." so that the record names no folder of the
    machine; `node`: the Ray node it was taken on (None: this host)."""
    errors: list[str] = []
    wall, monotonic = time.time(), time.monotonic()
    load: list[float] | None
    try:
        load = list(os.getloadavg())
    except OSError as exc:
        load = None
        errors.append(f"load: {exc}")
    memory: dict[str, int] | None
    try:
        memory = _meminfo()
    except (OSError, KeyError, ValueError, IndexError) as exc:
        memory = None
        errors.append(f"memory: {exc!r}")
    pressure = _pressure()
    disk: dict[str, Any] | None
    try:
        st = os.statvfs(disk_path)
        disk = {"path": ".", "total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}
    except OSError as exc:
        disk = None
        errors.append(f"disk: {exc.strerror or type(exc).__name__}")
    return HostSample(at, wall, monotonic, reason, load, memory, pressure, disk, errors, node).to_json()


def sample_failed(record: dict[str, Any]) -> bool:
    """A sample that measured nothing (load, memory and disk all failed)."""
    return record["load"] is None and record["memory"] is None and record["disk"] is None
