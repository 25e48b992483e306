"""`make demo-ray`: the agents demo study (`prereg/agents-demo`) run on a local three-node Ray cluster.

It starts a Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head without slots and two
worker nodes advertising `proctor_slot`, every node on 127.0.0.1), the simulator answering the mutant
tasks, then `proctor run prereg/agents-demo --stage ray --engine ray --address ADDR` (each
attempt's sandboxed work on a node, every record written by this machine's driver), `proctor report`
and `proctor audit`, and prints the passes per system, the nodes that did the work and the paths. Its
files go to `build/demo-ray/` (emptied first; `--out` elsewhere). Needs the `[ray]` extra and bwrap.

The manual: docs/ray.md ("A demo on one machine").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.cli.demo import simulator

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[2]
PREREG = REPO / "prereg" / "agents-demo"
STAGE = "ray"
"""The agents demo's stage for a cluster: single-shot and feedback arms (registered when the ray engine still refused
live cascades; they run on it now, docs/ray.md)."""
_STORE = 80 * 1024 * 1024


def _proctor(words: list[str], env: dict[str, str], expect: tuple[int, ...] = (0,)) -> dict[str, Any]:
    argv = [sys.executable, "-m", "harness", *words, "--json"]
    print("$ " + " ".join(["proctor", *words]).replace(str(REPO) + "/", ""), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in expect:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"demo-ray: `proctor {words[0]}` exited {done.returncode}")
    out: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {}
    return out


def _read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cli.demo_ray", description=__doc__)
    parser.add_argument("--out", default=str(REPO / "build" / "demo-ray"), help="where the results go (emptied first)")
    parser.add_argument("--nodes", type=int, default=2, help="worker nodes beside the head (default 2: three nodes)")
    parser.add_argument("--slots", type=int, default=2, help="attempts each worker node runs at once")
    args = parser.parse_args(argv)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every node on 127.0.0.1
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        raise SystemExit("demo-ray: needs the [ray] extra: pip install -e '.[ray]'") from None
    from harness.run.remote import SLOT_RESOURCE

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    started = time.monotonic()
    print(f"== a local Ray cluster: a head and {args.nodes} worker nodes with {args.slots} slots each", flush=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": _STORE})
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=1, object_store_memory=_STORE, resources={SLOT_RESOURCE: args.slots})
        cluster.wait_for_nodes()
        print(f"   at {cluster.address} ({time.monotonic() - started:.0f} s)", flush=True)
        results = out / "results"
        answers = ("--answers", str(REPO / "evals" / "mutants" / "private" / "sim_answers.jsonl"))
        with simulator(out, 0, answers, {**env, "PROCTOR_SIM_LATENCY_SCALE": "0"}) as url:
            env["PROCTOR_SIM_URL"] = url
            print(f"\n== the agents demo's stage {STAGE} on the cluster", flush=True)
            run = _proctor(["run", str(PREREG), "--stage", STAGE, "--results", str(results), "--engine", "ray",
                            "--address", cluster.address], env)
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
    folder = Path(run["folder"]) if run.get("folder") else results / "agents-demo" / STAGE
    print("\n== the report and the audit, from the files alone", flush=True)
    report = _proctor(["report", str(folder), "--prereg", str(PREREG)], env)
    audit = _proctor(["audit", str(results / "agents-demo"), "--prereg", str(PREREG)], env)
    events = _read_log(folder / "run.jsonl")
    engine = next(e["engine"] for e in events if e.get("event") == "start" and "engine" in e)
    by_node = collections.Counter(e["node"] for e in events if e.get("event") == "attempt" and "node" in e)
    finals = _read_log(folder / "finals.jsonl")
    plan = {json.loads(line)["run_id"]: json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()[1:]}
    passes: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for f in finals:
        if f.get("action") == "stand":
            tally = passes[plan[f["run_id"]]["system"]]
            tally[0] += bool(f.get("passed"))
            tally[1] += 1
    print("\nsystem   passed / standing")
    for system, (won, standing) in sorted(passes.items()):
        print(f"{system:8} {won} / {standing}")
    print(f"\nnodes: {len(engine['nodes'])} with slots (sandbox {engine['sandbox']}); attempts per node:")
    for node, count in sorted(by_node.items()):
        print(f"  {node[:12]}…  {count}")
    print(f"report: {len(report.get('problems', []))} problems, {report.get('standing')} standing; audit ok: {audit.get('ok')}")
    print(f"results: {folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder}")
    print(f"\nproctor demo-ray: done in {time.monotonic() - started:.1f}s")
    return 0 if audit.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
