"""The engine seam: where a stage's attempt work runs. `local` (the default) sends and verifies in the
runner's own process and imports no Ray; `ray` sends each provider call as a Ray task and checks each
answer on a warm verifier actor (one per node) of a Ray cluster, while the runner stays the single
writer: admission, intents, the ceiling, records and receipts are decided and written only by the driver,
under its lock; a node returns data (an `Exchange`, a `Verdict`), checked as a local attempt's.

The manual: docs/ray.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, Refusal, RunRefusal
from harness.evals.verify_humaneval import (
    DEFAULT_TIMEOUT_S,
    Verdict,
    VerifierUnavailable,
    WarmVerifier,
)
from harness.providers.base import Exchange, ProviderRequest

__all__ = ["ENGINES", "SLOT_RESOURCE", "AttemptOverdue", "NodeLost", "RayEngine", "RemoteVerifier", "open_engine"]

ENGINES: Final = ("local", "ray")
"""`run_stage(..., engine=)` and `proctor run --engine`: where attempts run (docs/ray.md)."""
SLOT_RESOURCE: Final = "proctor_slot"
"""The custom Ray resource a node advertises: how many attempts (sandboxes) it runs at once. A cluster
without it schedules one attempt per CPU."""

log = logging.getLogger("harness.run.remote")


class NodeLost(Exception):
    """The node running an attempt died (or its worker did) before the result came back."""


class AttemptOverdue(Exception):
    """No result came back from the node within the driver's limit (a hung node): the driver has closed the
    attempt and cancelled its Ray task; a result that still comes is ignored and logged (docs/ray.md)."""


@dataclass(frozen=True)
class NodeInfo:
    """One alive node the run may use, as recorded in the start event (`engine.nodes`)."""

    node: str
    address: str
    slots: int
    sandbox: str


# --------------------------------------------------------------------------
# What runs on a node (module-level functions, imported there by name)


def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _send_on_node(request: ProviderRequest, credential: str | None, timeout_s: float) -> tuple[Exchange, str]:
    """One provider call on the node: the same transport and the same `Exchange` as the local engine."""
    from harness.providers.transport import Transport

    async def go() -> Exchange:
        async with Transport(timeout_s=timeout_s, max_connections=2) as transport:
            return await transport.asend(request, credential)

    return asyncio.run(go()), _node_id()


def _run_on_node(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    """Any module-level function of proctor on the node (a repository-task attempt's `perform_on_node`)."""
    return fn(*args), _node_id()


def _sample_on_node(at: float, reason: str) -> dict[str, Any]:
    """A host sample of the node this runs on (its temporary folder's disk, where attempts' work lies)."""
    import tempfile

    from harness.run.host import host_sample

    return host_sample(at, reason, tempfile.gettempdir(), node=_node_id())


def _sandbox_on_node(kind: str) -> tuple[str, str, str | None]:
    """(node id, the sandbox kind, or None and why not) on the node this runs on."""
    from harness.errors import Refusal
    from harness.workers.sandbox import resolve_sandbox

    try:
        return _node_id(), resolve_sandbox(kind).kind, None
    except Refusal as exc:
        return _node_id(), kind, str(exc)


class _NodeVerifier:
    """A warm verifier on one node (a Ray actor): one long-lived worker interpreter, checks one at a time."""

    def __init__(self, sandbox: str, memory_bytes: int | None) -> None:
        self.verifier = WarmVerifier(sandbox=sandbox, memory_bytes=memory_bytes)

    def check(self, item: str, program: str, test: str, entry_point: str,
              timeout_s: float) -> tuple[Verdict, dict[str, Any] | None, str]:
        verdict = self.verifier.verify(item, program, test, entry_point, timeout_s)
        return verdict, self.verifier.sandbox_record, _node_id()


# --------------------------------------------------------------------------
# The driver's side


class RemoteVerifier(WarmVerifier):
    """The driver's handle on the cluster's verifier actors, used where a `WarmVerifier` is: a check goes to
    a node's actor (round robin over the nodes alive); a node lost mid-check is dropped and the check is
    sent to another (a check is deterministic and costs nothing); none left is `VerifierUnavailable`."""

    def __init__(self, engine: RayEngine) -> None:
        super().__init__(sandbox=engine.sandbox)
        self.engine = engine

    def verify(self, item: str, program: str, test: str, entry_point: str,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> Verdict:
        import ray
        from ray.exceptions import RayActorError, WorkerCrashedError

        while True:
            node, actor = self.engine.next_verifier()
            try:
                verdict, record, _ = ray.get(actor.check.remote(item, program, test, entry_point, timeout_s))
            except (RayActorError, WorkerCrashedError) as exc:
                self.engine.drop_verifier(node, f"{type(exc).__name__}")
                continue
            self.sandbox_record = record
            return verdict  # type: ignore[no-any-return]

    def close(self) -> None:
        """The actors end with the engine (`RayEngine.close`)."""


class RayEngine:
    """A stage's attempt work on a Ray cluster (`open_engine("ray", address)`); the driver writes everything."""

    def __init__(self, address: str | None, sandbox: str, memory_bytes: int | None) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RunRefusal(Code.ENGINE_UNAVAILABLE, "the ray engine needs the [ray] extra: "
                             "pip install 'proctor[ray]' (ray==2.60.*) on the driver and every node") from exc
        self.sandbox = sandbox
        self.started_ray = False
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            self.started_ray = True
        self._lock = threading.Lock()
        self.open: set[tuple[str, int, int]] = set()
        self.ignored: list[tuple[str, int, int]] = []
        self.nodes = self._nodes()
        if not self.nodes:
            raise RunRefusal(Code.ENGINE_UNAVAILABLE, "the Ray cluster has no alive node with a CPU or a "
                             f"{SLOT_RESOURCE} resource to run attempts on", address or "")
        self._check_sandboxes()
        uses_slots = any(n["Resources"].get(SLOT_RESOURCE) for n in self._nodes_alive())
        options: dict[str, Any] = ({"num_cpus": 0, "resources": {SLOT_RESOURCE: 1}} if uses_slots
                                   else {"num_cpus": 1})
        self._send = ray.remote(max_retries=0, **options)(_send_on_node)
        self._run = ray.remote(max_retries=0, **options)(_run_on_node)
        actor = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(_NodeVerifier)
        self.verifiers: dict[str, Any] = {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for n in self.nodes:
            where = NodeAffinitySchedulingStrategy(node_id=n.node, soft=False)
            self.verifiers[n.node] = actor.options(scheduling_strategy=where).remote(sandbox, memory_bytes)
        self._turn = itertools.count()
        self.verifier = RemoteVerifier(self)

    @staticmethod
    def _nodes_alive() -> list[dict[str, Any]]:
        import ray

        return [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]

    def _nodes(self) -> tuple[NodeInfo, ...]:
        out = []
        for n in sorted(self._nodes_alive(), key=lambda n: str(n["NodeID"])):
            res = n["Resources"]
            slots = int(res.get(SLOT_RESOURCE, res.get("CPU", 0)))
            if slots > 0:
                out.append(NodeInfo(str(n["NodeID"]), str(n["NodeManagerAddress"]), slots, self.sandbox))
        return tuple(out)

    def _check_sandboxes(self) -> None:
        """The sandbox on every node, before any attempt: a node that cannot make one refuses the run
        (`sandbox_unavailable`, naming the node) unless the run is `--sandbox none`."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0, max_retries=0)(_sandbox_on_node)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n.node, soft=False))
                .remote(self.sandbox) for n in self.nodes]
        alive = []
        for n, ref in zip(self.nodes, refs, strict=True):
            try:
                _, _, why = ray.get(ref, timeout=120)
            except (ray.exceptions.TaskUnschedulableError, ray.exceptions.NodeDiedError,
                    ray.exceptions.WorkerCrashedError) as exc:  # died since it was listed: not used
                log.warning("node %s (%s) was lost before the run started (%s): not used", n.node, n.address,
                            type(exc).__name__)
                continue
            alive.append(n)
            if why is not None:
                raise Refusal(Code.SANDBOX_UNAVAILABLE, f"node {n.node} ({n.address}) cannot run the "
                                 f"{self.sandbox} sandbox: {why}", node=n.node, address=n.address)
        self.nodes = tuple(alive)
        if not self.nodes:
            raise RunRefusal(Code.ENGINE_UNAVAILABLE, "every node of the Ray cluster was lost before the run started")

    def record(self) -> dict[str, Any]:
        """What the start event records of the engine (`engine`)."""
        import ray

        return {"kind": "ray", "ray_version": str(ray.__version__), "sandbox": self.sandbox,
                "nodes": [{"node": n.node, "address": n.address, "slots": n.slots} for n in self.nodes]}

    def node_samples(self, at: float, reason: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """A host sample from every node the run uses (`host.jsonl`, with `node`), in node order; a node that
        does not answer within `timeout_s` (lost, or busy beyond it) is left out and logged."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0, max_retries=0)(_sample_on_node)
        refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n.node, soft=False))
                .remote(at, reason): n.node for n in self.nodes}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        out = []
        for ref in ready:
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                log.warning("node %s gave no host sample: %s", refs[ref], type(exc).__name__)
        for ref in late:
            ray.cancel(ref, force=True)
            log.warning("node %s gave no host sample within %s s", refs[ref], timeout_s)
        return sorted(out, key=lambda s: str(s["node"]))

    # ---- provider calls

    async def asend(self, key: tuple[str, int, int], request: ProviderRequest, credential: str | None,
                    timeout_s: float) -> tuple[Exchange, str]:
        """Send one attempt's request from a node: (its exchange, the node). A lost node (or its worker)
        raises `NodeLost`. A result for an attempt the runner closed meanwhile (`close_attempt`: abandoned
        at the deadline or the ceiling) is ignored as a result and logged; the runner keeps only its spend."""
        exchange, node, _ = await self._result(key, self._send.remote(request, credential, timeout_s))
        return exchange, node  # closed: the runner keeps only its spend (as a late cost)

    async def arun(self, key: tuple[str, int, int], fn: Callable[..., Any], *args: Any,
                   limit_s: float | None = None) -> tuple[Any, str, bool]:
        """Run `fn(*args)` (a module-level function: a repository-task attempt's work) on a node under one slot:
        (its result, the node, False when the attempt was closed meanwhile: its result is to be ignored).
        A lost node raises `NodeLost`, as `asend`; no result within `limit_s` (a node that hangs) closes the
        attempt, cancels its task and raises `AttemptOverdue`."""
        return await self._result(key, self._run.remote(fn, *args), limit_s)

    async def _result(self, key: tuple[str, int, int], ref: Any, limit_s: float | None = None) -> tuple[Any, str, bool]:
        from ray.exceptions import RayError, RayTaskError

        with self._lock:
            self.open.add(key)
        try:
            result = asyncio.wrap_future(ref.future())
            value, node = await (result if limit_s is None else asyncio.wait_for(result, limit_s))
        except TimeoutError:
            self._overdue(key, ref, limit_s)
            raise AttemptOverdue(f"no result from its node within {limit_s:g} s (the attempt deadline and a "
                                 "grace): closed by the driver, its Ray task cancelled") from None
        except RayTaskError:
            self.close_attempt(key)
            raise  # the harness's own error on the node: a runner error, as a local one
        except RayError as exc:
            self.close_attempt(key)
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise NodeLost(f"{type(exc).__name__}: {first}") from exc
        kept = self.close_attempt(key)
        if not kept:
            with self._lock:
                self.ignored.append(key)
            log.warning("attempt %s was closed before its result came back from node %s: ignored as a result",
                        key, node)
        return value, str(node), kept

    def _overdue(self, key: tuple[str, int, int], ref: Any, limit_s: float | None) -> None:
        """Close an attempt whose node did not answer in time, cancel its task (a forced cancel ends the worker
        process; a node that hangs whole may never act on it) and log whatever still comes back as ignored."""
        import ray

        self.close_attempt(key)
        log.warning("attempt %s: no result from its node within %s s: closed, its Ray task cancelled", key, limit_s)
        late = ref.future()  # a future of its own: the one awaited above was cancelled with the wait

        def ignore(done: Any) -> None:
            if done.cancelled():
                return
            with self._lock:
                self.ignored.append(key)
            failed = done.exception()
            if failed is None:
                log.warning("attempt %s was closed before its result came back from node %s: ignored as a result",
                            key, done.result()[1])
            else:
                log.warning("attempt %s was closed before its task ended (%s): ignored", key, type(failed).__name__)

        late.add_done_callback(ignore)
        try:
            ray.cancel(ref, force=True)
        except Exception as exc:  # a cancel that cannot reach the node changes nothing here
            log.warning("attempt %s: its Ray task could not be cancelled (%s)", key, type(exc).__name__)

    def close_attempt(self, key: tuple[str, int, int]) -> bool:
        """Close an attempt: its record is (or will be) written without a result; False if already closed."""
        with self._lock:
            if key in self.open:
                self.open.discard(key)
                return True
            return False

    # ---- verifiers

    def next_verifier(self) -> tuple[str, Any]:
        with self._lock:
            if not self.verifiers:
                raise VerifierUnavailable("no node of the Ray cluster has a verifier left")
            nodes = sorted(self.verifiers)
            node = nodes[next(self._turn) % len(nodes)]
            return node, self.verifiers[node]

    def drop_verifier(self, node: str, why: str) -> None:
        with self._lock:
            self.verifiers.pop(node, None)
        log.warning("the verifier on node %s was lost (%s); checks go to the other nodes", node, why)

    def close(self) -> None:
        import ray

        with self._lock:
            actors, self.verifiers = list(self.verifiers.values()), {}
        for a in actors:
            ray.kill(a)
        if self.started_ray:
            ray.shutdown()


def open_engine(engine: str, address: str | None, *, sandbox: str | None = None) -> RayEngine | None:
    """The engine named: None for `local` (the runner's own process), a `RayEngine` for `ray`; refuses
    any other name (`engine_invalid`) and an address without the ray engine."""
    if engine not in ENGINES:
        raise RunRefusal(Code.ENGINE_INVALID, f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "local":
        if address is not None:
            raise RunRefusal(Code.ENGINE_INVALID, "an --address is for the ray engine only (--engine ray)")
        return None
    from harness.evals.verify_humaneval import DEFAULT_MEMORY_BYTES
    from harness.workers.sandbox import SANDBOX_ENV

    kind = sandbox or os.environ.get(SANDBOX_ENV) or "bwrap"
    return RayEngine(address, kind, DEFAULT_MEMORY_BYTES)
