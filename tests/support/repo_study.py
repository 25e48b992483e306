"""A tiny frozen preregistration on the repository-task suite (evals/tasks-suite), run against the simulator
with the catalog's `llm-edit` worker: the builders of the repo_task runner tests (tests/e2e/test_run_repo_task.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.prereg.freeze import freeze
from tests.support.design import write_design
from tests.support.paths import REPO
from tests.support.sim import sim_systems

TASKS_SUITE = REPO / "evals" / "tasks-suite"
MUTANTS = REPO / "evals" / "mutants"


def repo_prereg(root: Path, *, caps: tuple[float, float] = (1.0, 1.0), reserve: float = 0.01, items: int = 4,
                deadline: float = 60, retries: int = 1, study: str = "rt", suite: Path = TASKS_SUITE,
                catalog: str | None = None, frozen: bool = True, arms: list[dict[str, Any]] | None = None,
                lanes: int = 2, seed: int = 17) -> Path:
    """A frozen preregistration: systems `cheap` (sim-flash) and `strong` (sim-k3), one arm `edit` (or `arms`,
    the first of which is compared), stage A, on `suite` (default the bundled tasks suite), with `catalog` as
    its catalog.toml when given."""
    arms = arms or [{"id": "edit", "template": "{prompt}"}]
    packet_sha = json.loads((suite / "SUITE.json").read_text())["packet_sha256"]
    design = {
        "study": {"id": study, "seed": seed, "title": "repo-task runner test"},
        "suite": {"name": json.loads((suite / "SUITE.json").read_text())["suite"], "packet": str(suite / "packet.jsonl"), "packet_sha256": packet_sha},
        "draw": {"items": items},
        "systems": [
            {"slot": "cheap", "provider": "sim", "model": "sim-flash", "setting": "default",
             "pricing_key": "sim-flash", "cap_usd": caps[0]},
            {"slot": "strong", "provider": "sim", "model": "sim-k3", "setting": "default",
             "pricing_key": "sim-k3", "cap_usd": caps[1]},
        ],
        "arms": arms,
        "stages": [{"id": "A", "systems": ["cheap", "strong"], "arms": [a["id"] for a in arms], "items": items,
                    "repeats": 1}],
        "budgets": {"reserve_per_item_usd": reserve, "overall_cap_usd": 3.0, "ceiling_margin_usd": 0.2,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": lanes, "attempt_deadline_s": deadline, "reruns": 1, "transport_retries": retries,
                "max_output_tokens": 512, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                     "comparisons": [{"a": "cheap", "b": "strong", "arm": arms[0]["id"], "margin": 0.2,
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


@contextlib.contextmanager
def mutant_sim(root: Path, skills: dict[str, float], answers: Path | None = None) -> Iterator[str]:
    """`proctor sim serve` answering the mutant suite (its sim_answers, or `answers`: the reference fix at the
    system's skill, else the mutated file); yields the base URL, stops it after."""
    systems = sim_systems(root / "mutant-systems.json", skills)
    ready = root / "mutant-sim-ready.json"
    argv = [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", "--ready-file", str(ready),
            "--systems", str(systems), "--seed", "5", "--answers", str(answers or MUTANTS / "private" / "sim_answers.jsonl")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env["PROCTOR_SIM_LATENCY_SCALE"] = "0"
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the simulator did not get ready"
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
