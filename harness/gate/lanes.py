"""The lane table: which tier of worker a task goes to, and whether it touches production.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.gate.task import Task

__all__ = ["PRODUCTION_ENTRYPOINTS", "LaneDecision", "choose_lane", "production_entrypoints"]

PRODUCTION_ENTRYPOINTS = (
    "run_week.ps1",
    "src.run_all",
    "src.run_weekly",
    "run_readiness_doctor",
    "morning_battery",
)
_FLASH = frozenset({"localized", "bounded", "known_location", "objective_acceptance"})
_GLM = frozenset({"multi_module", "unfamiliar_repo", "substantial_refactor"})
_K3 = frozenset({"open_ended", "research_engineering", "marathon"})


@dataclass(frozen=True)
class LaneDecision:
    """The lane for a task, why, and the production entrypoints it names."""

    lane: str
    reason: str
    explicit: bool
    production_entrypoints: tuple[str, ...]

    @property
    def production(self) -> bool:
        return bool(self.production_entrypoints)

    def to_json(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "reason": self.reason,
            "explicit": self.explicit,
            "production": self.production,
            "production_entrypoints": list(self.production_entrypoints),
        }


def production_entrypoints(task: Task) -> tuple[str, ...]:
    """The production entrypoints named in the task's prompt, scope or verifier (dotted or slashed)."""
    haystack = "\n".join([task.prompt, *task.scope, *task.verifier.argv])
    found = []
    for name in PRODUCTION_ENTRYPOINTS:
        forms = {name, name.replace(".", "/")} if not name.endswith(".ps1") else {name}
        if any(form in haystack for form in forms):
            found.append(name)
    return tuple(found)


def choose_lane(task: Task) -> LaneDecision:
    """Apply the lane table to the task's features; an explicit lane overrides it."""
    production = production_entrypoints(task)
    if task.lane is not None:
        return LaneDecision(task.lane, f"explicit: {task.lane_reason}", True, production)
    features = set(task.features)
    if features & _K3:
        lane, why = "k3", f"open-ended work ({', '.join(sorted(features & _K3))})"
    elif features & _GLM:
        lane, why = "glm", f"broad change ({', '.join(sorted(features & _GLM))})"
    elif features >= _FLASH:
        lane, why = "flash", "localized, bounded, known location, objective acceptance"
    else:
        missing = ", ".join(sorted(_FLASH - features))
        lane, why = "glm", f"default: not every flash condition holds (missing {missing})"
    return LaneDecision(lane, why, False, production)
