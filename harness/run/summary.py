"""What `run_stage` and `preflight` return: the summary, and the progress a callback receives.

The manual: docs/running.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunProgress", "RunSummary", "SystemProgress"]

@dataclass(frozen=True)
class SystemProgress:
    """One system's counts.

    `items_admitted` (distinct items ever admitted), `attempts` and `spend_usd` count
    every invocation of the stage, so a resume that only completes what an earlier
    invocation admitted does not read as "nothing admitted"; `items_admitted_now`
    and `items_refused` count this invocation's admission decisions; `items` is how many
    items the stage holds for the system (what `items_admitted` counts toward).
    """

    system: str
    items_admitted: int
    items_refused: int
    attempts: int
    standing: int
    cells: int
    spend_usd: float
    cap_usd: float
    state: str  # running | paused | stopped | refused | done
    items_admitted_now: int = 0
    items: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RunProgress:
    """What a progress callback receives after every admission, attempt and stop."""

    study: str
    stage: str
    total_usd: float
    ceiling_usd: float
    crossed: bool
    systems: tuple[SystemProgress, ...]

    def to_json(self) -> dict[str, Any]:
        return {"study": self.study, "stage": self.stage, "total_usd": self.total_usd,
                "ceiling_usd": self.ceiling_usd, "crossed": self.crossed,
                "systems": [s.to_json() for s in self.systems]}


@dataclass(frozen=True)
class RunSummary:
    """What `run_stage` returns.

    Attributes:
        exit_code: 0 when every selected system has a standing final for every cell
            of the stage and none is exhausted; 1 otherwise (stopped, paused, refused,
            interrupted, exhausted cells, or a preflight problem). Refusals are raised, not returned.
        mode: run | dry_run | preflight.
        folder: the stage folder.
        complete: every cell stands and none is exhausted.
        stops: [{system, cause, detail}] of this invocation.
        cells: per cell (dry run and run): run_id, system, item, arm, repeat, state
            (standing | exhausted | owed | paused | stopped), final class/action, next {rerun, attempt};
            an `exhausted` cell stands on a transport failure: never scored, and not complete.
        problems: preflight problems [{check, message, ...}] (preflight only).
    """

    ok: bool
    exit_code: int
    mode: str
    study: str
    stage: str
    folder: str
    complete: bool
    progress: RunProgress
    stops: tuple[dict[str, Any], ...] = ()
    cells: tuple[dict[str, Any], ...] = ()
    problems: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "exit_code": self.exit_code, "mode": self.mode, "study": self.study,
                "stage": self.stage, "folder": self.folder, "complete": self.complete,
                "progress": self.progress.to_json(), "stops": list(self.stops), "cells": list(self.cells),
                "problems": list(self.problems), **self.extra}
