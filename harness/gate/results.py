"""Results the code under test does not own: the expected test ids and the proctor's pytest report.

The ids of the sealed and hidden tests are read from their source with `ast`
(no workspace code is imported); a pytest verifier is run with the proctor's
plugin (`harness.gate.pytest_report`), which writes each test's outcome to an
inherited descriptor; verification passes only when every expected id is
reported passed, nothing failed and the session ended. The manual:
docs/gated-path.md; what this leaves open: docs/sandbox.md.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from typing import Final

from harness.evidence.pysource import parse_python
from harness.records.receipt import TestResults

__all__ = [
    "REPORT_KIND",
    "REPORT_LIMIT",
    "expected_tests",
    "judge_report",
    "plugin_module_name",
    "plugin_source",
    "pytest_position",
    "with_plugin",
]

REPORT_KIND: Final = "pytest-proctor-report"
_TEST_FILES: Final = ("test_*.py", "*_test.py")
REPORT_LIMIT: Final = 64 * 1024 * 1024
"""Bytes of report read; a longer report fails."""


def pytest_position(argv: Sequence[str]) -> int | None:
    """The index of the word after which pytest's own arguments start (`-m pytest`, or a pytest program)."""
    if argv and os.path.basename(argv[0]) in ("pytest", "py.test"):
        return 0
    for i in range(1, len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == "pytest":
            return i + 1
        if not argv[i].startswith("-"):
            return None
    return None


def plugin_module_name() -> str:
    """A fresh module name for the plugin: a worker cannot have planted a module by that name."""
    return f"proctor_report_{secrets.token_hex(8)}"


def plugin_source() -> bytes:
    """The plugin's source (this package's `pytest_report.py`), copied under `plugin_module_name()`."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytest_report.py"), "rb") as fh:
        return fh.read()


def with_plugin(argv: Sequence[str], module: str) -> list[str]:
    """`argv` with `-p <module>` as pytest's first arguments (argv must run pytest)."""
    at = pytest_position(argv)
    assert at is not None
    return [*argv[: at + 1], "-p", module, *argv[at + 1 :]]


def _disabled(body: Sequence[ast.stmt]) -> bool:
    """`__test__ = False` in a module or class body: pytest collects nothing there."""
    for node in body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__test__" for t in node.targets):
            return isinstance(node.value, ast.Constant) and node.value.value is False
    return False


def _class_tests(node: ast.ClassDef, prefix: str) -> list[str]:
    if not node.name.startswith("Test") or _disabled(node.body):
        return []
    if any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "__init__" for n in node.body):
        return []
    out: list[str] = []
    for child in node.body:
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and child.name.startswith("test"):
            out.append(f"{prefix}::{node.name}::{child.name}")
        elif isinstance(child, ast.ClassDef):
            out.extend(_class_tests(child, f"{prefix}::{node.name}"))
    return out


def expected_tests(files: Iterable[tuple[str, bytes]]) -> tuple[list[str], list[str]]:
    """(ids, problems): `path::[Class::]name` of each test pytest would collect from these sources
    by default, read with `ast`; a source that does not parse is a problem (its tests cannot pass)."""
    ids: list[str] = []
    problems: list[str] = []
    for path, source in sorted(files):
        if not any(fnmatch.fnmatchcase(os.path.basename(path), p) for p in _TEST_FILES):
            continue
        try:
            tree = parse_python(source, filename=path)
        except (SyntaxError, ValueError) as exc:
            problems.append(f"{path} does not parse: {exc}")
            continue
        if _disabled(tree.body):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                ids.append(f"{path}::{node.name}")
            elif isinstance(node, ast.ClassDef):
                ids.extend(_class_tests(node, path))
    return sorted(dict.fromkeys(ids)), problems


def _base_id(path: str, name: str) -> str:
    """`path::name` without pytest's parameter suffix (`test_x[1-2]` -> `test_x`)."""
    parts = name.split("::")
    parts[-1] = parts[-1].split("[", 1)[0]
    return "::".join([path.replace(os.sep, "/"), *parts])


def judge_report(data: bytes, expected: Sequence[str], problems: Sequence[str] = ()) -> TestResults:
    """Compare the plugin's report with the expected ids, id by id.

    OK only when the report parses, has a start and an end, no phase of any test failed, and each
    expected id was reported with every phase passed. An empty, short or unparsable report fails.
    """
    seen: dict[str, bool] = {}
    failed: list[str] = []
    started = ended = False
    tampered: list[str] = []
    problem = "; ".join(problems) or None
    lines = data.split(b"\n") if len(data) <= REPORT_LIMIT else []
    if len(data) > REPORT_LIMIT:
        problem = problem or f"the report is larger than {REPORT_LIMIT} bytes"
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            event = obj["event"]
            if ended:
                raise ValueError("a line after the end")
            if event == "start":
                started = True
            elif event == "test" and started:
                ident = _base_id(str(obj["path"]), str(obj["name"]))
                ok = obj["outcome"] == "passed"
                seen[ident] = seen.get(ident, True) and ok
                if obj["outcome"] == "failed" and ident not in failed:
                    failed.append(ident)
            elif event == "end" and started:
                ended = True
                tampered = [str(t) for t in obj["tampered"]]
                if obj["exitstatus"] != 0:
                    problem = problem or f"pytest ended with status {obj['exitstatus']}"
            else:
                raise ValueError(f"unexpected event {event!r}")
        except (ValueError, KeyError, TypeError) as exc:
            problem = problem or f"report line {n} is not a proctor report line ({exc})"
            break
    if problem is None and not started:
        problem = "the report is empty: the plugin never ran"
    elif problem is None and not ended:
        problem = "the report has no end: the verifier's process ended before pytest finished"
    elif problem is None and tampered:
        problem = f"pytest's internals were replaced during the run: {', '.join(tampered)}"
    not_passed = [e for e in expected if not seen.get(e, False)]
    ok = problem is None and not not_passed and not failed
    return TestResults(
        kind=REPORT_KIND,
        ok=ok,
        expected=tuple(expected),
        reported=len(seen),
        not_passed=tuple(not_passed),
        failed=tuple(failed),
        ended=ended,
        tampered=tuple(tampered),
        problem=problem,
    )
