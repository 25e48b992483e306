"""Paths every test needs: the repository root and its bundled inputs."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (tests/support/paths.py -> tests/support -> tests -> root)."""
TASKS = REPO / "evals" / "tasks"
WORKER = TASKS / "scripted_worker.py"
HUMANEVAL = REPO / "evals" / "humaneval"
FIXTURES = REPO / "tests" / "fixtures"
"""Recorded provider responses (providers/) and hostile sandbox workers (sandbox/)."""
