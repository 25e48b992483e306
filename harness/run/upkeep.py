"""The runner's upkeep: host samples, anchors (and their background push), signals, and the repair
of what a crash left between appends.

Signals: the first SIGINT/SIGTERM stops every system (cause `interrupt`); attempts
in flight finish and are saved. The second exits at once with 128 + the signal number.

The manual: docs/run.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from typing import Any, Final

from harness.errors import Refusal
from harness.evidence.jsonio import sha256_hex
from harness.meter.cost import Cost, meter
from harness.meter.wire import WireRecord, read_wire
from harness.run import anchor_push
from harness.run import anchors as anchors_mod
from harness.run import host as host_mod
from harness.run.attempts import error_attempt
from harness.run.lanes import Lanes
from harness.run.layout import log_seed
from harness.run.rules import classify

__all__ = ["Interrupts", "Upkeep", "deferred_signals"]

_TORN_WRITE: Final = re.compile(r"\..+\.tmp-[0-9]+")
"""`harness.evidence.fsutil.atomic_write`'s temporary file, left behind by a kill before its rename."""


class Upkeep(Lanes):
    """Host samples, anchors, signals and crash repair (on the engine's state)."""

    # ---- host, anchors, signals

    async def sampler(self) -> None:
        failing_since: float | None = None
        while True:
            await asyncio.sleep(host_mod.SAMPLE_EVERY_S)
            ok = await self.asample("periodic")
            now = asyncio.get_running_loop().time()
            if ok:
                failing_since = None
            elif failing_since is None:
                failing_since = now
            elif now - failing_since >= host_mod.SAMPLER_FAIL_S:
                self.stop(None, "sampler", "the host sampler failed for five minutes")

    def sample(self, reason: str) -> bool:
        """A sample of this host; with the ray engine, then one of every node (`sample_nodes`)."""
        with self.lock:
            at = self.clock.now()
            record = host_mod.host_sample(at, reason, self.s.folder)
            self.logs["host"].stage(record)
        if self.remote is not None:
            self.stage_node_samples(self.remote.node_samples(at, reason))
        return not host_mod.sample_failed(record)

    async def asample(self, reason: str) -> bool:
        """`sample`, the nodes' samples gathered off the event loop."""
        with self.lock:
            at = self.clock.now()
            record = host_mod.host_sample(at, reason, self.s.folder)
            self.logs["host"].stage(record)
        if self.remote is not None:
            self.stage_node_samples(await asyncio.to_thread(self.remote.node_samples, at, reason))
        return not host_mod.sample_failed(record)

    def stage_node_samples(self, samples: list[dict[str, Any]]) -> None:
        """The nodes' samples, each checked as a record (a node returns data) and appended to host.jsonl."""
        from harness.records.host import HostSample

        with self.lock:
            for sample in samples:
                self.logs["host"].stage(HostSample.from_json(sample, path=None, line=None).to_json())

    async def anchorer(self) -> None:
        while True:
            await asyncio.sleep(anchors_mod.ANCHOR_EVERY_S)
            self.anchor("periodic")

    def anchor(self, reason: str) -> None:
        f = self.s.folder
        logs = {name: (os.path.join(f, f"{name}.jsonl"), log_seed(self.study, self.stage, name))
                for name in ("attempts", "finals", "run", "admission", "host", "wire")}
        manifests = {"plan.jsonl": os.path.join(f, "plan.jsonl"),
                     "FROZEN.json": os.path.join(self.s.frozen.path, "FROZEN.json"), "pricing": self.s.pricing_path}
        with self.lock:
            self.writer.wait()  # the anchor reads the files: everything staged is on the disk first
            record = self.logs["anchors"].stage(anchors_mod.anchor_record(self.clock.now(), reason, logs, manifests))
            self.writer.wait()
            remote = self.s.design.run.anchor_remote
            if remote is None:
                return
            # The snapshot is taken under the lock, so no half-written line is pushed.
            clone = anchor_push.clone_path(f)
            snapshot = f"{clone}.snapshot-{record['prev'][:12]}"
            anchor_push.take_snapshot(f, snapshot)
        thread = threading.Thread(
            target=self._push_anchor, args=(snapshot, remote, clone, reason), name="proctor-anchor", daemon=True
        )
        thread.start()
        self.pushes.append(thread)

    def _push_anchor(self, snapshot: str, remote: str, clone: str, reason: str) -> None:
        """Commit and push one snapshot in the background; the outcome goes to the run log."""
        design = self.s.design
        target = f"{self.study}/{self.stage}"
        registered = remote
        if not os.path.isabs(remote) and "://" not in remote:
            remote = os.path.normpath(os.path.join(os.path.dirname(design.path), remote))
        try:
            outcome = anchor_push.push_snapshot(
                snapshot, remote, target, label=reason, clone=clone, timeout_s=design.run.anchor_timeout_s
            )
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
        # the run log names the remote as registered (relative to the preregistration), never this machine's folders
        named = {remote: registered, clone: "<clone>", snapshot: "<snapshot>", self.s.folder: "."}
        for key in ("remote", "error"):
            if isinstance(outcome.get(key), str):
                for path, name in sorted(named.items(), key=lambda kv: -len(kv[0])):
                    outcome[key] = outcome[key].replace(path, name)
        self.event("anchor_push", reason=reason, **outcome)

    def join_pushes(self) -> None:
        """Wait for background anchor pushes (each bounded by its own timeout)."""
        for thread in self.pushes:
            thread.join(self.s.design.run.anchor_timeout_s * 4 + 5)

    def take_pending_signals(self) -> None:
        """Log the signals that arrived outside the event loop, as if they arrived now."""
        pending, self.pending_signals = self.pending_signals, []
        for signum in pending:
            self.on_signal(signum)

    def exit_record(self, signum: int) -> dict[str, Any]:
        """What a second signal leaves the caller: the summary's shape, `stopped: second_signal`, exit 128+signum.

        Built from the engine's state without its lock (the exit may come while it is held).
        """
        return {"ok": False, "exit_code": 128 + signum, "mode": "run", "study": self.study, "stage": self.stage,
                "folder": self.s.folder, "complete": False, "stopped": "second_signal", "signum": signum,
                "progress": self.progress().to_json(), "stops": list(self.stops),
                "note": "exited at once: attempts under way were not saved; run the same command to resume "
                        "(repair a torn tail first with proctor ledger repair FILE if it refuses)"}

    def hard_exit(self, signum: int) -> None:
        """The second signal: hand the exit record to `on_exit` (never letting it stop the exit), then exit."""
        try:
            if self.on_exit is not None:
                self.on_exit(self.exit_record(signum))
        finally:  # whatever the callback does or raises, the process ends here
            os._exit(128 + signum)

    def on_signal(self, signum: int) -> None:
        self.signals += 1
        with self.lock:
            self._event_locked("signal", signum=signum, count=self.signals)
            if self.signals >= 2:
                with contextlib.suppress(Refusal):  # exit whatever the disk says
                    self.writer.wait()
                self.hard_exit(signum)
            self.interrupted = True
            self._stop_locked(None, "interrupt", f"signal {signum}")
        self.writer.wait()

    def recover(self) -> None:
        """Repair what a crash left between appends: an atomic write's temporary file, attempt lines missing
        from run.jsonl, intents without an outcome (resolved by a `runner_lost` attempt), and the pause
        event of a pause final (logged `recovered: true`)."""
        with self.lock:
            self._remove_torn_writes()
            self._resolve_intents_locked()
            for c in self.ledger.cells.values():
                for runs in c.attempts.values():
                    for line, rec, sha in runs:
                        if line not in self.ledger.logged_attempt_lines:
                            self._event_locked("attempt", system=c.request.system, lane=c.request.lane,
                                               run_id=c.request.run_id, rerun=rec["rerun"], attempt=rec["attempt"],
                                               attempts_line=line, attempt_sha256=sha, started=rec["started"],
                                               ended=rec["ended"], cost_usd=rec["cost_usd"], recovered=True,
                                               **{"class": classify(rec)})
                            self.ledger.logged_attempt_lines.add(line)
            # A pause final whose pause event a crash cut off: the system stays paused all the same.
            for c in self.ledger.cells.values():
                last = c.last_final
                if last is None or last.action != "pause" or any(
                        e["event"] == "pause" and e.get("run_id") == c.request.run_id
                        and float(e["at"]) >= last.at for e in self.ledger.run_events):
                    continue
                self._event_locked("pause", system=c.request.system, run_id=c.request.run_id,
                                   error_code=last.error_code, recovered=True)
                self.paused.add(c.request.system)


    def _remove_torn_writes(self) -> None:
        """Remove what a kill left of an atomic write in archive/ and receipts/ (a `.NAME.tmp-PID` file that
        was never renamed into place): never evidence, and the write is redone when its run is."""
        for sub in ("archive", "receipts"):
            folder = os.path.join(self.s.folder, sub)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                if _TORN_WRITE.fullmatch(name) and os.path.isfile(os.path.join(folder, name)):
                    os.unlink(os.path.join(folder, name))

    def _resolve_intents_locked(self) -> None:
        """Each intent no attempt record resolves (the runner died with its request under way) becomes a
        `runner_lost` attempt: class provider, retried as a transport failure (it uses up a transport
        retry), costing its true cost when the wire log holds the exchange, else "unknown" (the reserve).
        It counts toward its system's cap and the ceiling like any attempt."""
        if not self.ledger.unresolved:
            return
        wire = self._unclaimed_wire()
        for e in self.ledger.unresolved:
            state = self.ledger.cells[str(e["run_id"])]
            r = state.request
            found = wire.get(r.request_sha256)
            cost = Cost(None, status="usage_unknown", reason="the runner died with the request under way")
            message = "the runner died after the intent was written, before the outcome was: resolved on resume"
            usage = None
            if found:
                exchange = found.pop()
                got = meter(exchange.usage, self.s.prices[r.system])
                if got.total is not None:
                    cost, usage = got, exchange.usage
                message += " (its exchange is in the wire log)"
            record = error_attempt(r, int(e["attempt"]), error_code="runner_lost", error_message=message,
                                   started=float(e["at"]), ended=self.clock.now(), cost=cost, usage=usage)
            record["rerun"] = int(e["rerun"])
            self._append_attempt_locked(r, record, int(e["lane"]), recovered=True)
        self.ledger.unresolved = []

    def _unclaimed_wire(self) -> dict[str, list[WireRecord]]:
        """The wire log's exchanges no attempt record or late cost accounts for, by request sha256
        (a crash between appending the exchange and its attempt record leaves one)."""
        path = os.path.join(self.s.folder, "wire.jsonl")
        if not os.path.exists(path):
            return {}
        claimed: dict[str, int] = {}
        for c in self.ledger.cells.values():
            n = sum(1 for runs in c.attempts.values() for _, rec, _ in runs
                    if rec.get("error_code") not in ("AttemptDeadline", "budget_stop", "runner_lost"))
            claimed[c.request.request_sha256] = n
        for e in self.ledger.run_events:
            if e["event"] == "late_cost" and e.get("wire_line") is not None:
                sha = self.ledger.cells[str(e["run_id"])].request.request_sha256
                claimed[sha] = claimed.get(sha, 0) + 1
        by_sha: dict[str, list[WireRecord]] = {}
        for rec in read_wire(path, f"{self.study}:{self.stage}"):
            by_sha.setdefault(sha256_hex(rec.request_body), []).append(rec)
        return {sha: recs[claimed.get(sha, 0):] for sha, recs in by_sha.items() if len(recs) > claimed.get(sha, 0)}


@contextlib.contextmanager
def deferred_signals(engine: Upkeep) -> Iterator[None]:
    """Outside the event loop (start and end of an invocation): a first SIGINT/SIGTERM is
    remembered and logged by `take_pending_signals`, a second exits at once with 128+signum,
    as inside the loop. Without this a signal there would kill the run by the default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        engine.pending_signals.append(signum)
        if engine.signals + len(engine.pending_signals) >= 2:
            engine.hard_exit(signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class Interrupts:
    """Signals delivered from another thread: how a Jupyter kernel's KeyboardInterrupt reaches a run.

    `run_stage(..., interrupts=i)` runs on a worker thread (no signal handler can be
    installed there); the thread that gets the signal calls `deliver(signum)`. The first
    delivery is the runner's first signal (a `signal` event, a stop with cause `interrupt`,
    attempts under way finish), the second exits the process at once with 128 + signum,
    as `proctor run` does. A delivery before the run's `start` event is held until it.
    The manual: docs/run.md (signals) and docs/notebooks.md.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: Upkeep | None = None
        self._held: list[int] = []
        self._over = False
        self.count = 0

    def deliver(self, signum: int) -> None:
        """One signal: to the run when it is under way, else held (or, the second, an exit at once)."""
        with self._lock:
            self.count += 1
            engine = self._engine
            if engine is None:
                if self.count >= 2:
                    os._exit(128 + signum)
                if not self._over:
                    self._held.append(signum)
                return
        engine.on_signal(signum)

    def attach(self, engine: Upkeep) -> None:
        """The run has logged its start: deliver what was held to `engine`, and every later signal."""
        with self._lock:
            self._engine = engine
            held, self._held = self._held, []
        for signum in held:
            engine.on_signal(signum)

    def detach(self) -> None:
        """The run is ending: later signals are counted (the second still exits) but not logged."""
        with self._lock:
            self._engine = None
            self._over = True
