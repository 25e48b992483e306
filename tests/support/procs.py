"""Processes on the host: which are still alive (a test's leak check)."""

from __future__ import annotations

import os
from pathlib import Path


def alive_with(token: str) -> list[int]:
    """Live (non-zombie) processes on the host whose command line holds `token`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and stat[stat.rfind(b")") + 2 :].split()[0] != b"Z":
            found.append(int(name))
    return found


def alive_running(argv: list[str]) -> list[int]:
    """Live (non-zombie) processes on the host whose command line is exactly `argv`: the program itself
    running, not a parent or wrapper that only names it among its arguments."""
    want = b"".join(a.encode() + b"\0" for a in argv)
    return [pid for pid in alive_with(argv[-1]) if _cmdline(pid) == want]


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def running(pid: int) -> bool:
    """Whether `pid` is a live (non-zombie) process now."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def descendants_with(root: int, token: str) -> dict[int, int]:
    """Live processes under `root` (children, their children, ...) whose command line holds `token`:
    pid -> parent pid."""
    parents: dict[int, int] = {}
    lines: dict[int, bytes] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if fields is None or fields[0] == b"Z":
            continue
        parents[int(name)] = int(fields[1])
        lines[int(name)] = cmdline
    found = {}
    for pid, cmdline in lines.items():
        if token.encode() not in cmdline:
            continue
        up, hops = parents.get(pid), 0
        while up is not None and up != root and up > 1 and hops < 64:
            up, hops = parents.get(up), hops + 1
        if up == root:
            found[pid] = parents[pid]
    return found
