"""The static scan for known ways to forge a verdict (`harness.gate.scan`), on real files in a real tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.evidence.tree import scan_tree
from harness.gate.scan import PATTERNS, scan_changed, scan_source


def _patterns(source: str, path: str = "pkg/mod.py") -> set[tuple[int, str]]:
    return {(s.line, s.pattern) for s in scan_source(path, source.encode())}


@pytest.mark.parametrize(
    ("source", "pattern"),
    [
        ("import os\nos._exit(0)\n", "os._exit"),
        ("from os import _exit\n_exit(0)\n", "os._exit"),
        ("import posix\nposix._exit(0)\n", "os._exit"),
        ("import atexit\n", "atexit"),
        ("from atexit import register as r\n", "atexit"),
        ("import sys\nsys.modules['wordfreq'] = object()\n", "sys.modules[...] ="),
        ("import sys as s\ns.modules.update(x=1)\n", "sys.modules[...] ="),
        ("import _pytest.reports\n_pytest.reports.TestReport.outcome = 'passed'\n", "writes into a test framework"),
        ("import pytest\npytest.fail = print\n", "writes into a test framework"),
        ("import unittest as u\nu.TestCase.assertEqual = lambda *a: None\n", "writes into a test framework"),
        ("import builtins\nbuiltins.abs = len\n", "writes into a test framework"),
        ("from _pytest import runner\nrunner.call_and_report = None\n", "writes into a test framework"),
        ("import builtins\nsetattr(builtins, 'len', None)\n", "writes into a test framework"),
        ("__builtins__['len'] = None\n", "writes into a test framework"),
        ("class A:\n    def __eq__(self, o):\n        return True\n", "constant __eq__/__ne__/__hash__"),
        ("class A:\n    def __ne__(self, o):\n        '''never'''\n        return False\n", "constant __eq__/__ne__/__hash__"),
        ("class A:\n    def __hash__(self):\n        return 0\n", "constant __eq__/__ne__/__hash__"),
        ("class A:\n    __eq__ = lambda self, o: True\n", "constant __eq__/__ne__/__hash__"),
        ("import sys\nsys.settrace(None)\n", "sys.settrace/sys.setprofile"),
        ("from sys import setprofile\n", "sys.settrace/sys.setprofile"),
        ("import threading\nthreading.settrace(print)\n", "sys.settrace/sys.setprofile"),
        ("import signal\nsignal.signal(signal.SIGTERM, print)\n", "signal handler"),
        ("from signal import alarm\n", "signal handler"),
        ("def f(:\n    import os; os._exit(0)\n", "unparsable"),
    ],
)
def test_each_forgery_pattern_is_flagged(source: str, pattern: str) -> None:
    assert pattern in PATTERNS
    assert pattern in {p for _, p in _patterns(source)}


def test_the_line_is_named_and_honest_code_is_not_flagged() -> None:
    honest = (
        "import os, sys\nfrom collections import Counter\n\n\nclass Word:\n    def __eq__(self, other):\n"
        "        return self.text == other.text\n\n    def __hash__(self):\n        return hash(self.text)\n\n\n"
        "def count(text):\n    sys.stdout.write(os.sep)\n    return dict(Counter(text.split()))\n"
    )
    assert _patterns(honest) == set()
    assert _patterns("x = 1\n\n\nimport os\nos._exit(3)\n") == {(5, "os._exit")}
    flagged = scan_source("a.py", b"import atexit\n")
    assert [(s.path, s.line, s.pattern) for s in flagged] == [("a.py", 1, "atexit")]


def test_a_pth_file_is_scanned_as_text() -> None:
    assert {p for _, p in _patterns("import os; os._exit(0)\n", "x.pth")} == {"os._exit"}


def test_only_added_or_changed_python_files_are_scanned(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "old.py").write_text("import atexit\n")  # in the baseline already
    (tmp_path / "pkg" / "same.py").write_text("x = 1\n")
    baseline = scan_tree(str(tmp_path), ())
    (tmp_path / "pkg" / "same.py").write_text("import os\nos._exit(0)\n")
    (tmp_path / "pkg" / "new.py").write_text("import sys\nsys.settrace(None)\n")
    (tmp_path / "notes.txt").write_text("os._exit(0)\n")
    found = scan_changed(str(tmp_path), baseline, scan_tree(str(tmp_path), ()))
    assert [(s.path, s.line, s.pattern) for s in found] == [
        ("pkg/new.py", 2, "sys.settrace/sys.setprofile"),
        ("pkg/same.py", 2, "os._exit"),
    ]
