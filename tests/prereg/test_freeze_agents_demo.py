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
    # budgets cover the expected case (notional prices; each system's cap and the ceiling say so), and 8 mutant
    # tasks cannot power a comparison: the honest warnings
    assert [w.split(":")[0] for w in result.out["warnings"]] == [
        "system cheap", "system middle", "system strong", "ceiling",
        "the systems' caps add up to more than the overall cap", "comparison middle vs strong on single-shot"]
    assert result.out["budget"]["covered"]
    # the move to the mutant suite, then the Ray stage: both before any stage ran
    amendments = result.out["frozen"]["amendments"]
    assert len(amendments) == 2
    assert all(sorted(c["path"] for c in a["changed"]) == ["PREREG.md", "design.toml"] for a in amendments)
    outs = []
    for name in ("one.jsonl", "two.jsonl"):
        planned = run_proctor("plan", str(AGENTS_DEMO), "--scope", "@stages", "--out", str(tmp_path / name))
        # stage smoke: 2 items x (2 systems x single-shot + the cascade once); stage A: 8 items x (3 systems x
        # 2 arms + the cascade once, under cheap); stage ray: 4 items x 3 systems x 2 arms (no cascade)
        assert planned.code == 0 and planned.out["requests"] == 2 * 3 + 8 * 7 + 4 * 6, planned.out
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
