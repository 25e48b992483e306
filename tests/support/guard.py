"""A socket guard for a child Python: every connection is refused and logged (the no-network tests)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

GUARD = """
import os, socket
def _refuse(*args, **kwargs):
    with open(os.environ["GUARD_LOG"], "a", encoding="utf-8") as fh:
        fh.write(repr(args[:2]) + "\\n")
    raise OSError("network disabled by the test's socket guard")
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
"""
"""The child's `sitecustomize.py`: it logs each attempt to `$GUARD_LOG` and refuses it."""


def guarded_env(tmp_path: Path, extra: Mapping[str, str]) -> tuple[dict[str, str], Path]:
    """(env, log): this environment without `PROCTOR_*`, plus `extra`, whose Python loads the guard."""
    hooks = tmp_path / "guard"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(GUARD, encoding="utf-8")
    log = tmp_path / "guard.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env.update({"PYTHONPATH": str(hooks), "GUARD_LOG": str(log), **extra})
    return env, log
