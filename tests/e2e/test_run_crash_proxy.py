"""Spend survives kill -9 (issue 13 item 2), counted by an independent proxy.

`proctor run` reaches the simulator through a counting proxy of the tests' own
(tests/support/counting_proxy.py), which logs, fsynced, every response it fully
delivered; the test prices them from the pricing table. The runner is killed with
SIGKILL at random moments 15 times and resumed with the same command each
time (tests/support/crash.py). Before every request the runner writes an intent;
a resume resolves an intent left without an outcome as a `runner_lost` attempt at
the reserve (or its true cost from the wire log). Then: spend in the results >=
spend the proxy saw delivered, per system; no attempt recorded twice; every
delivered response is an attempt record of its cell (a resolved intent included);
each cap and the ceiling held within one reserve per attempt under way.
The 55-kill soak is tests/bench/bench_crash_soak.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.crash import soak
from tests.support.study import Sim


def test_kill_9_many_times_behind_a_counting_proxy_loses_no_delivered_spend(tmp_path: Path, sim: Sim) -> None:
    figures = soak(tmp_path, sim, kills=15, seed=20261201)
    print(json.dumps(figures.to_json(), sort_keys=True))
    assert figures.kills >= 12, figures
    assert figures.delivered > 0 and figures.missing == 0
    assert figures.recorded_usd >= figures.delivered_usd
