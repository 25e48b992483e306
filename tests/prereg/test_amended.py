"""harness.prereg.amended: a stage's stored plan against its plan under the current freeze.

The committed `results/agents-gemma/pilot` was planned before the plan header recorded the arms'
workers (`arms`); its design is unchanged, so it still stands, and only its design pins what is missing.
"""

from __future__ import annotations

import json

from harness.prereg.amended import check_stage_plan
from harness.prereg.frozen import check_frozen
from harness.run.setup import stage_plan_bytes
from tests.support.paths import REPO

PREREG = REPO / "prereg" / "agents-gemma"
STORED = REPO / "results" / "agents-gemma" / "pilot" / "plan.jsonl"


def _with_header(data: bytes, **changes: object) -> bytes:
    head, _, rest = data.partition(b"\n")
    doc = json.loads(head)
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n" + rest


def test_a_plan_from_before_the_arms_header_stands_while_its_design_is_the_same() -> None:
    frozen = check_frozen(PREREG)
    fresh = stage_plan_bytes(frozen.path, frozen.design, "pilot")
    stored = STORED.read_bytes()
    assert b'"arms"' in fresh.partition(b"\n")[0] and b'"arms"' not in stored.partition(b"\n")[0]
    assert check_stage_plan(stored, fresh, frozen, "pilot").ok
    # another design: the missing arms are a difference again (an amendment since the stage ran changed them)
    other = _with_header(fresh, design_sha256="0" * 64)
    verdict = check_stage_plan(stored, other, frozen, "pilot")
    assert not verdict.ok and verdict.code == "amendment_changes_stage" and "arms" in verdict.message
    # a stored plan that records arms must match them, as before
    head = json.loads(fresh.partition(b"\n")[0])
    arms = [{**a, "worker": {**a["worker"], "repair_turns": 3}} for a in head["arms"]]
    verdict = check_stage_plan(_with_header(fresh, arms=arms), fresh, frozen, "pilot")
    assert not verdict.ok and "arms" in verdict.message
