"""Benchmark: the kill -9 soak of issue 13 item 2, 55 kills behind the independent counting proxy.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_crash_soak.py -s

The same soak as tests/e2e/test_run_crash_proxy.py (tests/support/crash.py), longer:
55 SIGKILLs of `proctor run` at random moments among its requests (after each
invocation's `start`), a resume each time, then one invocation to the end, over 128
items per system. It asserts what the test asserts and prints the figures: kills,
responses the proxy delivered and their cost (priced by the test), attempt records
and intents resolved on resume (`runner_lost`), and spend recorded in the results.
Takes about four minutes on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.crash import soak
from tests.support.study import Sim


def test_bench_crash_soak_55_kills(tmp_path: Path, sim: Sim) -> None:
    figures = soak(tmp_path, sim, kills=55, seed=55, items=128, caps=(1.0, 0.06))
    print(json.dumps(figures.to_json(), sort_keys=True, indent=1))
    assert figures.kills >= 45 and figures.missing == 0
    assert figures.recorded_usd >= figures.delivered_usd
