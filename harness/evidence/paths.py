"""The repository root and paths taken from it: how notebooks and the audit find relative paths."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["repo_root", "resolve"]


def repo_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The repository root, from which the notebook's relative paths are taken.

    The first folder at or above `start` (default: the cwd) holding `pyproject.toml`
    and `harness/`; else the folder above the installed package when it holds
    `notebooks/`; else `start` itself.
    """
    here = Path(os.fspath(start) if start is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "harness").is_dir():
            return folder
    package_parent = Path(__file__).resolve().parents[2]
    if (package_parent / "notebooks").is_dir():
        return package_parent
    return here


def resolve(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """`path` made absolute: relative paths are taken from `root` (the repository root)."""
    text = os.path.expanduser(os.fspath(path))
    return os.path.normpath(text if os.path.isabs(text) else os.path.join(os.fspath(root), text))
