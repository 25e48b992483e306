"""Shared builders for the study-runner tests: the simulator fixture, a tiny frozen preregistration.

The runner, oracle, report, crash and signal tests import the builders from here. `sim`
is a pytest fixture, provided to every test by tests/conftest.py (`pytest_plugins`).
`run_argv` and `runner_env` run `proctor run` on such a preregistration in a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.evidence.chain_read import read_log
from harness.prereg.freeze import freeze
from harness.run.layout import log_seed
from tests.support.design import write_design
from tests.support.paths import HUMANEVAL, REPO

ANSWERS = HUMANEVAL / "private" / "sim_answers.jsonl"
PACKET_SHA = json.loads((HUMANEVAL / "SUITE.json").read_text())["packet_sha256"]

Sim = Callable[..., str]


@contextlib.contextmanager
def sim_servers(root: Path) -> Iterator[Sim]:
    """Start `proctor sim serve` processes (HumanEval answers, a systems file) under `root`; each call's base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(systems: list[dict[str, Any]], *, latency_scale: float = 0.0) -> str:
        sys_file = root / f"systems-{len(procs)}.json"
        sys_file.write_text(json.dumps({"systems": systems}))
        ready = root / f"ready-{len(procs)}.json"
        argv = [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", "--ready-file", str(ready),
                "--systems", str(sys_file), "--answers", str(ANSWERS)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
        env["PROCTOR_SIM_LATENCY_SCALE"] = str(latency_scale)
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return str(json.loads(ready.read_text())["url"])

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            proc.communicate(timeout=10)


@pytest.fixture(name="sim")
def sim_fixture(tmp_path: Path) -> Iterator[Sim]:
    """Start `proctor sim serve` with the HumanEval answers and a systems file; returns its base URL."""
    with sim_servers(tmp_path) as start:
        yield start


def system(name: str, skill: float, *, latency: float = 0.0, **failures: float) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "skill": skill, "latency_s": {"dist": "fixed", "value": latency},
                           "output_tokens": {"mean": 200}}
    if failures:
        out["failures"] = {"rate_limited": 0.0, "server_error": 0.0, "timeout": 0.0, **failures}
    return out


def prereg(root: Path, *, caps: tuple[float, float] = (1.0, 1.0), reserve: float = 0.01,
           overall: float = 3.0, margin: float = 0.2, deadline: float = 20, items: int = 6,
           retries: int = 0, repeats: int = 1, anchor_remote: str | None = None,
           text: str = "# runner test\n\nRegistered before running.\n") -> Path:
    design = {
        "study": {"id": "rt", "seed": 11, "title": "runner test"},
        "suite": {"name": "humaneval", "packet": str(HUMANEVAL / "packet.jsonl"), "packet_sha256": PACKET_SHA},
        "draw": {"items": items},
        "systems": [
            {"slot": "good", "provider": "sim", "model": "sim-flash", "setting": "default",
             "pricing_key": "sim-flash", "cap_usd": caps[0]},
            {"slot": "bad", "provider": "sim", "model": "sim-glm", "setting": "default",
             "pricing_key": "sim-glm", "cap_usd": caps[1]},
        ],
        "arms": [{"id": "direct", "template": "Complete this function in one ```python block.\n\n{prompt}"}],
        "stages": [{"id": "A", "systems": ["good", "bad"], "arms": ["direct"], "items": items, "repeats": repeats}],
        "budgets": {"reserve_per_item_usd": reserve, "overall_cap_usd": overall, "ceiling_margin_usd": margin,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 2, "attempt_deadline_s": deadline, "reruns": 2, "transport_retries": retries,
                "max_output_tokens": 512, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                     "comparisons": [{"a": "good", "b": "bad", "arm": "direct", "margin": 0.1,
                                      "expected_a": 0.6, "expected_b": 0.65, "correlation": 0.5}]},
    }
    if anchor_remote is not None:  # relative paths are taken from the preregistration folder
        design["run"]["anchor_remote"] = anchor_remote
    folder = root / "prereg" / "rt"
    folder.mkdir(parents=True)
    write_design(folder, design, text)
    freeze(folder)
    return folder


def urls(url: str) -> dict[str, str]:
    return {"sim-flash": url, "sim-glm": url}


def logs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for name in ("attempts", "finals", "run", "admission", "host", "anchors"):
        path = folder / f"{name}.jsonl"
        out[name] = read_log(path, log_seed("rt", "A", name)) if path.exists() else []
    return out


def runner_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env["PROCTOR_SIM_URL"] = url
    return env


def run_argv(prereg_dir: Path, results: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness", "run", str(prereg_dir), "--stage", "A", "--results", str(results),
            "--json", *extra]


def wait_in_flight(folder: Path, proc: subprocess.Popen[Any], *, intents: int = 1, timeout: float = 120) -> None:
    """Until the run log shows an attempt under way (an intent whose attempt event is not yet written) and
    at least `intents` intents in all."""
    deadline = time.monotonic() + timeout
    path = folder / "run.jsonl"
    while True:
        whole = path.read_bytes().split(b"\n")[:-1] if path.exists() else []  # lines the writer finished
        events = [json.loads(line)["event"] for line in whole]
        if events.count("intent") >= intents and events.count("intent") > events.count("attempt"):
            return
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no attempt under way"
        time.sleep(0.02)
