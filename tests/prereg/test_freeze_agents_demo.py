"""The committed agents-demo preregistration (a repo_task suite) stays frozen, valid and plannable."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import run_proctor
from tests.support.paths import REPO

AGENTS_DEMO = REPO / "prereg" / "agents-demo"


def test_agents_demo_is_frozen_valid_and_plans_the_same_bytes_twice(tmp_path: Path) -> None:
    result = run_proctor("prereg", "check", str(AGENTS_DEMO))
    assert result.code == 0, result.out
    assert result.out["study"] == "agents-demo" and result.out["frozen"]
    # budgets cover the worst case; the one warning is the honest one: 4 toy tasks cannot power a comparison
    assert [w.split(":")[0] for w in result.out["warnings"]] == ["comparison middle vs strong on single-shot"]
    outs = []
    for name in ("one.jsonl", "two.jsonl"):
        planned = run_proctor("plan", str(AGENTS_DEMO), "--scope", "@stages", "--out", str(tmp_path / name))
        assert planned.code == 0 and planned.out["requests"] == 12, planned.out
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
