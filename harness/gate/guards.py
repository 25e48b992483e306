"""What a worker must not be able to change about its own verification.

Each check compares the workspace now with the baseline tree recorded at init:
something the project had at init is its own; something that appeared or
changed since is the worker's, and is refused.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata

from harness.evidence.jsonio import sha256_hex
from harness.evidence.tree_entry import TreeEntry, display_path

__all__ = [
    "ANCESTOR_INPUT_NAMES",
    "VERIFICATION_INPUT_NAMES",
    "ancestor_inputs",
    "changed_since",
    "escaping_entries",
    "module_shadows",
    "seal_matches",
    "verification_input_changes",
]

VERIFICATION_INPUT_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",  # pytest 9 reads these two as well
        ".pytest.toml",
        "pyproject.toml",
        "setup.cfg",
        "tox.ini",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
ANCESTOR_INPUT_NAMES = frozenset(
    {"conftest.py", "setup.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "tox.ini", "setup.cfg"}
)
"""Files pytest looks for in the folders above where it runs (config, rootdir marker, conftest)."""
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


def changed_since(baseline: Mapping[bytes, TreeEntry], current: Mapping[bytes, TreeEntry], path: bytes) -> bool:
    """True when `path` appeared, vanished or changed between baseline and now."""
    return baseline.get(path) != current.get(path)


def _is_verification_input(path: bytes) -> bool:
    name = posixpath.basename(path).decode("utf-8", "surrogateescape")
    return name in VERIFICATION_INPUT_NAMES or name.endswith(".pth")


def verification_input_changes(
    baseline: Mapping[bytes, TreeEntry], current: Mapping[bytes, TreeEntry]
) -> list[str]:
    """Files that steer the test runner or the interpreter and appeared, changed or vanished."""
    paths = {p for p in (*baseline, *current) if _is_verification_input(p)}
    return [display_path(p) for p in sorted(paths) if changed_since(baseline, current, p)]


def _import_roots(current: Mapping[bytes, TreeEntry]) -> set[bytes]:
    """Folders that land on sys.path: the root, and every non-package folder holding Python files."""
    roots = {b""}
    for path, entry in current.items():
        if entry.kind in ("file", "link") and path.endswith(b".py"):
            folder = posixpath.dirname(path)
            if folder and posixpath.join(folder, b"__init__.py") not in current:
                roots.add(folder)
    return roots


def _module_name(path: bytes, entry: TreeEntry, current: Mapping[bytes, TreeEntry]) -> str | None:
    base = posixpath.basename(path).decode("utf-8", "surrogateescape")
    if entry.kind == "dir":
        return base if posixpath.join(path, b"__init__.py") in current else None
    for suffix in _MODULE_SUFFIXES:
        if base.endswith(suffix):
            stem = base[: -len(suffix)]
            return stem.split(".", 1)[0] if suffix in (".so", ".pyd") else stem
    return None


def _canonical_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _verifier_dependencies(modules: set[str]) -> set[str]:
    """Top-level modules the verifier's `-m` modules import from this interpreter's installs.

    The distributions providing `modules`, pytest's plugins (`pytest11` entry
    points, loaded at start) and everything they require: a workspace module
    named like one of them (`pluggy.py`, `_pytest/`) comes first on sys.path
    and would run in its place. The project's own installed package is not
    among them unless the verifier itself requires it.
    """
    owners = metadata.packages_distributions()
    todo = [d for m in modules for d in owners.get(m, [])]
    if "pytest" in modules:
        todo += [ep.dist.name for ep in metadata.entry_points(group="pytest11") if ep.dist is not None]
    seen: set[str] = set()
    while todo:
        name = _canonical_dist(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra" in req.partition(";")[2]:
                continue
            found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
            if found:
                todo.append(found.group(1))
    return {top for top, dists in owners.items() if any(_canonical_dist(d) in seen for d in dists)}


def _verifier_modules(argv: Sequence[str]) -> set[str]:
    names = set()
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            names.add(argv[i + 1].split(".", 1)[0])
    return names


def module_shadows(
    baseline: Mapping[bytes, TreeEntry],
    current: Mapping[bytes, TreeEntry],
    verifier_argv: Sequence[str],
) -> list[str]:
    """New or changed workspace modules named like the verifier's `-m` module, what it imports
    from its installed distribution and requirements, or the standard library."""
    modules = _verifier_modules(verifier_argv)
    protected = set(sys.stdlib_module_names) | modules | _verifier_dependencies(modules)
    roots = _import_roots(current)
    found = []
    for path, entry in sorted(current.items()):
        if posixpath.dirname(path) not in roots:
            continue
        name = _module_name(path, entry, current)
        if name is None or name not in protected:
            continue
        shadow_paths = [path]
        if entry.kind == "dir":
            shadow_paths.append(posixpath.join(path, b"__init__.py"))
        if any(changed_since(baseline, current, p) for p in shadow_paths):
            found.append(display_path(path))
    return found


def escaping_entries(
    baseline: Mapping[bytes, TreeEntry], current: Mapping[bytes, TreeEntry]
) -> list[dict[str, str]]:
    """New or changed special files (FIFO, socket, device), and links that leave the workspace.

    A link leaves when its target does on its own (absolute, or `..` above the
    root), or when its whole chain, resolved link by link through the tree as
    the kernel would, ends outside: `x/up -> ..` then `t -> x/up/../elsewhere`
    each stay inside on their own. Every link that leaves now is refused unless
    it is unchanged since init and left then too.
    """
    found = []
    for path, entry in sorted(current.items()):
        changed = changed_since(baseline, current, path)
        if changed and entry.kind in ("fifo", "socket", "char_device", "block_device"):
            found.append({"path": display_path(path), "why": f"special file ({entry.kind})"})
        elif entry.kind == "link" and entry.target is not None:
            target = entry.target.decode("utf-8", "backslashreplace")
            if changed and _link_escapes(path, entry.target):
                found.append({"path": display_path(path), "why": f"link out of the workspace to {target}"})
            elif _chain_escapes(path, current) and (changed or not _chain_escapes(path, baseline)):
                found.append({"path": display_path(path), "why": f"link to {target} resolves out of the workspace through links"})
    return found


def _link_escapes(path: bytes, target: bytes) -> bool:
    if target.startswith(b"/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined == b".." or joined.startswith(b"../")


_MAX_HOPS = 40
"""Links followed in one resolution, as Linux's ELOOP limit: a longer chain resolves nowhere."""


def _chain_escapes(path: bytes, entries: Mapping[bytes, TreeEntry]) -> bool:
    """True when the link at `path`, followed through every link of `entries`, ends outside the tree."""
    resolved = path.split(b"/")[:-1]
    todo = [path.split(b"/")[-1]]
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in (b"", b"."):
            continue
        if part == b"..":
            if not resolved:
                return True
            resolved.pop()
            continue
        entry = entries.get(b"/".join([*resolved, part]))
        if entry is None or entry.kind != "link" or entry.target is None:
            resolved.append(part)
            continue
        hops += 1
        if hops > _MAX_HOPS:
            return False
        if entry.target.startswith(b"/"):
            return True
        todo = [*entry.target.split(b"/"), *todo]
    return False


def _fingerprint(path: str) -> str:
    """What pytest would read at `path`: content hash, or what else is there (never blocks)."""
    try:
        st = os.stat(path)  # pytest follows links
    except OSError:
        return "unreachable"
    if not stat.S_ISREG(st.st_mode):
        return f"special:{stat.S_IFMT(st.st_mode):o}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return f"unreadable:{st.st_size}:{st.st_mtime_ns}"
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return "sha256:" + sha256_hex(b"".join(chunks))


def ancestor_inputs(folder: str) -> dict[str, str]:
    """Test-runner inputs in `folder` and every folder above it: absolute path -> fingerprint.

    The verifier runs in a copy below `folder`; pytest searches upward from
    there for config files, a `setup.py` rootdir marker and `conftest.py`, so
    a worker that writes `../conftest.py` next to the workspace steers it.
    """
    found = {}
    here = os.path.abspath(folder)
    while True:
        for name in sorted(ANCESTOR_INPUT_NAMES):
            path = os.path.join(here, name)
            if os.path.lexists(path):
                found[path] = _fingerprint(path)
        parent = os.path.dirname(here)
        if parent == here:
            return found
        here = parent


def seal_matches(patterns: Sequence[str], entries: Mapping[bytes, TreeEntry]) -> dict[str, list[bytes]]:
    """For each seal pattern, the files it names: an exact path, a folder's files, or an fnmatch glob."""
    out: dict[str, list[bytes]] = {}
    files = sorted(p for p, e in entries.items() if e.kind == "file")
    for pattern in patterns:
        pat = os.fsencode(pattern.rstrip("/"))
        if any(ch in pattern for ch in "*?["):
            hits = [p for p in files if fnmatch.fnmatchcase(p, pat)]
        else:
            hits = [p for p in files if p == pat or p.startswith(pat + b"/")]
        out[pattern] = hits
    return out
