"""The real `proctor` CLI in a subprocess, with `--json`: its exit code and its one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from tests.support.paths import REPO


@dataclass
class CliResult:
    """One `proctor ... --json` run: exit code, the single JSON object, stderr."""

    code: int
    out: dict[str, Any]
    stderr: str
    stdout: str


def run_proctor(*words: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    """Run the real CLI with --json (placed before any `--command`), parse its one JSON object."""
    items = list(words)
    cut = items.index("--command") if "--command" in items else len(items)
    argv = [sys.executable, "-m", "harness", *items[:cut], "--json", *items[cut:]]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    full_env.update(env or {})
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be exactly one JSON object, got: {done.stdout!r} / {done.stderr!r}"
    return CliResult(done.returncode, json.loads(lines[0]), done.stderr, done.stdout)
