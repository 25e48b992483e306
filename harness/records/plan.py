"""One line of a plan (`plan-request.v1`): the record the planner writes and every reader reads back.

The manual: docs/records.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["PLAN_REQUEST_KIND", "PlanCell"]

PLAN_REQUEST_KIND: Final = "plan-request.v1"


@dataclass(frozen=True)
class PlanCell:
    """One planned request: where it runs, what it sends, and the hashes that pin both.

    Attributes:
        run_id: derived from (study, stage, system, item, arm, repeat); unique in the plan.
        stage: the registered stage (`matrix` / `full` for those scopes).
        system: the registered system slot; provider/model/api_model/api_shape/setting: how it is called.
        lane, lane_position, arm_position: the interleaving the runner follows.
        prompt: the exact user prompt; request_body: the exact provider body (UTF-8 text).
    """

    run_id: str
    study: str
    stage: str | None
    system: str
    provider: str
    model: str
    api_model: str
    api_shape: str
    setting: str
    item: str
    arm: str
    repeat: int
    lane: int
    lane_position: int
    arm_position: int
    prompt: str
    prompt_sha256: str
    request_body: str
    request_sha256: str

    @property
    def body(self) -> bytes:
        """The exact request body bytes (their sha256 is `request_sha256`)."""
        return self.request_body.encode("utf-8")

    def to_json(self) -> dict[str, Any]:
        """The plan line (without its newline), as the planner writes it."""
        return {"kind": PLAN_REQUEST_KIND, **{name: getattr(self, name) for name in PlanCell.__dataclass_fields__}}
