"""Resource limits for a worker or verifier: pids, memory, file size and the sandbox's /tmp.

The manual: docs/sandbox.md ("Resource limits"). A cgroup is used where one can be
made here (v2, or v1's pids and memory controllers); rlimits otherwise. The record
says which mechanism bound what.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, WorkerRefusal

__all__ = ["LIMIT_ENV", "Confinement", "Limits", "confined", "limits_record", "mechanisms", "resolve_limits"]

_MIB: Final = 1 << 20
LIMIT_ENV: Final = {
    "pids": "PROCTOR_LIMIT_PIDS",
    "memory_bytes": "PROCTOR_LIMIT_MEMORY_MB",
    "file_bytes": "PROCTOR_LIMIT_FILE_MB",
    "tmp_bytes": "PROCTOR_LIMIT_TMP_MB",
}
"""The environment variables that override each limit (pids as a count, the rest in MiB)."""
_CGROUP_ROOT: Final = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Limits:
    """What one run may use: processes, memory, the size of any one file it writes, its /tmp."""

    pids: int = 1024
    memory_bytes: int = 8192 * _MIB
    file_bytes: int = 1024 * _MIB
    tmp_bytes: int = 1024 * _MIB


def resolve_limits() -> Limits:
    """The defaults, each overridden by its `PROCTOR_LIMIT_*` variable (a positive whole number)."""
    values: dict[str, int] = {}
    for name, var in LIMIT_ENV.items():
        raw = os.environ.get(var)
        if raw is None or raw == "":
            continue
        if not raw.isdigit() or int(raw) <= 0:
            raise WorkerRefusal(Code.SANDBOX_INVALID, f"{var}={raw!r} is not a positive whole number")
        values[name] = int(raw) if name == "pids" else int(raw) * _MIB
    return Limits(**values)


def _own_cgroup(controller: str) -> str | None:
    """Our cgroup's folder for `controller` (v1), or for the unified hierarchy (controller "")."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if (controller == "" and parts[0] == "0" and parts[1] == "") or controller in parts[1].split(","):
            base = os.path.join(_CGROUP_ROOT, controller) if controller else _CGROUP_ROOT
            return os.path.join(base, parts[2].lstrip("/"))
    return None


def _make_group(parent: str | None, settings: dict[str, int]) -> str | None:
    """A new cgroup under `parent` with `settings` written, or None where that cannot be done."""
    if parent is None or not os.path.isdir(parent):
        return None
    path = os.path.join(parent, f"proctor-{secrets.token_hex(6)}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    try:
        for name, value in settings.items():
            with open(os.path.join(path, name), "w", encoding="ascii") as fh:
                fh.write(str(value))
    except OSError:
        _remove_group(path)
        return None
    return path


def _remove_group(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


@dataclass(frozen=True)
class Confinement:
    """The limits of one run as applied: a `preexec` for the child and the record of what bound what."""

    limits: Limits
    groups: tuple[str, ...] = ()
    rlimits: tuple[tuple[int, int], ...] = ()
    procs_fds: tuple[int, ...] = ()

    def preexec(self) -> None:
        """Run in the child before exec: join the cgroups, set the rlimits (async-signal-safe calls only)."""
        for fd in self.procs_fds:
            os.write(fd, b"0")
        for which, value in self.rlimits:
            resource.setrlimit(which, (value, value))


@functools.lru_cache(maxsize=1)
def _usable_parents() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """(mechanism, parent folder, limits it sets) for each cgroup a child can be made under here."""
    found: list[tuple[str, str, tuple[str, ...]]] = []
    candidates: list[tuple[str, str | None, tuple[str, ...]]] = [("cgroup v2", _own_cgroup(""), ("pids", "memory_bytes"))]
    candidates += [("cgroup v1", _own_cgroup("pids"), ("pids",)), ("cgroup v1", _own_cgroup("memory"), ("memory_bytes",))]
    for how, parent, sets in candidates:
        files = {"pids": "pids.max", "memory_bytes": "memory.max" if how == "cgroup v2" else "memory.limit_in_bytes"}
        probe = _make_group(parent, {})
        if probe is None or parent is None:
            continue
        ok = all(os.path.exists(os.path.join(probe, files[s])) for s in sets)
        _remove_group(probe)
        if ok:
            found.append((how, parent, sets))
            if how == "cgroup v2":
                break
    return tuple(found)


def mechanisms() -> dict[str, str]:
    """How each limit is enforced on this host: a cgroup where one can be made, else an rlimit."""
    by = {"file_bytes": "rlimit RLIMIT_FSIZE"}
    for how, _parent, sets in _usable_parents():
        for name in sets:
            by.setdefault(name, how)
    if "pids" not in by:
        by["pids"] = "rlimit RLIMIT_NPROC" + (" (not enforced for root: no cgroup here)" if os.geteuid() == 0 else "")
    by.setdefault("memory_bytes", "rlimit RLIMIT_AS (per process)")
    return by


def limits_record(limits: Limits, *, tmp_by: str | None) -> dict[str, Any]:
    """`limits` of a sandbox record: each limit and the mechanism that enforces it."""
    by = mechanisms()
    by["tmp_bytes"] = tmp_by or "none: the proctor's own /tmp (--sandbox none)"
    return {
        "pids": limits.pids,
        "memory_bytes": limits.memory_bytes,
        "file_bytes": limits.file_bytes,
        "tmp_bytes": limits.tmp_bytes,
        "by": by,
    }


@contextlib.contextmanager
def confined(limits: Limits) -> Iterator[Confinement]:
    """Make the cgroups `mechanisms()` names for `limits`; the rest as rlimits. Removes the cgroups after."""
    groups: list[str] = []
    fds: list[int] = []
    by = mechanisms()
    rlimits: list[tuple[int, int]] = [(resource.RLIMIT_FSIZE, limits.file_bytes)]
    if by["pids"].startswith("rlimit"):
        rlimits.append((resource.RLIMIT_NPROC, limits.pids))
    if by["memory_bytes"].startswith("rlimit"):
        rlimits.append((resource.RLIMIT_AS, limits.memory_bytes))
    try:
        for how, parent, sets in _usable_parents():
            settings = {}
            if "pids" in sets:
                settings["pids.max"] = limits.pids
            if "memory_bytes" in sets:
                settings["memory.max" if how == "cgroup v2" else "memory.limit_in_bytes"] = limits.memory_bytes
            group = _make_group(parent, settings)
            if group is None:
                raise WorkerRefusal(Code.SANDBOX_UNAVAILABLE, f"cannot make a {how} for the run's limits", parent)
            groups.append(group)
            fds.append(os.open(os.path.join(group, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        yield Confinement(limits, tuple(groups), rlimits=tuple(rlimits), procs_fds=tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)
        for group in groups:
            _remove_group(group)
