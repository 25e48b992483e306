"""The ray engine's per-attempt coordination cost against the local engine (run: pytest -q -p no:xdist
-o python_files='bench_*.py' tests/bench/bench_ray.py -s).

The same stage (ITEMS items x 2 systems, the simulator at zero latency, verification included) run by the
local engine and by the ray engine on a two-node `ray.cluster_utils.Cluster` on loopback (each node
`proctor_slot: 2`), alternating, medians of RUNS. The difference in wall time per attempt is what Ray
adds per attempt (a task per provider call, an actor call per check, the results back to the driver).
docs/ray.md turns it, with the group writer's ceiling, into the scaling table.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from harness.run.remote import SLOT_RESOURCE
from harness.run.runner import run_stage
from tests.support.bench import Row, bench_command, record
from tests.support.study import prereg, sim_servers, system, urls

pytestmark = pytest.mark.bench

ITEMS = int(os.environ.get("PROCTOR_BENCH_ITEMS", "30"))
RUNS = 3
STORE = 80 * 1024 * 1024


def test_ray_coordination_cost_per_attempt(tmp_path: Path) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: every node on 127.0.0.1
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE})
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=STORE, resources={SLOT_RESOURCE: 2})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    attempts = 2 * ITEMS
    try:
        with sim_servers(tmp_path) as start:
            url = start([system("sim-flash", 1.0), system("sim-glm", 0.5)])
            folder = prereg(tmp_path, items=ITEMS, caps=(1e3, 1e3), overall=3e3)
            for n in range(RUNS):
                for engine in ("local", "ray"):
                    t0 = time.perf_counter()
                    summary = run_stage(folder, "A", tmp_path / f"{engine}-{n}", base_urls=urls(url), engine=engine)
                    walls[engine].append(time.perf_counter() - t0)
                    assert summary.exit_code == 0, summary.to_json()
    finally:
        ray.shutdown()
        cluster.shutdown()
    local, remote = statistics.median(walls["local"]), statistics.median(walls["ray"])
    per_local, per_ray = local / attempts * 1000, remote / attempts * 1000
    print(f"\n[ray engine] {attempts} attempts per stage, medians of {RUNS}, 2 cores shared")
    print(f"  local engine: {per_local:7.1f} ms wall per attempt (stage {local:.2f} s)")
    print(f"  ray engine:   {per_ray:7.1f} ms wall per attempt (stage {remote:.2f} s, engine start included)")
    print(f"  added by Ray: {per_ray - per_local:7.1f} ms per attempt; ratio ray/local {per_ray / per_local:.2f}x")
    record("ray_engine", [Row(
        f"a stage's wall time per attempt ({attempts} attempts, simulator at zero latency, checks included), "
        "a 2-node Ray cluster on loopback, medians of 3",
        f"ray engine: {per_ray:.1f} ms", "the local engine, same stage", f"{per_local:.1f} ms",
        f"{per_ray / per_local:.2f}x (+{per_ray - per_local:.1f} ms per attempt)",
        bench_command("tests/bench/bench_ray.py"))])
