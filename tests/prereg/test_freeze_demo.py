"""The committed demo preregistration stays frozen, valid and plannable."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import run_proctor
from tests.support.paths import REPO

DEMO = REPO / "prereg" / "demo"


def test_demo_prereg_is_frozen_and_valid() -> None:
    result = run_proctor("prereg", "check", str(DEMO))
    assert result.code == 0, result.out
    assert result.out["study"] == "demo"
    assert result.out["frozen"]


def test_demo_prereg_plans_the_same_bytes_twice(tmp_path: Path) -> None:
    outs = []
    for name in ("one.jsonl", "two.jsonl"):
        result = run_proctor("plan", str(DEMO), "--scope", "pilot", "--out", str(tmp_path / name))
        assert result.code == 0, result.out
        assert result.out["requests"] == 180
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
