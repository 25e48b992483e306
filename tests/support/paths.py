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


def checkout_at(root: Path) -> Path:
    """Make `root` a repository root as `harness.evidence.paths.repo_root` finds one (pyproject.toml and
    harness/, with evals/ beside it, linked to this checkout's), so that a study laid out under it is
    named relative to it in executed notebooks, as in a real checkout."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for name in ("harness", "evals"):
        (root / name).symlink_to(REPO / name)
    return root
AGENT = REPO / "tests" / "support" / "agent_script.py"
"""A small real agent (httpx through the metering proxy) for the command-template worker tests."""
