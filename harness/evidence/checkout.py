"""The git commit of the checkout the harness runs from, and whether its tracked files were changed.

The manual: docs/evidence.md (provenance).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

from harness.evidence.git import git_dir_of, run_git

__all__ = ["UNKNOWN", "checkout_of", "package_checkout"]

UNKNOWN: Final = "unknown"
"""The commit recorded when the harness does not run from a git checkout (or git is missing)."""
_TIMEOUT_S: Final = 10.0


def _top(folder: str) -> tuple[str, str] | None:
    """The work tree holding `folder` and its git folder, found as data (`git_dir_of`), or None."""
    here = os.path.realpath(folder)
    while True:
        git_dir = git_dir_of(here)
        if git_dir is not None:
            return here, git_dir
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _git(top: str, git_dir: str, *args: str) -> str | None:
    """`git ARGS` on that checkout through `run_git` (no hooks, fsmonitor, pager or user config)."""
    try:
        got = run_git(list(args), git_dir=git_dir, work_tree=top, timeout_s=_TIMEOUT_S, env={"LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    return got.stdout.decode("utf-8", "replace") if got.returncode == 0 else None


def checkout_of(folder: str | os.PathLike[str]) -> tuple[str, bool | None]:
    """(commit, dirty) of the git work tree holding `folder`; (`UNKNOWN`, None) when there is none.

    Dirty means a tracked file outside `results/` differs from the commit (untracked files and
    the results a run appends to do not count).
    """
    found = _top(os.fspath(folder))
    head = None if found is None else _git(*found, "rev-parse", "--verify", "HEAD")
    if found is None or head is None or not head.strip():
        return UNKNOWN, None
    status = _git(*found, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return head.strip(), None if status is None else bool(status.strip())


def package_checkout() -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout this package was imported from (`checkout_of`)."""
    package = Path(__file__).resolve().parents[1]
    if not (package.parent / "pyproject.toml").is_file():
        return UNKNOWN, None  # an installed package: its folder is in no checkout of ours
    return checkout_of(package.parent)
