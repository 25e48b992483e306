"""Portable evidence: no absolute path of the machine that wrote it, and paths shown relative.

`machine_paths` scans a folder (a study's results) for the absolute paths of this machine:
the folder's own location, the repository, the Python prefixes, the home and temporary
folders, any path under a user's folder (`USER_PREFIXES`), and any absolute path through
one of the project's folders (`PROJECT_FOLDERS`, or the scanned folder's name). The audit names each file
holding one (`absolute_path`). The manual: docs/evidence.md (portable evidence).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["PathLeak", "machine_names", "machine_paths", "machine_roots", "portable_text", "portable_value", "shown_path"]

USER_PREFIXES: Final = ("/home/", "/root/", "/Users/", "/tmp/", "/var/folders/", "/private/var/")
"""Folders whose paths name a user or a run on one machine, wherever the check runs."""
ROLES: Final = ("<repo>", "<python>", "<python-base>", "<home>", "<tmp>", "<clone>", "<snapshot>")
"""The names a record gives this machine's folders instead of their paths (`portable_value`)."""
PROJECT_FOLDERS: Final = ("results", "prereg", "notebooks", "harness", ".venv", "site-packages")
"""Folders whose absolute path names a checkout (of this machine or another): `/x/y/results/...`."""
_MAX_SCAN_BYTES: Final = 64 * 1024 * 1024
_PATH_CHARS: Final = r"[\w.+@%~-]"


@dataclass(frozen=True)
class PathLeak:
    """A file holding an absolute machine path: its path relative to the scanned folder, the first line
    (1-based) holding one, the first path found and how many were found in the file."""

    file: str
    line: int
    path: str
    count: int


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def machine_roots(folder: str | os.PathLike[str] | None = None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """This machine's folders a record must not name, longest first: `folder`'s own location and its
    parents two levels deep or more, the working folder, the Python prefixes, home, the temporary
    folder, and `extra`."""
    found = set()
    candidates = [os.getcwd(), sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.expanduser("~"),
                  tempfile.gettempdir(), *extra]
    if folder is not None:
        here = os.path.abspath(os.fspath(folder))
        candidates += [here, os.path.realpath(here)]
        while os.path.dirname(here) != here:
            here = os.path.dirname(here)
            candidates.append(here)
    for path in candidates:
        for form in (os.path.abspath(path), os.path.realpath(path)):
            if _depth(form) >= 2 or form.startswith(USER_PREFIXES):
                found.add(form.rstrip("/"))
    return tuple(sorted(found, key=lambda p: (-len(p), p)))


def _pattern(roots: Sequence[str], names: Sequence[str]) -> re.Pattern[str]:
    heads = [re.escape(r) + rf"(?!{_PATH_CHARS})" for r in roots]
    heads += [re.escape(p) + _PATH_CHARS for p in USER_PREFIXES]
    # a checkout elsewhere: an absolute path through one of the project's folders
    folders = "|".join(re.escape(n) for n in sorted({*PROJECT_FOLDERS, *names}))
    heads.append(rf"/(?:{_PATH_CHARS}+/)*(?:{folders})(?!{_PATH_CHARS})")
    roles = "".join(f"(?<!{re.escape(r)})" for r in ROLES)  # `<repo>/harness`: a folder named by its role
    return re.compile(rf"(?<![\w.:/-]){roles}(?:{'|'.join(heads)})[^\s\"'<>,;|)\]\\]*")


def machine_paths(folder: str | os.PathLike[str], *, extra: Iterable[str] = (),
                  skip: Iterable[str] = ()) -> tuple[PathLeak, ...]:
    """Every file under `folder` (not following links) holding an absolute machine path (`machine_roots`);
    `skip`: file or folder names relative to `folder` left out. Binary files (PNG) are read too."""
    base = os.path.abspath(os.fspath(folder))
    pattern = _pattern(machine_roots(base, extra), [os.path.basename(base)] if os.path.basename(base) else [])
    skipped = {s.strip("/") for s in skip}
    leaks = []
    for top, dirs, files in os.walk(base):
        dirs.sort()
        rel_top = os.path.relpath(top, base)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel_top, d)) not in skipped]
        for name in sorted(files):
            rel = os.path.normpath(os.path.join(rel_top, name))
            path = os.path.join(top, name)
            if rel in skipped or os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as fh:
                text = fh.read(_MAX_SCAN_BYTES).decode("utf-8", errors="replace")
            hits = list(pattern.finditer(text))
            if hits:
                line = text.count("\n", 0, hits[0].start()) + 1
                leaks.append(PathLeak(rel.replace(os.sep, "/"), line, hits[0].group(0)[:200], len(hits)))
    return tuple(leaks)


def shown_path(path: str | os.PathLike[str], base: str | os.PathLike[str]) -> str:
    """`path` as a record or a table shows it: relative to `base` (with `/`) when it lies under `base`,
    else its last two parts (never the machine's absolute path)."""
    text, root = os.path.abspath(os.fspath(path)), os.path.abspath(os.fspath(base))
    if text == root:
        return "."
    if text.startswith(root.rstrip(os.sep) + os.sep):
        return os.path.relpath(text, root).replace(os.sep, "/")
    parts = [p for p in text.split(os.sep) if p]
    return "/".join(parts[-2:]) if parts else "."


def machine_names() -> dict[str, str]:
    """This machine's folders a record names by role instead, longest first: the repository (`<repo>`:
    the installed package's, as imported and resolved, and the working folder's),
    the Python prefixes (`<python>`, `<python-base>`), home (`<home>`), the temporary folder (`<tmp>`)."""
    from harness.evidence.paths import repo_root

    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # as imported
    repos = [str(repo_root(os.path.dirname(os.path.abspath(__file__)))), str(repo_root()), package]
    roles = [*((r, "<repo>") for r in repos), (sys.prefix, "<python>"),
             (sys.exec_prefix, "<python>"), (sys.base_prefix, "<python-base>"),
             (sys.base_exec_prefix, "<python-base>"), (os.path.expanduser("~"), "<home>"),
             (tempfile.gettempdir(), "<tmp>")]
    names: dict[str, str] = {}
    for path, role in roles:
        for form in (os.path.abspath(path), os.path.realpath(path)):
            if _depth(form) >= 2 and form not in names:
                names[form.rstrip("/")] = role
    return dict(sorted(names.items(), key=lambda kv: (-len(kv[0]), kv[0])))


def portable_value(value: Any, names: dict[str, str] | None = None) -> Any:
    """`value` (JSON: strings, lists, dicts) with each string that is or starts with a machine folder
    (`machine_names`) given that folder's role instead: `/home/me/repo/.venv` -> `<repo>/.venv`."""
    roles = machine_names() if names is None else names
    if isinstance(value, str):
        for root, role in roles.items():
            if value == root or value.startswith(root + "/"):
                return role + value[len(root):]
        return value
    if isinstance(value, list | tuple):
        return [portable_value(v, roles) for v in value]
    if isinstance(value, dict):
        return {k: portable_value(v, roles) for k, v in value.items()}
    return value


def portable_text(text: str, names: dict[str, str] | None = None) -> str:
    """`text` (a program's output) with every occurrence of a machine folder (`machine_names`, longest
    first) given that folder's role instead: `File "/home/me/repo/x.py"` -> `File "<repo>/x.py"`."""
    roles = machine_names() if names is None else names
    for root, role in sorted(roles.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        text = re.sub(re.escape(root) + rf"(?!{_PATH_CHARS})", role.replace("\\", "\\\\"), text)
    return text
