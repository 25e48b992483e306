"""The kill -9 soak behind an independent counting proxy: `soak` runs it and returns its figures.

`proctor run` (a real subprocess) reaches the simulator through `tests.support.counting_proxy`,
a process of the tests' own that logs, fsynced, every response it fully delivered. The soak
kills the runner with SIGKILL at random moments, resumes with the same command each time,
and finally lets one invocation run to its end. Used by tests/e2e/test_run_crash_proxy.py
(about 16 kills) and tests/bench/bench_crash_soak.py (55 kills).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.audit.oracle import Problem, run_problems
from harness.run.rules import cost_for_spend
from tests.support.counting_proxy import delivered
from tests.support.paths import REPO
from tests.support.study import Sim, logs, prereg, run_argv, runner_env, system

__all__ = ["SoakFigures", "crash_gap", "proxy_cost", "soak", "start_proxy"]

PRICING = REPO / "harness" / "data" / "pricing.yaml"
MODELS = {"good": "sim-flash", "bad": "sim-glm"}


def crash_gap(p: Problem) -> bool:
    """The gaps a kill -9 may leave until the next invocation: an attempt line whose run-log line was
    not yet written (the next invocation writes it, `recovered: true`), and an atomic write's temporary
    file in archive/ or receipts/ (the next invocation removes it)."""
    return ((p.rule == "attempt_logged" and "0 run-log lines" in p.message)
            or (p.rule == "archive" and ".tmp-" in os.path.basename(p.file)))


def proxy_cost(line: dict[str, Any], model: str) -> float:
    """A delivered response's cost, priced by the test from the pricing table's per-million prices."""
    usage = line.get("usage") or {}
    price = yaml.safe_load(PRICING.read_text())["models"][model]
    return (float(usage.get("prompt_tokens", 0)) * float(price["input_per_mtok"])
            + float(usage.get("completion_tokens", 0)) * float(price["output_per_mtok"])) / 1e6


def start_proxy(root: Path, upstream: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start the counting proxy in front of `upstream`: (process, its URL, its log)."""
    log, ready = root / "proxy-delivered.jsonl", root / "proxy-ready.json"
    argv = [sys.executable, "-m", "tests.support.counting_proxy", "--upstream", upstream, "--log", str(log),
            "--ready", str(ready)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()[1].decode()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc, str(json.loads(ready.read_text())["url"]), log


@dataclass
class SoakFigures:
    """What the proxy saw delivered against what the results record."""

    kills: int = 0
    rounds: int = 0
    delivered: int = 0  # responses the proxy fully delivered
    delivered_usd: float = 0.0  # their cost, priced by the test
    attempts: int = 0  # attempt records in the results (sent: not `"sent": false`)
    runner_lost: int = 0  # of which intents resolved on resume
    recorded_usd: float = 0.0  # spend in the results ("unknown" at the reserve)
    per_system: dict[str, dict[str, float]] = field(default_factory=dict)
    missing: int = 0  # delivered responses of a cell beyond its attempt records (must be 0)
    exit_code: int | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def soak(tmp_path: Path, sim: Sim, *, kills: int, seed: int, reserve: float = 0.002,
         caps: tuple[float, float] = (1.0, 0.03), items: int = 24, lanes: int = 2) -> SoakFigures:
    """Kill `proctor run` about `kills` times at random moments, resume each time, finish; check and count.

    Asserts after every kill that the oracle finds nothing but `crash_gap`s, and at the end that
    the oracle is clean, no attempt is recorded twice, every delivered response is in the results,
    spend recorded >= spend delivered (per system), and each cap and the ceiling held within the
    reserves of the attempts under way (one per lane).
    """
    rng = random.Random(seed)
    t0 = time.monotonic()
    upstream = sim([system("sim-flash", 1.0, latency=0.3, server_error=0.2),
                    system("sim-glm", 0.0, latency=0.4, rate_limited=0.2)], latency_scale=1.0)
    proxy, url, log = start_proxy(tmp_path, upstream)
    figures = SoakFigures()
    try:
        p = prereg(tmp_path, items=items, reserve=reserve, caps=caps, retries=1)
        results = tmp_path / "results"
        folder = results / "rt" / "A"
        env = runner_env(url)
        while figures.kills < kills:
            figures.rounds += 1
            proc = subprocess.Popen(run_argv(p, results), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            _started(folder / "run.jsonl", proc)  # past the start-up: the kill lands among the requests
            time.sleep(rng.uniform(0.0, 1.0))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                figures.kills += 1
            out, err = proc.communicate(timeout=60)
            assert proc.returncode in (-signal.SIGKILL, 0, 1), (proc.returncode, out, err)
            if proc.returncode != -signal.SIGKILL:
                break  # the stage finished (or was refused) before the kill: nothing left to kill
            if folder.exists():
                problems = [x for x in run_problems(folder, prereg_dir=p) if not crash_gap(x)]
                assert problems == [], [str(x) for x in problems]
        final = subprocess.run(run_argv(p, results), cwd=REPO, env=env, capture_output=True, timeout=180)
        figures.exit_code = final.returncode
        assert final.returncode in (0, 1), (final.stdout, final.stderr)
        assert run_problems(folder, prereg_dir=p) == []
        _count(figures, folder, log, reserve, caps, lanes)
    finally:
        proxy.terminate()
        proxy.communicate(timeout=10)
    figures.seconds = time.monotonic() - t0
    return figures


def _started(run_log: Path, proc: subprocess.Popen[bytes]) -> None:
    """Wait (at most 20 s) until the invocation logged its `start` (or ended)."""
    before = run_log.read_bytes().count(b'"event":"start"') if run_log.exists() else 0
    deadline = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        if run_log.exists() and run_log.read_bytes().count(b'"event":"start"') > before:
            return
        time.sleep(0.02)


def _count(figures: SoakFigures, folder: Path, log: Path, reserve: float, caps: tuple[float, float],
           lanes: int) -> None:
    got = logs(folder)
    plan = [json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()[1:]]
    cell_of = {c["request_sha256"]: c for c in plan}
    keys = [(a["run_id"], a["rerun"], a["attempt"]) for a in got["attempts"]]
    assert len(keys) == len(set(keys)), "an attempt recorded twice"
    sent = [a for a in got["attempts"] if a.get("sent") is not False]
    figures.attempts = len(sent)
    figures.runner_lost = sum(a.get("error_code") == "runner_lost" for a in sent)
    # every delivered response is in the results: per cell, no more deliveries than attempt records
    seen = delivered(log)
    per_cell = Counter(line["request_sha256"] for line in seen)
    recorded = Counter(a["request_sha256"] for a in sent)
    figures.missing = sum(max(0, n - recorded[sha]) for sha, n in per_cell.items())
    figures.delivered = len(seen)
    slot = {c["run_id"]: c["system"] for c in plan}
    spend: dict[str, list[float]] = {s: [] for s in MODELS}
    for a in got["attempts"]:
        spend[slot[a["run_id"]]].append(cost_for_spend(a["cost_usd"], reserve))
    for e in got["run"]:
        if e["event"] == "late_cost":
            spend[e["system"]].append(cost_for_spend(e["cost_usd"], reserve))
    paid: dict[str, list[float]] = {s: [] for s in MODELS}
    for line in seen:
        system_slot = cell_of[line["request_sha256"]]["system"]
        paid[system_slot].append(proxy_cost(line, MODELS[system_slot]))
    figures.delivered_usd = math.fsum(x for v in paid.values() for x in v)
    figures.recorded_usd = math.fsum(x for v in spend.values() for x in v)
    for (s, cap) in zip(MODELS, caps, strict=True):
        figures.per_system[s] = {"delivered_usd": math.fsum(paid[s]), "recorded_usd": math.fsum(spend[s]),
                                 "cap_usd": cap}
    assert figures.missing == 0, figures
    for s, v in figures.per_system.items():
        assert v["recorded_usd"] >= v["delivered_usd"], (s, v)
        # a cap holds within the reserves of the attempts under way (one per lane) at its crossing
        assert v["recorded_usd"] <= v["cap_usd"] + lanes * reserve, (s, v)
    start = next(e for e in got["run"] if e["event"] == "start")
    assert figures.recorded_usd <= float(start["ceiling_usd"]) + lanes * len(MODELS) * reserve
