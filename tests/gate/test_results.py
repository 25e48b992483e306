"""The expected test ids (read with `ast`) and the proctor's pytest report (`harness.gate.results`).

The report tests run real pytest subprocesses with the plugin loaded under a fresh module name and
its report on an inherited descriptor, as `proctor verify` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.gate.results import (
    expected_tests,
    judge_report,
    plugin_module_name,
    plugin_source,
    pytest_position,
    with_plugin,
)

TESTS = b"""\
import pytest

def test_a():
    pass

@pytest.mark.parametrize("x", [1, 2])
def test_b(x):
    assert x

def helper_test():
    pass

class TestGroup:
    def test_c(self):
        pass

    class TestInner:
        def test_d(self):
            pass

class TestWithInit:
    def __init__(self):
        pass

    def test_never(self):
        pass

class TestOff:
    __test__ = False

    def test_off(self):
        pass

if True:
    def test_hidden_in_if():
        pass
"""


def test_expected_ids_come_from_the_source_without_importing_it(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    source = TESTS + f"open({str(marker)!r}, 'w').write('x')\n".encode()
    ids, problems = expected_tests([("tests/test_x.py", source), ("tests/helpers.py", b"def test_no(): pass\n")])
    assert ids == [
        "tests/test_x.py::TestGroup::TestInner::test_d",
        "tests/test_x.py::TestGroup::test_c",
        "tests/test_x.py::test_a",
        "tests/test_x.py::test_b",
    ]
    assert problems == [] and not marker.exists()
    ids, problems = expected_tests([("t/x_test.py", b"def test_z(:\n")])
    assert ids == [] and "t/x_test.py does not parse" in problems[0]
    assert expected_tests([("test_off.py", b"__test__ = False\ndef test_q(): pass\n")]) == ([], [])


@pytest.mark.parametrize(
    ("argv", "at"),
    [
        (["/py", "-m", "pytest", "-q"], 2),
        (["/py", "-I", "-m", "pytest"], 3),
        (["/venv/bin/pytest", "tests"], 0),
        (["/py", "check.py"], None),
        (["/py", "-c", "import pytest"], None),
        (["/py", "-m", "unittest"], None),
    ],
)
def test_a_pytest_verifier_is_recognised(argv: list[str], at: int | None) -> None:
    assert pytest_position(argv) == at
    if at is not None:
        assert with_plugin(argv, "mod")[at + 1 : at + 3] == ["-p", "mod"]


def _line(**obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


START = _line(event="start", pytest="8")
END = _line(event="end", exitstatus=0, collected=2, tampered=[])


def _test(path: str, name: str, outcome: str = "passed", when: str = "call") -> bytes:
    return _line(event="test", path=path, name=name, when=when, outcome=outcome)


def test_every_expected_id_must_be_reported_passed() -> None:
    expected = ["t/test_x.py::test_a", "t/test_x.py::test_b"]
    full = START + _test("t/test_x.py", "test_a") + _test("t/test_x.py", "test_b[1]") + _test("t/test_x.py", "test_b[2]")
    assert judge_report(full + END, expected).ok
    short = judge_report(START + _test("t/test_x.py", "test_a") + END, expected)
    assert not short.ok and short.not_passed == ("t/test_x.py::test_b",)
    one_param_failed = full.replace(b'"test_b[2]", "when": "call", "outcome": "passed"',
                                    b'"test_b[2]", "when": "call", "outcome": "failed"')  # fmt: skip
    bad = judge_report(one_param_failed + END, expected)
    assert not bad.ok and bad.failed == ("t/test_x.py::test_b",) and bad.not_passed == ("t/test_x.py::test_b",)
    skipped = judge_report(START + _test("t/test_x.py", "test_a", "skipped", "setup") + END, ["t/test_x.py::test_a"])
    assert not skipped.ok and skipped.failed == ()
    extra_failure = judge_report(full + _test("t/other.py", "test_z", "failed") + END, expected)
    assert not extra_failure.ok and extra_failure.failed == ("t/other.py::test_z",)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty"),
        (START + _test("t/test_x.py", "test_a"), "no end"),
        (START + b"{not json\n" + END, "not a proctor report line"),
        (START + _line(event="other") + END, "not a proctor report line"),
        (START + END + _test("t/test_x.py", "test_a"), "not a proctor report line"),
        (_test("t/test_x.py", "test_a") + END, "not a proctor report line"),
        (START + _test("t/test_x.py", "test_a") + _line(event="end", exitstatus=1, collected=1, tampered=[]),
         "status 1"),
        (START + _test("t/test_x.py", "test_a") + _line(event="end", exitstatus=0, collected=1, tampered=["x"]),
         "internals were replaced"),
    ],
)
def test_an_empty_short_or_unparsable_report_fails(data: bytes, problem: str) -> None:
    got = judge_report(data, ["t/test_x.py::test_a"])
    assert not got.ok and got.problem is not None and problem in got.problem, got


def _run_pytest(tmp_path: Path, test_source: str) -> tuple[int, bytes]:
    """pytest on one test file in `tmp_path/tree`, the plugin under a fresh name, its report on an fd."""
    tree, plugin_dir = tmp_path / "tree", tmp_path / "plugin"
    tree.mkdir()
    plugin_dir.mkdir()
    (tree / "test_it.py").write_text(test_source)
    module = plugin_module_name()
    (plugin_dir / f"{module}.py").write_bytes(plugin_source())
    report = tmp_path / "report.jsonl"
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PROCTOR", "COV"))}
    env.update(PYTHONPATH=str(plugin_dir), PROCTOR_REPORT_FD=str(fd), PYTHONDONTWRITEBYTECODE="1")
    argv = with_plugin([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "."], module)
    try:
        done = subprocess.run(argv, cwd=tree, env=env, pass_fds=(fd,), capture_output=True, timeout=120, check=False)
    finally:
        os.close(fd)
    return done.returncode, report.read_bytes()


def test_the_plugin_reports_a_real_run_and_hides_its_descriptor(tmp_path: Path) -> None:
    source = "import os\n\ndef test_ok():\n    assert 'PROCTOR_REPORT_FD' not in os.environ\n\ndef test_bad():\n    assert 1 == 2\n"
    code, report = _run_pytest(tmp_path, source)
    assert code == 1
    got = judge_report(report, ["test_it.py::test_bad", "test_it.py::test_ok"])
    assert got.ended and got.not_passed == ("test_it.py::test_bad",) and got.failed == ("test_it.py::test_bad",)


def test_an_exit_forced_at_import_leaves_no_end(tmp_path: Path) -> None:
    code, report = _run_pytest(tmp_path, "import os\nos._exit(0)\n\ndef test_ok():\n    pass\n")
    assert code == 0
    got = judge_report(report, ["test_it.py::test_ok"])
    assert not got.ok and not got.ended and got.not_passed == ("test_it.py::test_ok",)


def test_a_report_rewritten_to_passed_still_fails(tmp_path: Path) -> None:
    forge = (
        "import _pytest.reports as r\n_made = r.TestReport.from_item_and_call\n"
        "def _forged(cls, item, call):\n    rep = _made(item, call)\n    rep.outcome = 'passed'\n    return rep\n"
        "r.TestReport.from_item_and_call = classmethod(_forged)\n\ndef test_bad():\n    assert 1 == 2\n"
    )
    code, report = _run_pytest(tmp_path, forge)
    assert code == 0  # pytest itself says "1 passed"
    got = judge_report(report, ["test_it.py::test_bad"])
    assert not got.ok and got.failed == ("test_it.py::test_bad",)
    assert got.tampered == ("_pytest.reports.TestReport.from_item_and_call",)
