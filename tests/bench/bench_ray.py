"""The ray engine's per-attempt coordination cost against the local engine (run: pytest -q -p no:xdist
-o python_files='bench_*.py' tests/bench/bench_ray.py -s).

The same study at two sizes (SMALL and ITEMS items x 2 systems, the simulator at zero latency, verification
included) run by the local engine and by the ray engine on a two-node `ray.cluster_utils.Cluster` on
loopback (each node `proctor_slot: 2`), alternating, medians of RUNS. The steady per-attempt cost of an
engine is the difference of its two stages' wall times over the difference of their attempts: each run
opens its engine once (for Ray: the sandbox probe on every node, a verifier actor per node and its worker
interpreter), so the start-up cancels out. The difference between the engines' steady costs is what Ray
adds per attempt (a task per provider call, an actor call per check, the results back to the driver).
The driver process's own CPU per attempt (getrusage, its threads included, the nodes' processes not) is what
bounds one driver: docs/ray.md turns it, with the group writer's ceiling, into the scaling table.
"""

from __future__ import annotations

import os
import resource
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
SMALL = max(1, ITEMS // 3)
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
    walls: dict[tuple[str, int], list[float]] = {(e, n): [] for e in ("local", "ray") for n in (SMALL, ITEMS)}
    cpus: dict[tuple[str, int], list[float]] = {k: [] for k in walls}  # the driver process's own CPU seconds
    try:
        with sim_servers(tmp_path) as start:
            url = start([system("sim-flash", 1.0), system("sim-glm", 0.5)])
            folders = {n: prereg(tmp_path / f"p{n}", items=n, caps=(1e3, 1e3), overall=3e3) for n in (SMALL, ITEMS)}
            for run in range(RUNS):
                for items in (SMALL, ITEMS):
                    for engine in ("local", "ray"):
                        t0, c0 = time.perf_counter(), _cpu()
                        summary = run_stage(folders[items], "A", tmp_path / f"{engine}-{items}-{run}",
                                            base_urls=urls(url), engine=engine)
                        walls[(engine, items)].append(time.perf_counter() - t0)
                        cpus[(engine, items)].append(_cpu() - c0)
                        assert summary.exit_code == 0, summary.to_json()
    finally:
        ray.shutdown()
        cluster.shutdown()
    med = {k: statistics.median(v) for k, v in walls.items()}
    extra = 2 * (ITEMS - SMALL)  # the attempts the larger stage has beyond the smaller
    steady = {e: (med[(e, ITEMS)] - med[(e, SMALL)]) / extra * 1000 for e in ("local", "ray")}
    whole = {e: med[(e, ITEMS)] / (2 * ITEMS) * 1000 for e in ("local", "ray")}
    start_s = {e: med[(e, SMALL)] - steady[e] / 1000 * 2 * SMALL for e in ("local", "ray")}
    cpu_med = {k: statistics.median(v) for k, v in cpus.items()}
    driver = {e: (cpu_med[(e, ITEMS)] - cpu_med[(e, SMALL)]) / extra * 1000 for e in ("local", "ray")}
    print(f"\n[ray engine] stages of {2 * SMALL} and {2 * ITEMS} attempts, medians of {RUNS}, 2 cores shared")
    for e in ("local", "ray"):
        print(f"  {e:5} engine: steady {steady[e]:7.1f} ms per attempt; whole stage {whole[e]:7.1f} ms per attempt; "
              f"fixed (start-up and end) {start_s[e]:.2f} s")
    for e in ("local", "ray"):
        print(f"  {e:5} engine: the driver process's own CPU, steady {driver[e]:6.2f} ms per attempt "
              f"(one core saturates at {1000 / driver[e]:,.0f} attempts/s)")
    print(f"  added by Ray per attempt, steady: {steady['ray'] - steady['local']:7.1f} ms; "
          f"ratio ray/local {steady['ray'] / steady['local']:.2f}x")
    record("ray_engine", [Row(
        f"steady wall time per attempt (stages of {2 * SMALL} and {2 * ITEMS} attempts differenced: start-up "
        f"excluded; simulator at zero latency, checks included), a 2-node Ray cluster on loopback, medians of {RUNS}",
        f"ray engine: {steady['ray']:.1f} ms", "the local engine, same stages", f"{steady['local']:.1f} ms",
        f"{steady['ray'] / steady['local']:.2f}x (+{steady['ray'] - steady['local']:.1f} ms per attempt)",
        bench_command("tests/bench/bench_ray.py")), Row(
        "the driver process's own CPU per attempt, steady (same stages; the nodes' work is in other processes)",
        f"ray engine: {driver['ray']:.2f} ms", "the local engine's driver", f"{driver['local']:.2f} ms",
        f"{driver['ray'] / driver['local']:.2f}x", bench_command("tests/bench/bench_ray.py"))])


def _cpu() -> float:
    """User and system CPU seconds of this process so far (its threads included, its children not)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime
