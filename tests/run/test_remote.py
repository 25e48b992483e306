"""The ray engine (harness/run/remote.py) on a real multi-node Ray cluster on loopback (docs/ray.md).

One module-scoped `ray.cluster_utils.Cluster`: a head with no slot and two worker nodes advertising
`proctor_slot`; every node listens on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0). Attempts are sent
from the nodes to a real simulator over loopback HTTP and checked on the nodes' warm verifiers; the driver
(this process, or a `proctor run` subprocess) writes every record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.oracle import run_problems
from harness.audit.report import build_report
from harness.errors import Refusal
from harness.run.remote import SLOT_RESOURCE
from harness.run.runner import run_stage
from harness.workers.sandbox import BWRAP_ENV
from tests.support.paths import REPO
from tests.support.sim import SimServer
from tests.support.study import (
    Sim,
    logs,
    prereg,
    run_argv,
    runner_env,
    system,
    urls,
    wait_in_flight,
)

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when Ray is imported: every node on 127.0.0.1
ray = pytest.importorskip("ray", reason="the [ray] extra (in the dev set: make .venv/.installed-dev)")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("ray-cluster")]  # one cluster per run

STORE = 80 * 1024 * 1024  # a small object store per node
CASCADE_SEED = 3  # draws inflection-0.5.1-m05, whose mutation the visible tests see: the cheap step's gate fails


def _node_args(**extra: Any) -> dict[str, Any]:
    return {"num_cpus": 1, "object_store_memory": STORE, "resources": {SLOT_RESOURCE: 2}, **extra}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every node on 127.0.0.1
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE})
    c.add_node(**_node_args())
    c.add_node(**_node_args())
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _outcomes(folder: Path) -> list[tuple[str, str, str, bool | None]]:
    return sorted((f["run_id"], f["class"], f["action"], f["passed"]) for f in logs(folder)["finals"])


def test_a_stage_on_three_nodes_equals_the_local_engine_and_passes_the_oracle(
        tmp_path: Path, sim: Sim, cluster: Cluster) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    folder_p = prereg(tmp_path)
    local = run_stage(folder_p, "A", tmp_path / "local", base_urls=urls(url))
    remote = run_stage(folder_p, "A", tmp_path / "ray", base_urls=urls(url), engine="ray", address=cluster.address)
    assert local.exit_code == 0 and remote.exit_code == 0 and remote.complete, remote.to_json()
    folder = Path(remote.folder)
    assert _outcomes(folder) == _outcomes(Path(local.folder))
    assert run_problems(folder, prereg_dir=folder_p) == []
    report = build_report(folder, prereg_dir=folder_p)
    assert report.summary["standing"] == 12 and report.summary["passed"] == 6
    got = logs(folder)
    start = next(e for e in got["run"] if e["event"] == "start")
    nodes = start["engine"]["nodes"]
    assert start["engine"]["kind"] == "ray" and len(nodes) == 2  # the two nodes with slots
    assert {n["address"] for n in nodes} == {"127.0.0.1"} and all(n["slots"] == 2 for n in nodes)
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    sent = [e for e in got["attempts"]]
    events = [e for e in got["run"] if e["event"] == "attempt"]
    assert len(events) == len(sent) == 12 and {e["node"] for e in events} <= {n["node"] for n in nodes}
    # the local engine's start event and attempt events carry no engine and no node
    local_run = logs(Path(local.folder))["run"]
    assert all("engine" not in e and "node" not in e for e in local_run)
    # every receipt was checked on a node's verifier in the sandbox asked for, and written by the driver
    for f in got["finals"]:
        receipt = json.loads((folder / f["receipt"]).read_text())
        assert receipt["sandbox"]["kind"] == start["engine"]["sandbox"]


def test_a_node_without_bwrap_refuses_naming_it_unless_the_sandbox_is_none(
        tmp_path: Path, sim: Sim, cluster: Cluster) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    folder_p = prereg(tmp_path)
    before = os.environ.get(BWRAP_ENV)
    os.environ[BWRAP_ENV] = str(tmp_path / "no-bwrap")  # the node's processes inherit it: no sandbox there
    try:
        node = cluster.add_node(**_node_args())
    finally:
        if before is None:
            os.environ.pop(BWRAP_ENV)
        else:
            os.environ[BWRAP_ENV] = before
    try:
        cluster.wait_for_nodes()
        with pytest.raises(Refusal) as refused:
            run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url), engine="ray")
        assert refused.value.code == "sandbox_unavailable" and node.node_id in str(refused.value)
        assert not (tmp_path / "results" / "rt" / "A" / "attempts.jsonl").exists()  # refused before any attempt
        os.environ["PROCTOR_SANDBOX"] = "none"
        try:
            summary = run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url), engine="ray")
        finally:
            os.environ.pop("PROCTOR_SANDBOX")
        assert summary.exit_code == 0, summary.to_json()
        start = next(e for e in logs(Path(summary.folder))["run"] if e["event"] == "start")
        assert start["engine"]["sandbox"] == "none" and len(start["engine"]["nodes"]) == 3
        assert run_problems(Path(summary.folder), prereg_dir=folder_p) == []
    finally:
        cluster.remove_node(node)


def test_killing_a_worker_node_mid_stage_loses_nothing(tmp_path: Path, sim: Sim, cluster: Cluster) -> None:
    url = sim([system("sim-flash", 1.0, latency=0.6), system("sim-glm", 0.0, latency=0.6)], latency_scale=1.0)
    folder_p = prereg(tmp_path, retries=1)
    # one slot: one attempt under way there when it is killed (each lost attempt costs its system the reserve,
    # so several lost at once could spend a cap and pause the system, which is not this test's claim)
    node = cluster.add_node(**_node_args(resources={SLOT_RESOURCE: 1}))
    cluster.wait_for_nodes()
    # every other node's slots held by a placeholder: the stage's first attempts can run only on the node that
    # is killed; the holds are let go at the kill, so the retries run elsewhere
    holds = _hold_slots_except(node.node_id)
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    out: list[Any] = []
    worker = threading.Thread(target=_run_into, args=(out, folder_p, results, urls(url)))
    worker.start()
    try:
        _wait_events(folder, "intent", 3)
        _wait_slot_in_use(node.node_id, of=1)  # an attempt of ours is under way on the node now
        _random_moment(0.5)  # somewhere inside that attempt (0.6 s of latency)
        cluster.remove_node(node, allow_graceful=False)  # kill -9 of the node's processes
    finally:
        for hold in holds:
            ray.kill(hold)
    worker.join(300)
    assert not worker.is_alive() and out, "the stage did not end"
    summary = out[0]
    assert summary.exit_code == 0 and summary.complete, (summary.stops, [e for e in logs(folder)["run"]
                                                                          if e["event"] not in ("intent", "attempt")])
    got = logs(folder)
    assert run_problems(folder, prereg_dir=folder_p) == []
    assert len(got["finals"]) >= 12 and sum(f["action"] == "stand" for f in got["finals"]) == 12
    intents = [e for e in got["run"] if e["event"] == "intent"]
    keys = [(a["run_id"], a["rerun"], a["attempt"]) for a in got["attempts"]]
    assert len(keys) == len(set(keys)) == len(intents)  # every intent resolved once, nothing twice
    assert any(a.get("error_code") == "runner_lost" for a in got["attempts"])  # the kill caught attempts under way
    report = build_report(folder, prereg_dir=folder_p)
    assert report.summary["standing"] == 12 and report.summary["passed"] == 6


class _Hold:
    """A placeholder actor that holds proctor slots of one node while it lives."""

    def ready(self) -> bool:
        return True


def _hold_slots_except(node_id: str) -> list[Any]:
    """Hold every proctor slot of every live node but `node_id`; the placeholders, once all are placed."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    holder = ray.remote(num_cpus=0)(_Hold)
    holds = [holder.options(resources={SLOT_RESOURCE: n["Resources"][SLOT_RESOURCE]},
                            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
             for n in ray.nodes()
             if n["Alive"] and n["NodeID"] != node_id and n["Resources"].get(SLOT_RESOURCE)]  # fmt: skip
    ray.get([h.ready.remote() for h in holds], timeout=120)
    return holds


def _random_moment(up_to_s: float) -> None:
    """Sleep a random time below `up_to_s`, drawn from a seed that is printed (PROCTOR_FAULT_SEED repeats it):
    each run kills at another moment of the attempt, and a failing moment can be run again."""
    import random

    seed = int(os.environ.get("PROCTOR_FAULT_SEED", str(time.time_ns() % 2**32)))
    delay = random.Random(seed).uniform(0.0, up_to_s)
    print(f"fault at {delay:.3f} s after the attempt was seen under way (PROCTOR_FAULT_SEED={seed})")
    time.sleep(delay)


def _wait_slot_in_use(node_id: str, of: int, within_s: float = 60.0) -> None:
    """Until Ray reports one of the node's `of` proctor slots taken (a provider call of ours running there)."""
    from ray._private.state import available_resources_per_node

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        free = available_resources_per_node().get(node_id)
        if free is not None and free.get(SLOT_RESOURCE, 0.0) < of:  # Ray leaves out a resource fully in use
            return
        time.sleep(0.02)
    raise AssertionError("no attempt of ours ran on the node")


def test_a_driver_killed_with_kill_9_resumes_from_the_files(tmp_path: Path, sim: Sim, cluster: Cluster) -> None:
    url = sim([system("sim-flash", 1.0, latency=0.5), system("sim-glm", 0.0, latency=0.5)], latency_scale=1.0)
    folder_p = prereg(tmp_path)
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    argv = [*run_argv(folder_p, results, "--engine", "ray", "--address", cluster.address)]
    env = runner_env(url)
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_in_flight(folder, proc, intents=3)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    got = logs(folder)
    assert sum(f["action"] == "stand" for f in got["finals"]) == 12
    assert any(a.get("error_code") == "runner_lost" for a in got["attempts"])  # the kill left an intent
    assert run_problems(folder, prereg_dir=folder_p) == []


def _repo_outcomes(folder: Path) -> list[tuple[str, str, str, bool | None]]:
    return sorted((f["run_id"], f["class"], f["action"], f["passed"]) for f in logs_of_repo(folder)["finals"])


def logs_of_repo(folder: Path, *names: str) -> dict[str, list[dict[str, Any]]]:
    from harness.evidence.chain_read import read_log
    from harness.run.layout import log_seed

    return {name: read_log(folder / f"{name}.jsonl", log_seed("rt", "A", name))
            for name in names or ("attempts", "finals", "run")}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")
def test_a_repo_task_stage_on_the_nodes_equals_the_local_engine_and_checks_whole(
        tmp_path: Path, sim_server: SimServer, cluster: Cluster) -> None:
    """Each repository-task attempt's sandboxed work (workspace, dispatch through the metering proxy, verify)
    runs on a node; the driver writes the work folders, meters the wire and writes every record."""
    from harness.audit.audit import audit_results
    from harness.meter.cost import meter, total_cost
    from harness.meter.pricing import BUNDLED_PRICING, load_pricing
    from harness.meter.wire import read_wire
    from tests.support.repo_study import repo_prereg
    from tests.support.sim import sim_systems

    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.0, "sim-k3": 1.0}), seed=3)
    folder_p = repo_prereg(tmp_path, items=2)
    base = {"sim-flash": url, "sim-k3": url}
    local = run_stage(folder_p, "A", tmp_path / "local", base_urls=base)
    remote = run_stage(folder_p, "A", tmp_path / "ray", base_urls=base, engine="ray", address=cluster.address)
    assert local.exit_code == 0 and remote.exit_code == 0 and remote.complete, remote.to_json()
    folder = Path(remote.folder)
    assert _repo_outcomes(folder) == _repo_outcomes(Path(local.folder))  # the same verdicts as the local engine
    got = logs_of_repo(folder)
    start = next(e for e in got["run"] if e["event"] == "start")
    nodes = {n["node"] for n in start["engine"]["nodes"]}
    events = [e for e in got["run"] if e["event"] == "attempt"]
    assert len(events) == len(got["attempts"]) == 4 and {e["node"] for e in events} <= nodes
    price = load_pricing(BUNDLED_PRICING)
    plan = {json.loads(line)["run_id"]: json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    for attempt in got["attempts"]:
        work = attempt["work"]
        assert attempt["outcome"] == "delivered" and set(work["files"]) == {"diff.patch", "verify.json", "wire.jsonl"}
        wire = read_wire(folder / work["folder"] / "wire.jsonl")  # written here, by the driver, from the node's bytes
        key = "sim-flash" if plan[attempt["run_id"]]["system"] == "cheap" else "sim-k3"
        assert attempt["cost_usd"] == total_cost(meter(w.usage, price.get(key)) for w in wire).total > 0
    for f in got["finals"]:
        receipt = json.loads((folder / f["receipt"]).read_text())
        assert receipt["passed"] is f["passed"] and receipt["sandbox"]["kind"] == start["engine"]["sandbox"]
    assert run_problems(folder, prereg_dir=folder_p) == []
    assert build_report(folder, prereg_dir=folder_p).summary["passed"] == 2
    # the host log: the driver's own samples (no node) and, at each sample, one from every node the run used
    host = logs_of_repo(folder, "host")["host"]
    assert {h.get("node") for h in host} == {None, *nodes}
    for reason in ("start", "end"):
        assert sorted(h["node"] for h in host if h["reason"] == reason and "node" in h) == sorted(nodes)
    assert all(h["load"] is not None and h["memory"] is not None for h in host)
    assert all("node" not in h for h in logs_of_repo(Path(local.folder), "host")["host"])  # local: as before
    assert audit_results(tmp_path / "ray" / "rt", prereg=folder_p).ok


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")
def test_a_cascade_stage_runs_on_the_nodes_with_its_later_allowance_fixed_at_order_time(
        tmp_path: Path, cluster: Cluster) -> None:
    """A live cascade arm on the ray engine (docs/ray.md, "Cascade arms on a cluster"): the node gets the strong
    step's allowance fixed by the driver in its order (no call back between the steps); the cheap step fails the
    visible-test gate, the strong step runs on the same node, is booked to the strong system, and the records
    pass the report, the oracle and the audit."""
    from harness.audit.audit import audit_results
    from harness.run.rules import booked_spend
    from tests.support.repo_study import MUTANTS, mutant_sim, repo_prereg

    arms: list[dict[str, Any]] = [{"id": "single", "template": "{prompt}"},
                                  {"id": "cascade", "template": "{prompt}", "cascade": ["cheap", "strong"]}]
    prereg_dir = repo_prereg(tmp_path, arms=arms, suite=MUTANTS, items=1, deadline=120, seed=CASCADE_SEED)
    with mutant_sim(tmp_path, {"sim-flash": 0.0, "sim-k3": 1.0}) as url:
        summary = run_stage(prereg_dir, "A", tmp_path / "results", base_urls={"sim-flash": url, "sim-k3": url},
                            engine="ray", address=cluster.address)
    assert summary.exit_code == 0 and summary.complete, summary.to_json()
    folder = Path(summary.folder)
    got = logs_of_repo(folder)
    plan = {json.loads(x)["run_id"]: json.loads(x) for x in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    (cascade,) = [a for a in got["attempts"] if plan[a["run_id"]]["arm"] == "cascade"]
    steps = cascade["work"]["cascade"]["steps"]
    assert [(s["system"], s["switch_class"]) for s in steps] == [("cheap", "first"), ("strong", "escalation")]
    assert steps[0]["gate"]["passed"] is False and not any(s["budget_stop"] for s in steps)
    assert steps[1]["cost_usd"] > 0 and cascade["outcome"] == "delivered"
    assert booked_spend(cascade, "cheap", 0.01, {"cheap", "strong"}) == [("cheap", steps[0]["cost_usd"]),
                                                                         ("strong", steps[1]["cost_usd"])]
    event = next(e for e in got["run"] if e["event"] == "attempt" and e["run_id"] == cascade["run_id"])
    assert event["node"] in {n["node"] for n in next(e for e in got["run"] if e["event"] == "start")["engine"]["nodes"]}
    assert {f["run_id"]: f["passed"] for f in got["finals"]}[cascade["run_id"]] is True  # strong fixed it
    assert build_report(folder, prereg_dir=prereg_dir).summary["problems"] == 0
    assert run_problems(folder, prereg_dir=prereg_dir) == []
    assert audit_results(tmp_path / "results" / "rt", prereg=prereg_dir).ok


def test_a_result_for_a_closed_or_duplicate_attempt_is_ignored_and_logged(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Forced on the engine itself: an attempt the runner closes while its work is on a node, and the same
    attempt sent twice (a duplicate result): the result that comes back to a closed attempt is not kept,
    is named in `ignored` and logged with its node."""
    import asyncio

    from harness.run.remote import RayEngine

    engine = RayEngine(cluster.address, "none", None)
    late, twice = ("r-late", 0, 1), ("r-twice", 0, 1)
    try:
        async def go() -> list[tuple[Any, str, bool]]:
            slow = asyncio.ensure_future(engine.arun(late, time.sleep, 1.0))
            while late not in engine.open:
                await asyncio.sleep(0.01)
            assert engine.close_attempt(late)  # closed by the runner (its deadline, say) with the work under way
            first = await slow
            both = await asyncio.gather(engine.arun(twice, time.sleep, 0.2), engine.arun(twice, time.sleep, 0.6))
            return [first, *both]

        with caplog.at_level("WARNING", logger="harness.run.remote"):
            (_, node, kept), one, other = asyncio.run(go())
    finally:
        engine.close()
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert kept is False and node in nodes
    assert sorted([one[2], other[2]]) == [False, True]  # the first back is the attempt's result, the other ignored
    assert engine.ignored == [late, twice] and engine.open == set()
    logged = [r.getMessage() for r in caplog.records if "ignored as a result" in r.getMessage()]
    assert len(logged) == 2 and node in logged[0] and "r-late" in logged[0] and "r-twice" in logged[1]


def _run_into(out: list[Any], folder_p: Path, results: Path, base_urls: dict[str, str]) -> None:
    out.append(run_stage(folder_p, "A", results, base_urls=base_urls, engine="ray"))


def _wait_events(folder: Path, event: str, n: int, timeout: float = 120) -> None:
    path = folder / "run.jsonl"
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
        if sum(json.loads(line)["event"] == event for line in lines) >= n:
            return
        assert time.monotonic() < deadline, f"fewer than {n} {event} events"
        time.sleep(0.02)


# --------------------------------------------------------------------------
# Faults at chosen and at random moments (issue 18): a node killed or hung under a repository-task attempt,
# the driver killed with kill -9 at seeded random moments


def _repo_stage(tmp_path: Path, sim_server: SimServer) -> tuple[Path, dict[str, str]]:
    from tests.support.repo_study import repo_prereg
    from tests.support.sim import sim_systems

    url = sim_server(systems=sim_systems(tmp_path / "systems.json", {"sim-flash": 0.0, "sim-k3": 1.0}), seed=3)
    return repo_prereg(tmp_path, items=1), {"sim-flash": url, "sim-k3": url}


def _whole_repo_stage(tmp_path: Path, folder: Path, folder_p: Path, out: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """The stage ended complete, every intent resolved once, nothing counted twice, and the records pass the
    oracle, the report and the audit."""
    from harness.audit.audit import audit_results

    assert out, "the stage did not end"
    summary = out[0]
    got = logs_of_repo(folder)
    assert summary.exit_code == 0 and summary.complete, (summary.stops, [
        e for e in got["run"] if e["event"] not in ("intent", "attempt")])
    intents = [e for e in got["run"] if e["event"] == "intent"]
    keys = [(a["run_id"], a["rerun"], a["attempt"]) for a in got["attempts"]]
    assert len(keys) == len(set(keys)) == len(intents)  # every intent resolved once, nothing twice
    assert sum(f["action"] == "stand" for f in got["finals"]) == 2
    assert run_problems(folder, prereg_dir=folder_p) == []
    assert build_report(folder, prereg_dir=folder_p).summary["passed"] == 1
    assert audit_results(tmp_path / "results" / "rt", prereg=folder_p).ok
    return got


def _run_repo_stage_on(node_id: str, folder_p: Path, results: Path, base: dict[str, str]) -> tuple[
        threading.Thread, list[Any], list[Any]]:
    """The repo stage started in a thread while every slot but `node_id`'s (one) is held, returned once one of its
    attempts is under way on that node: (the thread, its summary when it ends, the holds to let go)."""
    holds = _hold_slots_except(node_id)
    out: list[Any] = []
    worker = threading.Thread(target=_run_into, args=(out, folder_p, results, base))
    worker.start()
    try:
        _wait_events(results / "rt" / "A", "intent", 1)
        _wait_slot_in_use(node_id, of=1)
    except BaseException:
        for hold in holds:
            ray.kill(hold)
        worker.join(300)
        raise
    return worker, out, holds


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")
def test_killing_a_worker_node_mid_repo_task_attempt_loses_nothing(
        tmp_path: Path, sim_server: SimServer, cluster: Cluster) -> None:
    """A node killed (kill -9 of its processes) while a repository-task attempt's sandboxed work runs on it: the
    attempt is resolved through its intent (`runner_lost`), retried on a node still alive, nothing lost."""
    folder_p, base = _repo_stage(tmp_path, sim_server)
    node = cluster.add_node(**_node_args(resources={SLOT_RESOURCE: 1}))
    cluster.wait_for_nodes()
    worker, out, holds = _run_repo_stage_on(node.node_id, folder_p, tmp_path / "results", base)
    try:
        _random_moment(0.3)  # somewhere inside the attempt's worker run
        _remove(cluster, node)  # kill -9 of its processes: an attempt of ours was under way there
    finally:
        for hold in holds:
            ray.kill(hold)
    worker.join(300)
    assert not worker.is_alive()
    got = _whole_repo_stage(tmp_path, tmp_path / "results" / "rt" / "A", folder_p, out)
    lost = [a for a in got["attempts"] if a.get("error_code") == "runner_lost"]
    assert lost and all("was lost" in a["error_message"] and "work" not in a for a in lost)
    retried = {(a["run_id"], a["rerun"]) for a in lost}
    assert all(any(a["run_id"] == run_id and a["rerun"] == rerun and a["outcome"] == "delivered"
                   for a in got["attempts"]) for run_id, rerun in retried)  # each lost attempt's run done again
    events = {(e["run_id"], e["attempt"]): e.get("node") for e in got["run"] if e["event"] == "attempt"}
    assert node.node_id not in {events[(a["run_id"], a["attempt"])] for a in got["attempts"]
                                if a["outcome"] == "delivered"}  # no result from the killed node was kept


def _remove(cluster: Cluster, node: Any) -> None:
    """Kill -9 the node's processes and wait until Ray counts it dead (the next test's run lists alive nodes)."""
    cluster.remove_node(node, allow_graceful=False)
    deadline = time.monotonic() + 120
    while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "Ray never counted the killed node dead"
        time.sleep(0.1)


def _proc(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state letter, command line) of a live process, from /proc; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[1]), fields[0], cmdline


def _task_process(raylet_pid: int, title: str = "ray::_run_on_node") -> int:
    """The Ray worker of the node running our repository-task attempt: a child of the node's raylet, titled so
    by Ray while it runs the task (a child of that worker shows the title too, between its fork and exec)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for d in sorted(Path("/proc").iterdir(), key=lambda d: d.name):
            p = _proc(int(d.name)) if d.name.isdigit() else None
            if p is not None and p[0] == raylet_pid and p[2].startswith(title):
                return int(d.name)
        time.sleep(0.05)
    raise AssertionError(f"no {title} process on the node")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gated path's sandbox needs bwrap")
def test_a_node_that_hangs_mid_repo_task_attempt_is_closed_by_the_driver_and_retried(
        tmp_path: Path, sim_server: SimServer, cluster: Cluster, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker process doing an attempt's work is stopped (SIGSTOP: it hangs, its node-side deadline with it;
    the node stays alive to Ray). The driver closes the attempt at its limit (here 15 s instead of the deadline,
    the verify timeout and the grace) as a lost one (`runner_lost`), cancels its Ray task (which ends the
    stopped process), logs what comes back as ignored, and the cell is retried; nothing lost or counted twice."""
    from harness.run.kinds.repo_task import RepoTaskKind

    monkeypatch.setattr(RepoTaskKind, "node_limit_s", staticmethod(lambda order: 15.0))
    folder_p, base = _repo_stage(tmp_path, sim_server)
    node = cluster.add_node(**_node_args(resources={SLOT_RESOURCE: 1}))
    try:
        cluster.wait_for_nodes()
        with caplog.at_level("WARNING", logger="harness.run.remote"):
            worker, out, holds = _run_repo_stage_on(node.node_id, folder_p, tmp_path / "results", base)
            try:
                hung = _task_process(node.all_processes["raylet"][0].process.pid)
                os.kill(hung, signal.SIGSTOP)
            finally:
                for hold in holds:
                    ray.kill(hold)
            worker.join(300)
        assert not worker.is_alive()
        deadline = time.monotonic() + 120  # the forced cancel ends the stopped process (Ray kills it in time)
        while (left := _proc(hung)) is not None and left[1] != "Z":
            assert time.monotonic() < deadline, "the cancelled task's stopped worker process was never ended"
            time.sleep(0.2)
    finally:
        _remove(cluster, node)
    got = _whole_repo_stage(tmp_path, tmp_path / "results" / "rt" / "A", folder_p, out)
    # the hung attempt closed at its limit (another one slow beyond it on a loaded machine would be closed too)
    closed = [a for a in got["attempts"] if a.get("error_code") == "runner_lost"]
    assert closed and all("did not answer: no result from its node within 15 s" in a["error_message"] for a in closed)
    logged = [r.getMessage() for r in caplog.records]
    for a in closed:
        key = (a["run_id"], a["rerun"], a["attempt"])
        assert any(b["run_id"] == key[0] and b["rerun"] == key[1] and b["attempt"] > key[2]
                   for b in got["attempts"])  # retried
        assert any(str(key) in m and "closed, its Ray task cancelled" in m for m in logged), logged
        assert any(str(key) in m and "was closed before its task ended" in m and "ignored" in m for m in logged), logged


def test_an_attempt_past_its_limit_is_closed_cancelled_and_what_comes_back_ignored(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """On the engine itself: work still running at `limit_s` raises `AttemptOverdue`, the attempt is closed
    (a result can no longer be kept), its Ray task is cancelled, and the task's end is logged as ignored."""
    import asyncio

    from harness.run.remote import AttemptOverdue, RayEngine

    engine = RayEngine(cluster.address, "none", None)
    key = ("r-hung", 0, 1)
    try:
        with caplog.at_level("WARNING", logger="harness.run.remote"):
            with pytest.raises(AttemptOverdue, match=r"within 0\.5 s"):
                asyncio.run(engine.arun(key, time.sleep, 120.0, limit_s=0.5))
            assert engine.open == set() and not engine.close_attempt(key)  # closed: nothing left to keep
            deadline = time.monotonic() + 60
            while key not in engine.ignored:  # the cancelled task's end comes back, and is ignored
                assert time.monotonic() < deadline, "the cancelled task never ended"
                time.sleep(0.05)
    finally:
        engine.close()
    logged = [r.getMessage() for r in caplog.records]
    assert any("r-hung" in m and "closed, its Ray task cancelled" in m for m in logged), logged
    assert any("r-hung" in m and "TaskCancelledError" in m and "ignored" in m for m in logged), logged


def test_the_driver_killed_at_seeded_random_moments_resumes_and_loses_nothing(
        tmp_path: Path, sim: Sim, cluster: Cluster) -> None:
    """Three rounds: a `proctor run --engine ray` killed with kill -9 at a moment drawn from a seeded generator
    (after its first intent), then a last run to the end; nothing lost, nothing counted twice, every node on
    127.0.0.1."""
    import random

    url = sim([system("sim-flash", 1.0, latency=0.4), system("sim-glm", 0.0, latency=0.4)], latency_scale=1.0)
    folder_p = prereg(tmp_path, retries=3)  # each kill may lose a cell one attempt: three kills, three retries
    results = tmp_path / "results"
    folder = results / "rt" / "A"
    argv = [*run_argv(folder_p, results, "--engine", "ray", "--address", cluster.address)]
    env = runner_env(url)
    moments = random.Random(18).sample(range(0, 1500, 10), 3)  # ms after the round's first intent
    for ms in moments:
        before = sum(e["event"] == "intent" for e in logs(folder)["run"]) if (folder / "run.jsonl").exists() else 0
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_in_flight(folder, proc, intents=before + 1)
            time.sleep(ms / 1000)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        assert proc.returncode == -signal.SIGKILL
    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    got = logs(folder)
    assert sum(f["action"] == "stand" for f in got["finals"]) == 12
    intents = [e for e in got["run"] if e["event"] == "intent"]
    keys = [(a["run_id"], a["rerun"], a["attempt"]) for a in got["attempts"]]
    assert len(keys) == len(set(keys)) == len(intents)  # every intent resolved once (runner_lost or its outcome)
    starts = [e for e in got["run"] if e["event"] == "start"]
    assert len(starts) == 4 and all({n["address"] for n in s["engine"]["nodes"]} == {"127.0.0.1"} for s in starts)
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    assert run_problems(folder, prereg_dir=folder_p) == []
    report = build_report(folder, prereg_dir=folder_p)
    assert report.summary["standing"] == 12 and report.summary["passed"] == 6
