"""The proctor's pytest plugin: each test's outcome, written to a descriptor the verifier inherited.

Self-contained (it imports nothing of `harness`): `proctor verify` copies this
file under a random module name, outside the verification copy, and loads it
with `-p` (`harness.gate.results`). It reads the descriptor's number from
`PROCTOR_REPORT_FD` and removes it from the environment at import, before any
test module (code under test) is imported. A line per test phase, then an
`end` line at the end of the session: a process that ends early (`os._exit`)
leaves no `end`, and the report fails. The manual: docs/gated-path.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest

_FD = int(os.environ.pop("PROCTOR_REPORT_FD", "-1"))
_WRITE = os.write  # bound now: code under test may replace os.write later
_DUMPS = json.dumps


def _watched() -> dict[str, Any]:
    """The pytest internals a forged verdict would replace, as they are before any test module loads."""
    import _pytest.python
    import _pytest.reports
    import _pytest.runner

    return {
        "_pytest.python.Function.runtest": _pytest.python.Function.runtest,
        "_pytest.runner.CallInfo.from_call": vars(_pytest.runner.CallInfo)["from_call"],
        "_pytest.runner.call_and_report": _pytest.runner.call_and_report,
        "_pytest.runner.pytest_runtest_makereport": _pytest.runner.pytest_runtest_makereport,
        "_pytest.reports.TestReport.from_item_and_call": vars(_pytest.reports.TestReport)["from_item_and_call"],
    }


_BEFORE = _watched()


def _emit(obj: dict[str, Any]) -> None:
    if _FD < 0:
        return
    data = (_DUMPS(obj, ensure_ascii=True) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[_WRITE(_FD, view) :]


_emit({"event": "start", "pytest": pytest.__version__})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
    raised = call.excinfo is not None
    outcome = yield
    report = outcome.get_result()
    # Passed only when pytest says so and the phase raised nothing (a report rewritten to read
    # "passed" does not change what was raised).
    result = "passed" if report.passed and not raised else "skipped" if report.skipped else "failed"
    where = os.path.relpath(str(item.path), str(item.config.invocation_params.dir))
    name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
    _emit({"event": "test", "path": where, "name": name, "when": call.when, "outcome": result})


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    changed = sorted(k for k, v in _watched().items() if v is not _BEFORE[k])
    _emit({"event": "end", "exitstatus": int(exitstatus), "collected": int(session.testscollected),
           "tampered": changed})  # fmt: skip
