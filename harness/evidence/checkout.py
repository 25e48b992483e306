"""The git commit of the checkout the harness runs from, and whether its tracked files were changed.

The manual: docs/evidence.md (provenance).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

__all__ = ["UNKNOWN", "checkout_of", "package_checkout"]

UNKNOWN: Final = "unknown"
"""The commit recorded when the harness does not run from a git checkout (or git is missing)."""
_TIMEOUT_S: Final = 10.0


def _git(root: str, *args: str) -> str | None:
    try:
        got = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=_TIMEOUT_S,
                             check=False, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    return got.stdout if got.returncode == 0 else None


def checkout_of(folder: str | os.PathLike[str]) -> tuple[str, bool | None]:
    """(commit, dirty) of the git work tree holding `folder`; (`UNKNOWN`, None) when there is none.

    Dirty means a tracked file outside `results/` differs from the commit (untracked files and
    the results a run appends to do not count).
    """
    root = os.fspath(folder)
    top = _git(root, "rev-parse", "--show-toplevel")
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if top is None or head is None or not head.strip():
        return UNKNOWN, None
    status = _git(top.strip(), "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return head.strip(), None if status is None else bool(status.strip())


def package_checkout() -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout this package was imported from (`checkout_of`)."""
    package = Path(__file__).resolve().parents[1]
    if not (package.parent / "pyproject.toml").is_file():
        return UNKNOWN, None  # an installed package: its folder is in no checkout of ours
    return checkout_of(package.parent)
