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
