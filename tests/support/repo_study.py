"""A tiny frozen preregistration on the repository-task suite (evals/tasks-suite), run against the simulator
with the catalog's `llm-edit` worker: the builders of the repo_task runner tests (tests/e2e/test_run_repo_task.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.prereg.freeze import freeze
from tests.support.design import write_design
from tests.support.paths import REPO

TASKS_SUITE = REPO / "evals" / "tasks-suite"


def repo_prereg(root: Path, *, caps: tuple[float, float] = (1.0, 1.0), reserve: float = 0.01, items: int = 4,
                deadline: float = 60, retries: int = 1, study: str = "rt", suite: Path = TASKS_SUITE,
                catalog: str | None = None, frozen: bool = True) -> Path:
    """A frozen preregistration: systems `cheap` (sim-flash) and `strong` (sim-k3), one arm, stage A, on
    `suite` (default the bundled tasks suite), with `catalog` as its catalog.toml when given."""
    packet_sha = json.loads((suite / "SUITE.json").read_text())["packet_sha256"]
    design = {
        "study": {"id": study, "seed": 17, "title": "repo-task runner test"},
        "suite": {"name": "tasks", "packet": str(suite / "packet.jsonl"), "packet_sha256": packet_sha},
        "draw": {"items": items},
        "systems": [
            {"slot": "cheap", "provider": "sim", "model": "sim-flash", "setting": "default",
             "pricing_key": "sim-flash", "cap_usd": caps[0]},
            {"slot": "strong", "provider": "sim", "model": "sim-k3", "setting": "default",
             "pricing_key": "sim-k3", "cap_usd": caps[1]},
        ],
        "arms": [{"id": "edit", "template": "{prompt}"}],
        "stages": [{"id": "A", "systems": ["cheap", "strong"], "arms": ["edit"], "items": items, "repeats": 1}],
        "budgets": {"reserve_per_item_usd": reserve, "overall_cap_usd": 3.0, "ceiling_margin_usd": 0.2,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 2, "attempt_deadline_s": deadline, "reruns": 1, "transport_retries": retries,
                "max_output_tokens": 512, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                     "comparisons": [{"a": "cheap", "b": "strong", "arm": "edit", "margin": 0.2,
                                      "expected_a": 0.5, "expected_b": 0.9, "correlation": 0.3}]},
    }
    folder = root / "prereg" / study
    folder.mkdir(parents=True)
    write_design(folder, design, "# repo-task runner test\n\nRegistered before running.\n")
    if catalog is not None:
        (folder / "catalog.toml").write_text(catalog)
    if frozen:
        freeze(folder)
    return folder
