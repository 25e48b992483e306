"""The engine's running counters (issue 16): after every event of real runs, the progress they give
equals a full recount from the cells and spend parts, and the callback's values are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.run.engine import EngineCore
from harness.run.runner import run_stage
from harness.run.summary import RunProgress
from tests.support.study import Sim, logs, prereg, system, urls


@pytest.fixture(name="checks")
def checks_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Compare `progress()` with `recount()` after every run event, admission and report of every engine."""
    done: list[int] = [0]

    def check(engine: EngineCore) -> None:
        assert engine.progress() == engine.recount()
        assert engine.total() == engine.recount().total_usd
        done[0] += 1

    event, admit, report = EngineCore._event_locked, EngineCore._admit_locked, EngineCore.report

    def checked_event(self: EngineCore, name: str, **fields: Any) -> dict[str, Any]:
        out = event(self, name, **fields)
        check(self)
        return out

    def checked_admit(self: EngineCore, *args: Any) -> bool:
        out = admit(self, *args)
        check(self)
        return out

    def checked_report(self: EngineCore) -> None:
        check(self)
        report(self)

    monkeypatch.setattr(EngineCore, "_event_locked", checked_event)
    monkeypatch.setattr(EngineCore, "_admit_locked", checked_admit)
    monkeypatch.setattr(EngineCore, "report", checked_report)
    yield done


def _recounted(p: RunProgress, folder: Path) -> None:
    """The last progress against the files: attempts (as the run log names them) and standing finals."""
    got = logs(folder)
    assert len(got["attempts"]) == sum(s.attempts for s in p.systems)
    for s in p.systems:
        assert s.attempts == sum(1 for e in got["run"] if e["event"] == "attempt" and e["system"] == s.system)
        last: dict[str, dict[str, Any]] = {}
        for f in got["finals"]:
            last[f["run_id"]] = f
        assert s.standing == sum(1 for f in last.values() if f["system"] == s.system and f["action"] == "stand")


def test_counters_equal_a_recount_after_every_event(tmp_path: Path, sim: Sim, checks: list[int]) -> None:
    # failures: reruns and transport retries; a small cap: refusals; then a resume counts from the files
    url = sim([system("sim-flash", 0.7, server_error=0.3), system("sim-glm", 0.4, rate_limited=0.2)])
    folder_p = prereg(tmp_path, caps=(0.03, 1.0), reserve=0.01, retries=1, items=10)
    seen: list[RunProgress] = []
    first = run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url), progress=seen.append)
    assert checks[0] > 50 and seen
    assert any(s.items_refused for s in first.progress.systems)
    _recounted(first.progress, Path(first.folder))
    before = checks[0]
    again = run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url), progress=seen.append)
    assert checks[0] > before
    _recounted(again.progress, Path(again.folder))


def test_a_clean_run_reports_the_same_progress_as_a_recount(tmp_path: Path, sim: Sim, checks: list[int]) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    seen: list[RunProgress] = []
    summary = run_stage(prereg(tmp_path, items=8, repeats=2), "A", tmp_path / "results", base_urls=urls(url),
                        progress=seen.append)
    assert summary.exit_code == 0
    assert [(s.standing, s.cells, s.items, s.attempts, s.state) for s in summary.progress.systems] == [
        (16, 16, 8, 16, "done"), (16, 16, 8, 16, "done")]
    assert seen[-1].systems == summary.progress.systems
    standing = [sum(s.standing for s in p.systems) for p in seen]
    assert standing == sorted(standing) and standing[-1] == 32
