"""Build the mutant suite: localized bug fixes made from a real library's sdist and its own tests.

The manual: docs/evals.md (``harness/evals/mutants.py``).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, EvalRefusal
from harness.evals.suite import Suite
from harness.evals.write import write_suite
from harness.evidence.git import run_git
from harness.evidence.jsonio import canonical_bytes, canonical_line, read_bytes, sha256_hex
from harness.evidence.pysource import parse_python
from harness.providers.edit_format import render_files

__all__ = [
    "KINDS",
    "LIBRARIES",
    "Library",
    "MutantItem",
    "apply_patch",
    "build_mutants",
    "candidates",
    "fetch_sdist",
    "materialize",
    "mutant_item",
    "parse_spec",
    "sdist_cache",
    "visible_source",
    "visible_tests",
    "write_task",
]

SUITE_VERSION: Final = 1
KINDS: Final = ("operator", "comparison", "constant", "off_by_one", "dropped_branch")
"""The mutation kinds, in the order the selection takes them round-robin."""
FEATURES: Final = ("localized", "bounded", "known_location", "objective_acceptance")
TEST_TIMEOUT_S: Final = 60.0
_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[0-9][A-Za-z0-9.+!-]*)$")


@dataclass(frozen=True)
class Library:
    """A pinned sdist and what the suite takes from it.

    Attributes:
        name, version: the PyPI project and version.
        sha256: the sha256 of the sdist's bytes (any other bytes: ``suite_source_mismatch``).
        source: folders and files of the sdist (below its top folder) copied into the workspace.
        modules: a module path -> the library's test file for it (the hidden tests).
        support: test files kept in the workspace besides the visible ones (``__init__.py``).
        test_dir: the folder the verifier runs pytest on (the visible file is written there).
    """

    name: str
    version: str
    sha256: str
    source: tuple[str, ...]
    modules: Mapping[str, str]
    support: tuple[str, ...]
    test_dir: str

    @property
    def dist(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def sdist(self) -> str:
        return f"{self.dist}.tar.gz"


LIBRARIES: Final[Mapping[tuple[str, str], Library]] = {
    ("toolz", "0.12.1"): Library(
        "toolz",
        "0.12.1",
        "ecca342664893f177a13dac0e6b41cbd8ac25a358e5f215316d43e2100224f4d",
        ("toolz", "LICENSE.txt"),
        {
            "toolz/itertoolz.py": "toolz/tests/test_itertoolz.py",
            "toolz/dicttoolz.py": "toolz/tests/test_dicttoolz.py",
            "toolz/functoolz.py": "toolz/tests/test_functoolz.py",
        },
        (),
        "toolz/tests",
    ),
    ("more-itertools", "10.5.0"): Library(
        "more-itertools",
        "10.5.0",
        "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6",
        ("more_itertools", "LICENSE"),
        {"more_itertools/recipes.py": "tests/test_recipes.py"},
        ("tests/__init__.py",),
        "tests",
    ),
    ("inflection", "0.5.1"): Library(
        "inflection",
        "0.5.1",
        "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
        ("inflection", "LICENSE"),
        {"inflection/__init__.py": "test_inflection.py"},
        (),
        ".",
    ),
}
"""The libraries a mutant suite can be built from, by (name, version), each sdist's sha256 pinned."""


# --- the sdist: spec, cache, download, unpack ------------------------------------------------------------


def parse_spec(spec: str) -> Library:
    """`NAME==VERSION` as a pinned library; ``suite_package_spec_invalid`` or ``suite_package_unknown``."""
    found = _SPEC.match(spec)
    if found is None:
        raise EvalRefusal(Code.SUITE_PACKAGE_SPEC_INVALID, f"expected NAME==VERSION, got {spec!r}", spec=spec)
    key = (found["name"].lower().replace("_", "-"), found["version"])
    if key not in LIBRARIES:
        known = ", ".join(f"{n}=={v}" for n, v in sorted(LIBRARIES))
        raise EvalRefusal(Code.SUITE_PACKAGE_UNKNOWN, f"no pinned sdist for {spec} (known: {known})", spec=spec)
    return LIBRARIES[key]


def sdist_cache() -> str:
    """Where sdists are kept: ``$PROCTOR_SDIST_CACHE``, else ``$XDG_CACHE_HOME`` (or ~/.cache)/proctor/sdists."""
    given = os.environ.get("PROCTOR_SDIST_CACHE")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "proctor", "sdists")


def _checked(library: Library, path: str) -> bytes:
    raw = read_bytes(path, max_bytes=64 * 1024 * 1024)
    digest = sha256_hex(raw)
    if digest != library.sha256:
        raise EvalRefusal(
            Code.SUITE_SOURCE_MISMATCH,
            f"the sdist's sha256 is {digest}, the pinned one {library.sha256}",
            path,
            sha256=digest,
        )
    return raw


def fetch_sdist(library: Library, *, cache: str | None = None, download: bool = True) -> tuple[str, bytes]:
    """(path, bytes) of the library's sdist: from the cache, else ``pip download`` into it; sha256 checked.

    Refuses ``suite_source_missing`` when it is not cached and cannot be downloaded (or `download`
    is False), ``suite_source_mismatch`` for bytes other than the pinned ones.
    """
    folder = cache or sdist_cache()
    path = os.path.join(folder, library.sdist)
    if not os.path.exists(path):
        if not download:
            raise EvalRefusal(Code.SUITE_SOURCE_MISSING, f"{library.sdist} is not in the cache", folder)
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".pip-") as tmp:
            argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--disable-pip-version-check", "--dest", tmp, f"{library.name}=={library.version}"]  # fmt: skip
            try:
                done = subprocess.run(argv, capture_output=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise EvalRefusal(Code.SUITE_SOURCE_MISSING, "pip download timed out", library.sdist) from None
            got = os.path.join(tmp, library.sdist)
            if done.returncode != 0 or not os.path.isfile(got):
                tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no sdist written"]
                raise EvalRefusal(Code.SUITE_SOURCE_MISSING, f"pip download failed: {tail[0]}", library.sdist)
            _checked(library, got)
            os.replace(got, path)
    return path, _checked(library, path)


def _unpack(library: Library, raw: bytes, where: str) -> dict[str, bytes]:
    """The sdist's regular files under `library.source` (paths below its top folder), by path."""
    top = library.dist + "/"
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if not member.isfile() or not name.startswith(top):
                continue
            rel = name[len(top) :]
            parts = rel.split("/")
            if "" in parts or ".." in parts or "__pycache__" in parts or rel.endswith(".pyc"):
                continue
            wanted = any(rel == s or rel.startswith(s + "/") for s in library.source)
            if not wanted and rel not in library.support and rel not in library.modules.values():
                continue
            extracted = tar.extractfile(member)
            if extracted is not None:
                files[rel] = extracted.read()
    missing = [p for p in (*library.modules, *library.modules.values(), *library.support) if p not in files]
    if missing:
        raise EvalRefusal(Code.SUITE_SOURCE_MISMATCH, f"the sdist lacks {', '.join(missing)}", where)
    return files


def _split_tree(library: Library, files: Mapping[str, bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(src, hidden): the workspace's files without any test file, and the hidden test files."""
    hidden = {p: files[p] for p in library.modules.values()}
    test_prefix = "" if library.test_dir == "." else library.test_dir + "/"
    src: dict[str, bytes] = {}
    for rel, data in files.items():
        if rel in hidden:
            continue
        inside_tests = library.test_dir != "." and rel.startswith(test_prefix)
        if inside_tests and rel not in library.support:
            continue
        src[rel] = data
    return src, hidden


# --- tests: enumerate, the visible subset ----------------------------------------------------------------


def _test_defs(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, list[ast.stmt]]]:
    """(qualified name, def, its block) of each top-level ``test*`` function and class ``test*`` method."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, list[ast.stmt]]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            out.append((node.name, node, tree.body))
        elif isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and child.name.startswith("test"):
                    out.append((f"{node.name}.{child.name}", child, node.body))
    return out


def visible_tests(library: Library, test_path: str, source: bytes) -> list[str]:
    """The documented visible subset: tests whose sha256("<dist>:<test path>:<name>") starts with 0-3.

    About a quarter of the module's tests, the same for every item of the module and every seed;
    never empty (the test with the smallest hash when none qualifies).
    """
    names = [name for name, _, _ in _test_defs(parse_python(source))]

    def digest(name: str) -> str:
        return hashlib.sha256(f"{library.dist}:{test_path}:{name}".encode()).hexdigest()

    chosen = [n for n in names if digest(n)[0] in "0123"]
    return chosen or [min(names, key=digest)]


def visible_source(source: bytes, keep: Iterable[str]) -> bytes:
    """The test file with every test but `keep` removed (decorators too); an emptied class keeps ``pass``."""
    tree = parse_python(source)
    wanted = set(keep)
    lines = source.decode("utf-8").splitlines(keepends=True)
    drop: set[int] = set()
    passes: dict[int, str] = {}
    by_block: dict[int, list[tuple[str, ast.stmt]]] = {}
    for name, node, block in _test_defs(tree):
        by_block.setdefault(id(block), []).append((name, node))
        if name not in wanted:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            drop.update(range(first, (node.end_lineno or node.lineno) + 1))
    for klass in tree.body:
        if isinstance(klass, ast.ClassDef):
            remaining = [s for s in klass.body if s.lineno not in drop]
            if not remaining:
                head = klass.body[0]
                start = min([head.lineno, *(d.lineno for d in getattr(head, "decorator_list", []))])
                passes[start] = " " * head.col_offset + "pass\n"
    out = []
    for number, line in enumerate(lines, 1):
        if number in passes:
            out.append(passes[number])
        if number not in drop:
            out.append(line)
    return "".join(out).encode("utf-8")


def _visible_path(library: Library, test_path: str) -> str:
    stem = os.path.basename(test_path)[: -len(".py")]
    folder = "" if library.test_dir == "." else library.test_dir + "/"
    return f"{folder}{stem}_visible.py"


# --- running the library's tests ---------------------------------------------------------------------------

_COVER = r"""
import json, os, sys, threading
target, out = os.path.realpath(sys.argv[1]), sys.argv[2]
lines, seen = set(), {}
def local(frame, event, arg):
    if event == "line":
        lines.add(frame.f_lineno)
    return local
def trace(frame, event, arg):
    name = frame.f_code.co_filename
    hit = seen.get(name)
    if hit is None:
        hit = seen[name] = os.path.realpath(os.path.abspath(name)) == target
    if hit:
        lines.add(frame.f_lineno)
        return local
    return None
import pytest
sys.settrace(trace); threading.settrace(trace)
code = pytest.main(sys.argv[3:])
sys.settrace(None)
with open(out, "w") as f:
    json.dump(sorted(lines), f)
sys.exit(int(code))
"""


def _env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")}
    keep.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    return keep


@dataclass(frozen=True)
class _Run:
    code: int | None  # None: timed out
    failing: tuple[tuple[str, str], ...]  # (test name, first line of its message), in report order
    cases: int


def _pytest(tree: str, test_path: str, *, cover: str | None = None) -> _Run:
    """Run pytest on one test file in `tree` (a subprocess, no plugins, a timeout); the failing tests."""
    report = os.path.join(tree, ".proctor-junit.xml")
    args = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}", "-o", "junit_family=xunit1", test_path]
    if cover is None:
        argv = [sys.executable, "-m", "pytest", *args]
    else:
        argv = [sys.executable, "-c", _COVER, cover, os.path.join(tree, ".proctor-cover.json"), *args]
    try:
        done = subprocess.run(argv, cwd=tree, env=_env(), capture_output=True, timeout=TEST_TIMEOUT_S, check=False,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return _Run(None, (), 0)
    failing: list[tuple[str, str]] = []
    cases = 0
    if os.path.exists(report):
        root = ElementTree.parse(report).getroot()
        for case in root.iter("testcase"):
            cases += 1
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is None:
                continue
            klass = case.get("classname", "").rsplit(".", 1)[-1]
            name = case.get("name", "")
            qual = f"{klass}.{name}" if klass[:1].isupper() else name
            message = (bad.get("message") or "").strip().splitlines()
            failing.append((qual, message[0][:240] if message else ""))
        os.unlink(report)
    return _Run(done.returncode, tuple(dict.fromkeys(failing)), cases)


def _write_tree(folder: str, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        target = os.path.join(folder, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)


def _coverage(tree: str, module: str, test_path: str) -> set[int]:
    run = _pytest(tree, test_path, cover=os.path.join(tree, module))
    if run.code != 0:
        raise EvalRefusal(
            Code.SUITE_SOURCE_MISMATCH, f"the library's own tests fail on the pristine tree: {run.failing[:3]}", test_path
        )
    path = os.path.join(tree, ".proctor-cover.json")
    with open(path) as f:
        lines = set(json.load(f))
    os.unlink(path)
    return lines


# --- mutations ----------------------------------------------------------------------------------------------

_BINOPS: Final[Mapping[type, tuple[type, str, str]]] = {
    ast.Add: (ast.Sub, "+", "-"),
    ast.Sub: (ast.Add, "-", "+"),
    ast.Mult: (ast.FloorDiv, "*", "//"),
    ast.FloorDiv: (ast.Mult, "//", "*"),
    ast.Div: (ast.Mult, "/", "*"),
    ast.Mod: (ast.FloorDiv, "%", "//"),
    ast.BitAnd: (ast.BitOr, "&", "|"),
    ast.BitOr: (ast.BitAnd, "|", "&"),
    ast.LShift: (ast.RShift, "<<", ">>"),
    ast.RShift: (ast.LShift, ">>", "<<"),
}
_CMPOPS: Final[Mapping[type, tuple[str, str]]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}


@dataclass(frozen=True)
class _Candidate:
    module: str
    function: str
    kind: str
    line: int  # 1-based first line replaced
    old: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def key(self) -> tuple[str, int, str, tuple[str, ...]]:
        return (self.module, self.line, self.kind, self.new)


def _col(line: str, byte_col: int) -> int:
    """A character index from ast's UTF-8 byte offset."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def _gap_swap(lines: list[str], left: ast.expr, right: ast.expr, old: str, new: str) -> tuple[int, str] | None:
    """(line, the line with `old` swapped for `new`) when the text between the operands is exactly `old`."""
    if left.end_lineno != right.lineno or left.end_col_offset is None:
        return None
    text = lines[right.lineno - 1]
    start, end = _col(text, left.end_col_offset), _col(text, right.col_offset)
    gap = text[start:end]
    bare = gap.strip().strip("()").strip()
    if bare != old or gap.count(old) != 1:
        return None
    return right.lineno, text[:start] + gap.replace(old, new) + text[end:]


def _literal(lines: list[str], node: ast.Constant, text: str) -> tuple[int, str] | None:
    if node.lineno != node.end_lineno or node.end_col_offset is None:
        return None
    line = lines[node.lineno - 1]
    start, end = _col(line, node.col_offset), _col(line, node.end_col_offset)
    return node.lineno, line[:start] + text + line[end:]


def _index_context(parents: Mapping[int, ast.AST], node: ast.AST) -> bool:
    """An integer used as an index, a slice bound, a ``range`` argument or a ``+``/``-`` operand."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Slice) or (isinstance(parent, ast.Subscript) and parent.slice is node):
        return True
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add | ast.Sub):
        return True
    return isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "range"


def _stringy(node: ast.expr) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes))


def candidates(module: str, source: str, covered: set[int]) -> list[_Candidate]:
    """Every single mutation of a covered line inside a function of `source`, in source order."""
    tree = parse_python(source)
    lines = source.splitlines(keepends=True)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    out: list[_Candidate] = []

    def add(function: str, kind: str, found: tuple[int, str] | None) -> None:
        if found is not None and found[0] in covered:
            number, text = found
            out.append(_Candidate(module, function, kind, number, (lines[number - 1],), (text,)))

    def visit_function(fn: ast.FunctionDef | ast.AsyncFunctionDef, qual: str) -> None:
        for stmt in fn.body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
                    if not (_stringy(node.left) or _stringy(node.right)):
                        _, old, new = _BINOPS[type(node.op)]
                        add(qual, "operator", _gap_swap(lines, node.left, node.right, old, new))
                elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
                    old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
                    add(qual, "operator", _gap_swap(lines, node.values[0], node.values[1], old, new))
                elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
                    old, new = _CMPOPS[type(node.ops[0])]
                    add(qual, "comparison", _gap_swap(lines, node.left, node.comparators[0], old, new))
                elif isinstance(node, ast.Constant) and type(node.value) is bool:
                    add(qual, "constant", _literal(lines, node, str(not node.value)))
                elif isinstance(node, ast.Constant) and type(node.value) is int:
                    n = node.value
                    if _index_context(parents, node):
                        add(qual, "off_by_one", _literal(lines, node, str(n + 1)))
                        if n > 0:
                            add(qual, "off_by_one", _literal(lines, node, str(n - 1)))
                    else:
                        add(qual, "constant", _literal(lines, node, str(n + 1)))
        for block in _blocks(fn):
            if len(block) < 2:
                continue
            for node in block:
                if isinstance(node, ast.If) and not node.orelse and node.lineno in covered:
                    first, last = node.lineno, node.end_lineno or node.lineno
                    head = lines[first - 1]
                    if head[: _col(head, node.col_offset)].strip():
                        continue
                    span = tuple(lines[first - 1 : last])
                    out.append(_Candidate(module, qual, "dropped_branch", first, span, ()))

    def walk_defs(body: Sequence[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit_function(node, prefix + node.name)
            elif isinstance(node, ast.ClassDef):
                walk_defs(node.body, f"{prefix}{node.name}.")

    walk_defs(tree.body, "")
    return sorted(dict.fromkeys(out), key=lambda c: c.key)


def _blocks(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterable[list[ast.stmt]]:
    """Every statement list of the function: its body and each nested one (nested functions included)."""
    for node in ast.walk(fn):
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


def apply_patch(text: str, line: int, old: Sequence[str], new: Sequence[str], where: str) -> str:
    """`text` with lines ``line .. line+len(old)-1`` (1-based) replaced by `new`; they must read `old`."""
    lines = text.splitlines(keepends=True)
    if lines[line - 1 : line - 1 + len(old)] != list(old):
        raise EvalRefusal(Code.SUITE_INVALID, f"line {line}: the mutation does not fit the pristine file", where)
    return "".join([*lines[: line - 1], *new, *lines[line - 1 + len(old) :]])


# --- the build -----------------------------------------------------------------------------------------------


def _prompt(library: Library, module: str, visible: str, failing: Sequence[tuple[str, str]]) -> str:
    name, message = failing[0]
    parts = [
        f"Bug: in {library.name} {library.version}, {len(failing)} of the library's own tests for {module} "
        f"{'fails' if len(failing) == 1 else 'fail'} after a change to that file.",
        "",
        f"The first failing test is {name}:",
        f"    {message}" if message else "    (no message)",
    ]
    others = [n for n, _ in failing[1:4]]
    if others:
        more = len(failing) - 1 - len(others)
        parts += ["", "Also failing: " + ", ".join(others) + (f" and {more} more." if more else ".")]
    parts += [
        "",
        f"The defect is in {module}: fix it there so that the library behaves as its tests expect, and change "
        f"nothing else. Some of the tests are in {visible}; more are hidden. Do not edit the tests.",
    ]
    return "\n".join(parts)


def _try(library: Library, cand: _Candidate, tree: str, pristine: Mapping[str, str]) -> _Run:
    """The module's tests run on `tree` with `cand` applied (the pristine file restored after)."""
    mutated = apply_patch(pristine[cand.module], cand.line, cand.old, cand.new, cand.module)
    target = os.path.join(tree, *cand.module.split("/"))
    with open(target, "w", encoding="utf-8") as f:
        f.write(mutated)
    try:
        return _pytest(tree, library.modules[cand.module])
    finally:
        with open(target, "w", encoding="utf-8") as f:
            f.write(pristine[cand.module])


def _select(
    library: Library,
    cands: list[_Candidate],
    count: int,
    seed: int,
    tree: str,
    pristine: Mapping[str, str],
) -> list[tuple[_Candidate, _Run]]:
    """Mutants taken round-robin over the kinds in a seeded order, kept when the module's tests fail on
    them (exit 1, no timeout): one per function first, then a second per function if more are needed."""
    queues: dict[str, list[_Candidate]] = {}
    for kind in KINDS:
        group = [c for c in cands if c.kind == kind]
        random.Random(f"{seed}:{library.dist}:{kind}").shuffle(group)
        queues[kind] = group
    kept: list[tuple[_Candidate, _Run]] = []
    used: dict[tuple[str, str], int] = {}
    for limit in (1, 2):
        deferred: dict[str, list[_Candidate]] = {kind: [] for kind in KINDS}
        while len(kept) < count and any(queues.values()):
            for kind in KINDS:
                if len(kept) >= count:
                    break
                while queues[kind]:
                    cand = queues[kind].pop(0)
                    if used.get((cand.module, cand.function), 0) >= limit:
                        deferred[kind].append(cand)
                        continue
                    run = _try(library, cand, tree, pristine)
                    if run.code == 1 and run.failing:
                        used[(cand.module, cand.function)] = used.get((cand.module, cand.function), 0) + 1
                        kept.append((cand, run))
                        break
        queues = deferred
    return kept


def _library_items(library: Library, files: Mapping[str, bytes], count: int, seed: int) -> tuple[
    list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], dict[str, bytes]
]:  # fmt: skip
    src, hidden = _split_tree(library, files)
    trees: dict[str, bytes] = {}
    base = f"trees/{library.dist}"
    for rel, data in src.items():
        trees[f"{base}/src/{rel}"] = data
    for rel, data in hidden.items():
        trees[f"{base}/hidden/{rel}"] = data
    visible: dict[str, tuple[str, list[str]]] = {}
    for module, test_path in library.modules.items():
        names = visible_tests(library, test_path, hidden[test_path])
        vpath = _visible_path(library, test_path)
        trees[f"{base}/visible/{vpath}"] = visible_source(hidden[test_path], names)
        visible[module] = (vpath, names)
    pristine = {m: files[m].decode("utf-8") for m in library.modules}
    with tempfile.TemporaryDirectory(prefix="proctor-mutants-") as tree:
        _write_tree(tree, {**src, **hidden})
        cands: list[_Candidate] = []
        for module, test_path in sorted(library.modules.items()):
            cands.extend(candidates(module, pristine[module], _coverage(tree, module, test_path)))
        kept = _select(library, cands, count, seed, tree, pristine)
    packet: list[dict[str, Any]] = []
    private: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    for index, (cand, run) in enumerate(sorted(kept, key=lambda k: k[0].key)):
        item = f"{library.dist}-m{index:02d}"
        vpath, names = visible[cand.module]
        test_path = library.modules[cand.module]
        mutated = apply_patch(pristine[cand.module], cand.line, cand.old, cand.new, cand.module)
        failing = [name for name, _ in run.failing]
        folded = {n.split("[", 1)[0] for n in failing}
        packet.append(
            {
                "item": item,
                "prompt": _prompt(library, cand.module, vpath, run.failing),
                "snapshot": library.dist,
                "metadata": {
                    "library": library.name,
                    "version": library.version,
                    "module": cand.module,
                    "mutation_kind": cand.kind,
                    "features": list(FEATURES),
                    "scope": [cand.module],
                    "failing_tests": len(failing),
                },
            }
        )
        private.append(
            {
                "item": item,
                "snapshot": {
                    "tree": f"{base}/src",
                    "visible": {"from": f"{base}/visible/{vpath}", "to": vpath, "tests": names},
                    "mutation": {"path": cand.module, "line": cand.line, "old": list(cand.old), "new": list(cand.new)},
                    "mutant_sha256": sha256_hex(mutated.encode("utf-8")),
                },
                "verifier": {
                    "argv": ["{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", library.test_dir],
                    "seal": [vpath],
                },
                "hidden": [
                    {"from": f"{base}/hidden/{test_path}", "to": test_path, "sha256": sha256_hex(hidden[test_path])}
                ],
                "fix": [{"path": cand.module, "sha256": sha256_hex(files[cand.module])}],
                "function": cand.function,
                "mutation_kind": cand.kind,
                "failing": failing,
                "visible_detects": any(n in folded for n in names),
            }
        )
        answers.append(
            {
                "item": item,
                "match": f"task_id: {item}",
                "answer": render_files({cand.module: pristine[cand.module]}),
                "wrong": [render_files({cand.module: mutated})],
            }
        )
    return packet, private, answers, trees


def build_mutants(
    out: str | os.PathLike[str],
    specs: Sequence[str],
    *,
    seed: int = 0,
    per_package: int = 16,
    cache: str | None = None,
    download: bool = True,
) -> dict[str, Any]:
    """Build the mutant suite into `out` from the pinned sdists `specs` (``NAME==VERSION`` each).

    Deterministic: the same sdists, seed and count give the same bytes.
    """
    if not specs:
        raise EvalRefusal(Code.SUITE_PACKAGE_SPEC_INVALID, "name at least one --package NAME==VERSION")
    if isinstance(per_package, bool) or per_package < 1:
        raise EvalRefusal(Code.SUITE_INVALID, "per_package must be a positive integer")
    libraries = sorted({parse_spec(s).dist: parse_spec(s) for s in specs}.values(), key=lambda lib: lib.dist)
    packet: list[dict[str, Any]] = []
    private: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    extra: dict[str, bytes] = {}
    sdists: list[dict[str, str]] = []
    for library in libraries:
        path, raw = fetch_sdist(library, cache=cache, download=download)
        p, q, a, trees = _library_items(library, _unpack(library, raw, path), per_package, seed)
        packet += p
        private += q
        answers += a
        extra.update(trees)
        sdists.append({"package": library.name, "version": library.version, "file": library.sdist,
                       "sha256": library.sha256})  # fmt: skip
    sim = b"".join(canonical_line({k: v for k, v in a.items() if k != "item"}) for a in sorted(answers, key=lambda a: a["item"]))
    extra["sim_answers.jsonl"] = sim
    folder = os.fspath(out)
    stale = os.path.join(folder, "private", "trees")
    if os.path.isdir(stale):
        shutil.rmtree(stale)
    return write_suite(
        folder,
        suite="mutants",
        kind="repo_task",
        version=SUITE_VERSION,
        source={
            "package": " ".join(f"{s['package']}=={s['version']}" for s in sdists),
            "version": None,
            "file": "sdists",
            "sha256": sha256_hex(canonical_bytes([[s["file"], s["sha256"]] for s in sdists])),
            "sdists": sdists,
        },
        packet=packet,
        private=private,
        extra_private=extra,
        build={"builder": "mutants", "seed": seed, "per_package": per_package},
    )


# --- an item's workspace --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MutantItem:
    """One mutant item resolved against its suite folder (see `mutant_item`).

    Attributes:
        item: the item id.
        suite_dir: the suite folder.
        prompt: the packet's prompt.
        scope: the workspace paths a fix may change (the mutated module).
        record: the private record (``snapshot``, ``verifier``, ``hidden``, ``fix``).
    """

    item: str
    suite_dir: str
    prompt: str
    scope: tuple[str, ...]
    record: Mapping[str, Any]

    def private_path(self, rel: str) -> str:
        """A path of the suite's private part (``trees/...``), refused if it leaves ``private/``."""
        parts = rel.split("/")
        if not rel or rel.startswith("/") or ".." in parts or "" in parts:
            raise EvalRefusal(Code.PRIVATE_INVALID, f"not a plain relative path: {rel!r}", self.suite_dir)
        return os.path.join(self.suite_dir, "private", *parts)


def mutant_item(suite: Suite, item: str) -> MutantItem:
    """The item `item` of a loaded mutant suite (``suite_item_unknown``; ``suite_invalid`` without a snapshot)."""
    packet = suite.packet.get(item)
    record = suite.private[item].record
    if not isinstance(record.get("snapshot"), dict):
        raise EvalRefusal(Code.SUITE_INVALID, f"item {item!r} has no snapshot", suite.folder)
    scope = packet.metadata.get("scope")
    if not isinstance(scope, list) or not all(isinstance(s, str) for s in scope):
        raise EvalRefusal(Code.SUITE_INVALID, f"item {item!r}: metadata.scope must be a list of paths", suite.folder)
    return MutantItem(item, suite.folder, packet.prompt, tuple(scope), record)


_GIT_ENV: Final = {
    "GIT_AUTHOR_NAME": "proctor",
    "GIT_AUTHOR_EMAIL": "proctor@localhost",
    "GIT_COMMITTER_NAME": "proctor",
    "GIT_COMMITTER_EMAIL": "proctor@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def materialize(item: MutantItem, dest: str | os.PathLike[str]) -> str:
    """Make the item's workspace at `dest` (absent or an empty folder): a git repository whose one
    commit (the baseline) holds the library's tree, the visible tests and the mutated module.

    Returns the baseline commit's id. The hidden tests are not in it (`MutantItem.record` names them).
    """
    folder = os.path.abspath(os.fspath(dest))
    if os.path.lexists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise EvalRefusal(Code.SUITE_INVALID, "the destination exists and is not an empty folder", folder)
    snap = item.record["snapshot"]
    tree = item.private_path(snap["tree"])
    files: dict[str, bytes] = {}
    for top, dirs, names in os.walk(tree):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(top, name)
            files[os.path.relpath(path, tree).replace(os.sep, "/")] = read_bytes(path)
    visible = snap["visible"]
    files[visible["to"]] = read_bytes(item.private_path(visible["from"]))
    mutation = snap["mutation"]
    path = mutation["path"]
    if path not in files:
        raise EvalRefusal(Code.SUITE_INVALID, f"item {item.item!r}: {path} is not in the tree", tree)
    text = apply_patch(files[path].decode("utf-8"), mutation["line"], mutation["old"], mutation["new"], path)
    files[path] = text.encode("utf-8")
    if sha256_hex(files[path]) != snap["mutant_sha256"]:
        raise EvalRefusal(Code.SUITE_INVALID, f"item {item.item!r}: the mutated file's sha256 differs", tree)
    os.makedirs(folder, exist_ok=True)
    _write_tree(folder, files)
    git_dir = os.path.join(folder, ".git")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", f"baseline: {item.item}"]):
        done = run_git(args, git_dir=git_dir, work_tree=folder, env=_GIT_ENV)
        if done.returncode != 0:
            raise EvalRefusal(Code.SUITE_INVALID, f"git {args[0]} failed: {done.stderr.decode(errors='replace')}", folder)
    head = read_bytes(os.path.join(git_dir, "refs", "heads", "main")).decode().strip()
    return head


TASK_BUDGET: Final = {"max_dispatches": 3, "max_stagnant": 3, "timeout_s": 600, "verify_timeout_s": 300}


def write_task(item: MutantItem, folder: str | os.PathLike[str]) -> str:
    """Lay out a gated-path task folder for the item (docs/gated-path.md): ``workspace/`` made by
    `materialize`, the hidden tests under ``hidden/`` (outside the workspace), ``task.json``.

    Returns the task file's path. `folder` must be absent or empty.
    """
    root = os.path.abspath(os.fspath(folder))
    if os.path.lexists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise EvalRefusal(Code.SUITE_INVALID, "the task folder exists and is not an empty folder", root)
    materialize(item, os.path.join(root, "workspace"))
    hidden = []
    for entry in item.record["hidden"]:
        data = read_bytes(item.private_path(entry["from"]))
        if sha256_hex(data) != entry["sha256"]:
            raise EvalRefusal(Code.SUITE_INVALID, f"item {item.item!r}: a hidden test's sha256 differs", entry["from"])
        rel = "hidden/" + entry["to"]
        _write_tree(root, {rel: data})
        hidden.append({"from": rel, "to": entry["to"]})
    verifier = item.record["verifier"]
    task = {
        "task_id": item.item,
        "prompt": item.prompt,
        "features": list(FEATURES),
        "scope": list(item.scope),
        "verifier": {"argv": list(verifier["argv"]), "seal": list(verifier["seal"]), "hidden": hidden},
        "budget": dict(TASK_BUDGET),
    }
    path = os.path.join(root, "task.json")
    with open(path, "wb") as f:
        f.write(canonical_bytes(task) + b"\n")
    return path
