"""The interleaved study runner: `run_stage` (the library call) behind `proctor run` and the notebook.

`proctor run PREREG --stage S --results DIR` and `notebooks/run_study.ipynb`
make the same call, `run_stage(prereg_dir, stage, results_dir, ...)`. The
results folder's files and fields are documented in
`harness.run.records`; the rules are:

- Lanes: each system runs `run.lanes_per_system` lanes (the plan's `lane`) as
  asyncio tasks over one shared `Transport`; a lane takes its items in
  `lane_position` order, runs each item's cells in arm order (then repeat),
  then the reruns they asked for in passes, and only then its next item.
- Admission (`run_records.admission_decision`) under the ledger lock, with the
  ceiling in the same decision; after one refusal the system refuses for good.
- The ceiling (overall cap + margin, spend before included) is crossed when the
  total exceeds it: no attempt starts afterwards, attempts under way end as
  `budget_stop`, and every system's log gets a `ceiling` event.
- An attempt running past `run.attempt_deadline_s` is recorded as
  `AttemptDeadline`, the system stops (cause `deadline`), and the abandoned
  request's spend, when it arrives, is a `late_cost` event.
- The end of each run (cell x rerun) is a final; its class and action come from
  `run_records.classify`/`action_for`.
- Signals: the first SIGINT/SIGTERM stops every system (cause `interrupt`);
  attempts in flight finish and are saved; exit 1. The second exits at once
  with 128 + the signal number (everything already appended is fsynced).

Every event time is `Clock.now()` taken under the ledger lock that orders the
event; the clock's floor is the latest time found in the files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from harness.errors import Code, RunRefusal
from harness.evals.suite import load_private
from harness.evals.verify_humaneval import VerifierUnavailable, WarmVerifier, verify_response
from harness.evidence.chain import ChainedLog
from harness.evidence.clock import Clock
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import (
    canonical_bytes,
    canonical_line,
    read_bytes,
    read_json,
    sha256_hex,
)
from harness.evidence.lock import InvocationLock
from harness.evidence.money import sum_costs
from harness.meter.cost import Cost, meter
from harness.meter.pricing import BUNDLED_PRICING, Price, load_pricing
from harness.meter.wire import WireLog
from harness.prereg.design import Design
from harness.prereg.freeze import FrozenPrereg, check_frozen
from harness.prereg.plan import FULL_STAGE, MATRIX_STAGE, plan_study
from harness.providers.base import Exchange, GenerationSettings, ProviderRequest
from harness.providers.catalog import BUNDLED_CATALOG, CatalogModel, load_catalog, resolve_model
from harness.providers.registry import adapter_for
from harness.providers.transport import Transport
from harness.run import anchor_push
from harness.run import anchors as anchors_mod
from harness.run import host as host_mod
from harness.run.attempts import PlanRequest, attempt_from_exchange, error_attempt, read_plan
from harness.run.records import (
    FINAL_KIND,
    INCONCLUSIVE_ITEMS_LIMIT,
    RUN_EVENT_KIND,
    AdmissionInputs,
    CellState,
    Ledger,
    RunProgress,
    RunSummary,
    SystemProgress,
    action_for,
    admission_decision,
    admission_record,
    archive_name,
    ceiling_total,
    classify,
    cost_for_spend,
    load_ledger,
    log_seed,
    receipt_name,
    run_ended,
    stage_folder,
)

__all__ = ["RunProgress", "RunSummary", "run_stage"]

LATE_COST_GRACE_S: Final = 30.0
"""At most this long (and at most one deadline) the end waits for abandoned requests' spend."""


# --------------------------------------------------------------------------
# Setting up: what the stage is, from the frozen preregistration


@dataclasses.dataclass
class _Setup:
    frozen: FrozenPrereg
    design: Design
    stage: str
    folder: str
    plan_bytes: bytes
    requests: tuple[PlanRequest, ...]
    models: dict[str, CatalogModel]  # by system slot
    prices: dict[str, Price | None]  # by system slot
    pricing_path: str
    base_urls: dict[str, str]  # by system slot

    @property
    def systems(self) -> list[str]:
        return list(dict.fromkeys(r.system for r in self.requests))


def _stage_plan_bytes(prereg: str, design: Design, stage: str) -> bytes:
    if any(s.id == stage for s in design.stages):
        scope = "pilot"
    elif stage == MATRIX_STAGE:
        scope = "matrix-once"
    elif stage == FULL_STAGE:
        scope = "full"
    else:
        design.stage(stage)  # the refusal naming the registered stages
        raise AssertionError
    plan = plan_study(prereg, scope)
    cells = [c for c in plan.cells if c.stage == stage]
    header = {**plan.header(), "requests": len(cells), "stage": stage}
    return b"".join([canonical_line(header), *(canonical_line(c.to_json()) for c in cells)])


def _setup(prereg_dir: str | os.PathLike[str], stage: str, results_dir: str | os.PathLike[str],
           base_urls: Mapping[str, str] | None) -> _Setup:
    prereg = os.path.abspath(os.fspath(prereg_dir))
    frozen = check_frozen(prereg)
    design = frozen.design
    plan_bytes = _stage_plan_bytes(prereg, design, stage)
    folder = stage_folder(results_dir, design.study_id, stage)
    catalog = load_catalog(BUNDLED_CATALOG if frozen.catalog_sha256 is None else os.path.join(prereg, "catalog.toml"))
    local_pricing = os.path.join(prereg, "pricing.yaml")
    pricing_path = local_pricing if os.path.exists(local_pricing) else str(BUNDLED_PRICING)
    pricing = load_pricing(pricing_path)
    models = {s.slot: resolve_model(catalog, s.model) for s in design.systems}
    urls = {slot: (base_urls or {}).get(m.id) or m.effective_base_url() for slot, m in models.items()}
    return _Setup(frozen, design, stage, folder, plan_bytes, (), models,
                  {slot: pricing.get(m.pricing_key) for slot, m in models.items()}, pricing_path, urls)


def _requests_from(folder: str, data: bytes, *, write: bool) -> tuple[PlanRequest, ...]:
    path = os.path.join(folder, "plan.jsonl")
    if os.path.lexists(path):
        if read_bytes(path) != data:
            raise RunRefusal(Code.RUN_PLAN_CHANGED, "the stage's plan differs from the one this folder was run with "
                          "(the preregistration, packet or catalog changed)", path)
    elif write:
        atomic_write(path, data, mode=0o644)
    else:  # a dry run writes nothing: read the plan from a scratch copy in memory
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            scratch = os.path.join(tmp, "plan.jsonl")
            atomic_write(scratch, data, mode=0o644)
            return read_plan(scratch).requests
    return read_plan(path).requests


# --------------------------------------------------------------------------
# The engine


class _Engine:
    def __init__(self, setup: _Setup, ledger: Ledger, *, resume_paused: bool,
                 progress: Callable[[RunProgress], None] | None) -> None:
        self.s, self.ledger, self.progress_cb = setup, ledger, progress
        d = setup.design
        self.study, self.stage = d.study_id, setup.stage
        self.reserve = d.budgets.reserve_per_item_usd
        self.ceiling = d.budgets.ceiling_usd
        self.rules = d.run
        self.lock = threading.Lock()
        self.clock = Clock(floor=ledger.last_time)
        f = setup.folder
        self.logs = {name: ChainedLog(os.path.join(f, f"{name}.jsonl"), log_seed(self.study, self.stage, name))
                     for name in ("attempts", "finals", "run", "admission", "host", "anchors")}
        self.wire = WireLog(os.path.join(f, "wire.jsonl"), f"{self.study}:{self.stage}")
        self.attempt_lines = ledger.attempt_lines
        self.spend = dict(ledger.spend)
        self.spend_parts = {k: list(v) for k, v in ledger.spend_parts.items()}
        self.under_way = dict.fromkeys(setup.systems, 0)
        self.admitted = dict.fromkeys(setup.systems, 0)
        self.refused = dict.fromkeys(setup.systems, 0)
        self.attempts = {s: sum(len(r) for c in ledger.cells.values() if c.request.system == s
                                for r in c.attempts.values()) for s in setup.systems}
        self.stopped: dict[str, str] = {}
        self.paused = {s for s in setup.systems if ledger.paused(s)}
        self.resume_paused = resume_paused
        self.refused_before = {s for s in setup.systems if ledger.refused_before(s)}
        self.crossed = self.total() > self.ceiling or any(e["event"] == "ceiling" for e in ledger.run_events)
        self.interrupted = False
        self.stops: list[dict[str, Any]] = []
        self.abandoned: set[asyncio.Task[Exchange]] = set()
        self.ceiling_event: asyncio.Event | None = None
        self.verifiers: dict[str, WarmVerifier] = {}
        suite_dir = os.path.dirname(d.packet_path)
        self.suite_dir = suite_dir
        self._private: Any = None
        self.transport: Transport | None = None
        self.signals = 0
        self.pushes: list[threading.Thread] = []
        self.pending_signals: list[int] = []

    # ---- bookkeeping under the lock

    def total(self) -> float:
        return ceiling_total(self.s.design.budgets.spend_before_usd, self.spend_parts)

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            return self._event_locked(event, **fields)

    def _event_locked(self, event: str, **fields: Any) -> dict[str, Any]:
        return self.logs["run"].append({"kind": RUN_EVENT_KIND, "event": event, "at": self.clock.now(), **fields})

    def stop(self, system: str | None, cause: str, detail: str = "") -> None:
        with self.lock:
            self._stop_locked(system, cause, detail)

    def _stop_locked(self, system: str | None, cause: str, detail: str) -> None:
        targets = self.s.systems if system is None else [system]
        if all(t in self.stopped for t in targets):
            return
        for t in targets:
            self.stopped.setdefault(t, cause)
        self.stops.append({"system": system, "cause": cause, "detail": detail})
        self._event_locked("stop", system=system, cause=cause, detail=detail)

    def halted(self, system: str) -> bool:
        return self.crossed or self.interrupted or system in self.stopped or system in self.paused

    def _add_spend_locked(self, system: str, cost_usd: Any) -> None:
        self.spend_parts[system].append(cost_for_spend(cost_usd, self.reserve))
        self.spend[system] = sum_costs(self.spend_parts[system])  # one exact sum, as the ledger's
        total = self.total()
        if total > self.ceiling and not self.crossed:
            self.crossed = True
            at = self.clock.now()
            for s in self.s.systems:
                self._event_locked("ceiling", system=s, crossed_at=at, total_usd=total, ceiling_usd=self.ceiling)
            self._stop_locked(None, "ceiling", f"spend {total} crossed the ceiling {self.ceiling}")
            if self.ceiling_event is not None:
                self.ceiling_event.set()

    def admit(self, system: str, item: str, lane: int) -> bool:
        with self.lock:
            if self.interrupted or system in self.stopped or system in self.paused:
                return False  # not a decision: the lane is over
            inputs = AdmissionInputs(
                system=system, item=item, lane=lane, finished_usd=self.spend[system], reserve_usd=self.reserve,
                under_way=self.under_way[system] + 1, cap_usd=self.s.design.system(system).cap_usd,
                refused_before=system in self.refused_before, total_usd=self.total(), ceiling_usd=self.ceiling,
                crossed=self.crossed,
            )
            self.logs["admission"].append(admission_record(inputs, self.clock.now()))
            decision, _ = admission_decision(inputs)
            if decision == "admit":
                self.under_way[system] += 1
                self.admitted[system] += 1
                return True
            self.refused_before.add(system)
            self.refused[system] += 1
            return False

    # ---- records

    def _append_attempt_locked(self, cell: PlanRequest, record: dict[str, Any], lane: int) -> tuple[int, str]:
        written = self.logs["attempts"].append(record)
        self.attempt_lines += 1
        line, sha = self.attempt_lines, sha256_hex(canonical_bytes(written))
        body = {k: v for k, v in written.items() if k not in ("prev", "seed")}
        self.ledger.cells[cell.run_id].attempts.setdefault(record["rerun"], []).append((line, body, sha))
        self.attempts[cell.system] += 1
        self._event_locked("attempt", system=cell.system, lane=lane, run_id=cell.run_id, rerun=record["rerun"],
                           attempt=record["attempt"], attempts_line=line, attempt_sha256=sha,
                           started=record["started"], ended=record["ended"], cost_usd=record["cost_usd"],
                           **{"class": classify(record)})
        self.ledger.logged_attempt_lines.add(line)
        self._add_spend_locked(cell.system, record["cost_usd"])
        return line, sha

    def write_final(self, state: CellState, receipt: tuple[str, str, bool] | None) -> dict[str, Any]:
        line, attempt, sha = state.current()[-1]
        rerun = state.rerun
        cls = classify(attempt)
        action = action_for(cls, rerun, self.rules.reruns)
        replaced = [{"rerun": old["rerun"], "archive": archive_name(state.request.run_id, old["rerun"]),
                     "sha256": sha256_hex(raw + b"\n"), "attempt_sha256": old["attempt_sha256"]}
                    for _, old, raw in state.finals]
        r = state.request
        record = {
            "kind": FINAL_KIND, "run_id": r.run_id, "system": r.system, "item": r.item, "arm": r.arm,
            "repeat": r.repeat, "rerun": rerun, "class": cls, "action": action,
            "error_code": attempt.get("error_code"), "attempt": attempt["attempt"], "attempt_line": line,
            "attempt_sha256": sha, "passed": None if receipt is None else receipt[2],
            "receipt": None if receipt is None else receipt[0],
            "receipt_sha256": None if receipt is None else receipt[1], "replaced": replaced,
        }
        with self.lock:
            record["at"] = self.clock.now()
            written = self.logs["finals"].append(record)
            state.finals.append((0, written, canonical_bytes(written)))
            if action == "pause":
                self.paused.add(r.system)
                self._event_locked("pause", system=r.system, run_id=r.run_id, error_code=attempt.get("error_code"))
            elif action == "stop":
                cause = "deadline" if attempt.get("error_code") == "AttemptDeadline" else cls
                self._stop_locked(r.system, cause, f"{r.run_id}: {attempt.get('error_code')}")
            if cls == "inconclusive" and self.ledger.inconclusive_items(r.system) > INCONCLUSIVE_ITEMS_LIMIT:
                self._stop_locked(r.system, "inconclusive", "inconclusive failures ended runs in more than "
                                  f"{INCONCLUSIVE_ITEMS_LIMIT} items")
        return written

    def ensure_archives(self, state: CellState) -> None:
        """Byte copies of every earlier final, before the cell's next run (idempotent after a crash)."""
        for _, old, raw in state.finals:
            path = os.path.join(self.s.folder, archive_name(state.request.run_id, old["rerun"]))
            if os.path.exists(path):
                if read_bytes(path) != raw + b"\n":
                    raise RunRefusal(Code.RUN_ARCHIVE_MISMATCH, "an archive is not a byte copy of its final", path)
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, raw + b"\n", mode=0o644)

    # ---- verification

    def private(self) -> Any:
        if self._private is None:
            self._private = load_private(self.suite_dir)
        return self._private

    def verify(self, state: CellState) -> tuple[str, str, bool]:
        """Verify the current run's delivered answer; write its receipt; (name, sha256, passed)."""
        _, attempt, sha = state.current()[-1]
        r = state.request
        item = self.private()[r.item]
        if item.test is None or item.entry_point is None:
            raise VerifierUnavailable(f"item {r.item} has no hidden test")
        packet_prompt = self._packet_prompt(r.item)
        verifier = self.verifiers.setdefault(r.system, WarmVerifier())
        manifest = read_json(os.path.join(self.suite_dir, "SUITE.json")).value
        _, receipt = verify_response(
            verifier, suite=self.s.design.suite_name, item=r.item, prompt=packet_prompt,
            entry_point=item.entry_point, test=item.test, response_text=attempt.get("text") or "",
            private_sha256=manifest.get("private_sha256"), clock=self.clock.now,
        )
        receipt.update(run_id=r.run_id, rerun=state.rerun, attempt_sha256=sha)
        name = receipt_name(r.run_id, state.rerun)
        data = canonical_line(receipt)
        path = os.path.join(self.s.folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, data, mode=0o644)
        return name, sha256_hex(data), bool(receipt["passed"])

    def _packet_prompt(self, item: str) -> str:
        if not hasattr(self, "_packet"):
            from harness.evals.suite import load_packet

            self._packet = load_packet(self.s.design.packet_path, self.s.design.packet_sha256)
        return str(self._packet.get(item).prompt)

    async def finish_run(self, state: CellState) -> None:
        """Write the final of a run that ended (verifying a delivered answer first)."""
        _, attempt, _ = state.current()[-1]
        receipt = None
        if attempt["outcome"] == "delivered":
            try:
                receipt = await asyncio.to_thread(self.verify, state)
            except (VerifierUnavailable, OSError) as exc:
                self.stop(state.request.system, "harness", f"the verifier failed: {exc}")
                return
        self.write_final(state, receipt)

    # ---- attempts

    def provider_request(self, r: PlanRequest) -> ProviderRequest:
        settings = GenerationSettings(
            max_output_tokens=self.rules.max_output_tokens, temperature=self.s.design.arm(r.arm).temperature,
            reasoning_effort=None if r.setting == "default" else r.setting,
        )
        built = adapter_for(r.api_shape).build_request(r.api_model, r.prompt, settings, self.s.base_urls[r.system])
        return dataclasses.replace(built, body=r.body, body_sha256=r.request_sha256)  # the plan's exact bytes

    def _meter(self, exchange: Exchange, system: str) -> Cost:
        return meter(exchange.parsed.usage, self.s.prices[system])

    async def attempt(self, state: CellState, lane: int) -> dict[str, Any] | None:
        """Send the next attempt of the cell's current run; its record, or None when none may start."""
        r, rerun, number = state.request, state.rerun, state.next_attempt()
        request = self.provider_request(r)
        model = self.s.models[r.system]
        credential = os.environ.get(model.credential_env) if model.credential_env else None
        with self.lock:
            if self.halted(r.system):
                return None
            started = self.clock.now()
        assert self.transport is not None and self.ceiling_event is not None
        send = asyncio.ensure_future(self.transport.asend(request, credential))
        ceiling = asyncio.ensure_future(self.ceiling_event.wait())
        done, _ = await asyncio.wait({send, ceiling}, timeout=self.rules.attempt_deadline_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        ceiling.cancel()
        if send in done:
            exchange = send.result()
            cost = self._meter(exchange, r.system)
            record = attempt_from_exchange(r, number, exchange, cost)
            with self.lock:
                self.wire.append_exchange(exchange)
                ended = self.clock.now()
                record.update(rerun=rerun, started=started, ended=ended, latency_s=ended - started)
                self._append_attempt_locked(r, record, lane)
            return record
        code = "budget_stop" if self.ceiling_event.is_set() else "AttemptDeadline"
        self.abandoned.add(send)
        send.add_done_callback(lambda task: self._late(task, r, rerun, number))
        with self.lock:
            ended = self.clock.now()
            record = error_attempt(
                r, number, error_code=code, started=started, ended=ended,
                error_message=("the spending ceiling was crossed while the attempt was under way"
                               if code == "budget_stop" else
                               f"still running after the {self.rules.attempt_deadline_s} s deadline"),
                cost=Cost(None, status="usage_unknown", reason="abandoned before a response arrived"),
            )
            record["rerun"] = rerun
            self._append_attempt_locked(r, record, lane)
        return record

    def _late(self, task: asyncio.Task[Exchange], r: PlanRequest, rerun: int, number: int) -> None:
        self.abandoned.discard(task)
        if task.cancelled() or task.exception() is not None:
            # It may still have been billed: unknown, counted as the reserve like every unknown cost.
            with self.lock:
                self._event_locked("late_cost", system=r.system, run_id=r.run_id, rerun=rerun, attempt=number,
                                   cost_usd="unknown", cost_status="usage_unknown", wire_line=None)
                self._add_spend_locked(r.system, "unknown")
            return
        exchange = task.result()
        cost = self._meter(exchange, r.system)
        with self.lock:
            self.wire.append_exchange(exchange)
            value: Any = "unknown" if cost.total is None else cost.total
            self._event_locked("late_cost", system=r.system, run_id=r.run_id, rerun=rerun, attempt=number,
                               cost_usd=value, cost_status=cost.status, wire_line=self.wire.appended)
            self._add_spend_locked(r.system, value)

    async def run_cell(self, state: CellState, lane: int) -> None:
        """Run the cell's owed run to its end (transport retries included) and write its final."""
        if state.standing:
            return
        if state.last_final is not None and state.last_final["action"] == "pause" and state.request.system in self.paused:
            return
        if state.unfinalised(self.rules.transport_retries):
            await self.finish_run(state)
            return
        if state.finals and not state.current():
            self.ensure_archives(state)
        while True:
            record = await self.attempt(state, lane)
            if record is None:
                return
            self.report()
            if run_ended(record, self.rules.transport_retries):
                await self.finish_run(state)
                self.report()
                return

    async def lane(self, system: str, lane: int, items: list[list[CellState]]) -> None:
        self.event("lane", system=system, lane=lane, what="start", cause=None)
        cause = "done"
        for cells in items:
            if all(c.standing for c in cells):
                continue
            if self.halted(system):
                cause = "interrupt" if self.interrupted else ("paused" if system in self.paused else "stopped")
                break
            if not self.admit(system, cells[0].request.item, lane):
                cause = "refused" if system in self.refused_before else "stopped"
                self.report()
                break
            self.report()
            try:
                for c in cells:
                    await self.run_cell(c, lane)
                while not self.halted(system):  # reruns, in passes
                    todo = [c for c in cells if c.last_final is not None and c.last_final["action"] == "rerun"]
                    if not todo:
                        break
                    for c in todo:
                        await self.run_cell(c, lane)
            finally:
                with self.lock:
                    self.under_way[system] -= 1
        self.event("lane", system=system, lane=lane, what="end", cause=cause)

    # ---- host, anchors, signals

    async def sampler(self) -> None:
        failing_since: float | None = None
        while True:
            await asyncio.sleep(host_mod.SAMPLE_EVERY_S)
            ok = self.sample("periodic")
            now = asyncio.get_running_loop().time()
            if ok:
                failing_since = None
            elif failing_since is None:
                failing_since = now
            elif now - failing_since >= host_mod.SAMPLER_FAIL_S:
                self.stop(None, "sampler", "the host sampler failed for five minutes")

    def sample(self, reason: str) -> bool:
        with self.lock:
            record = host_mod.host_sample(self.clock.now(), reason, self.s.folder)
            self.logs["host"].append(record)
        return not host_mod.sample_failed(record)

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
            record = self.logs["anchors"].append(anchors_mod.anchor_record(self.clock.now(), reason, logs, manifests))
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
        if not os.path.isabs(remote) and "://" not in remote:
            remote = os.path.normpath(os.path.join(os.path.dirname(design.path), remote))
        try:
            outcome = anchor_push.push_snapshot(
                snapshot, remote, target, label=reason, clone=clone, timeout_s=design.run.anchor_timeout_s
            )
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
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

    def on_signal(self, signum: int) -> None:
        self.signals += 1
        with self.lock:
            self._event_locked("signal", signum=signum, count=self.signals)
            if self.signals >= 2:
                os._exit(128 + signum)
            self.interrupted = True
            self._stop_locked(None, "interrupt", f"signal {signum}")

    # ---- progress and the whole run

    def system_progress(self) -> tuple[SystemProgress, ...]:
        out = []
        for s in self.s.systems:
            cells = [c for c in self.ledger.cells.values() if c.request.system == s]
            standing = sum(c.standing for c in cells)
            state = ("done" if standing == len(cells) else "paused" if s in self.paused else
                     "refused" if s in self.refused_before else "stopped" if s in self.stopped else "running")
            out.append(SystemProgress(s, self.admitted[s], self.refused[s], self.attempts[s], standing, len(cells),
                                      self.spend[s], self.s.design.system(s).cap_usd, state))
        return tuple(out)

    def progress(self) -> RunProgress:
        return RunProgress(self.study, self.stage, self.total(), self.ceiling, self.crossed, self.system_progress())

    def report(self) -> None:
        if self.progress_cb is not None:
            self.progress_cb(self.progress())

    def recover(self) -> None:
        """Repair what a crash left between appends: attempt lines missing from run.jsonl, and the pause
        event of a pause final (logged `recovered: true`)."""
        with self.lock:
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
                if last is None or last["action"] != "pause" or any(
                        e["event"] == "pause" and e.get("run_id") == c.request.run_id
                        and float(e["at"]) >= float(last["at"]) for e in self.ledger.run_events):
                    continue
                self._event_locked("pause", system=c.request.system, run_id=c.request.run_id,
                                   error_code=last.get("error_code"), recovered=True)
                self.paused.add(c.request.system)

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        self.ceiling_event = asyncio.Event()
        if self.crossed:
            self.ceiling_event.set()
        installed: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for signum in (int(signal.SIGINT), int(signal.SIGTERM)):
                loop.add_signal_handler(signum, self.on_signal, signum)
                installed.append(signum)
        background = [asyncio.ensure_future(self.sampler()), asyncio.ensure_future(self.anchorer())]
        n_lanes = self.rules.lanes_per_system
        try:
            async with Transport(timeout_s=max(2 * self.rules.attempt_deadline_s, 30.0),
                                 max_connections=max(1, n_lanes * len(self.s.systems)) + 4) as transport:
                self.transport = transport
                lanes = []
                for system in self.s.systems:
                    for lane in range(n_lanes):
                        mine = [c for c in self.ledger.cells.values()
                                if c.request.system == system and c.request.lane == lane]
                        positions: dict[int, list[CellState]] = {}
                        for c in mine:
                            positions.setdefault(c.request.lane_position, []).append(c)
                        items = [sorted(v, key=lambda c: (c.request.arm_position, c.request.repeat))
                                 for _, v in sorted(positions.items())]
                        lanes.append(self.lane(system, lane, items))
                results = await asyncio.gather(*lanes, return_exceptions=True)
                for exc in results:
                    if isinstance(exc, BaseException):
                        self.stop(None, "runner-error", f"{type(exc).__name__}: {exc}")
                if self.abandoned:
                    await asyncio.wait(set(self.abandoned),
                                       timeout=min(LATE_COST_GRACE_S, self.rules.attempt_deadline_s))
                for abandoned in list(self.abandoned):
                    abandoned.cancel()
                await asyncio.sleep(0)
        finally:
            for task in background:
                task.cancel()
            for installed_signum in installed:
                loop.remove_signal_handler(installed_signum)
            for v in self.verifiers.values():
                v.close()


# --------------------------------------------------------------------------
# The library call


def _cells_summary(ledger: Ledger, engine: _Engine | None) -> tuple[dict[str, Any], ...]:
    out = []
    for c in ledger.cells.values():
        last = c.last_final
        paused = engine is not None and c.request.system in engine.paused
        state = "standing" if c.standing else "paused" if paused else "owed"
        out.append({"run_id": c.request.run_id, "system": c.request.system, "item": c.request.item,
                    "arm": c.request.arm, "repeat": c.request.repeat, "state": state,
                    "class": None if last is None else last["class"],
                    "action": None if last is None else last["action"],
                    "passed": None if last is None else last["passed"],
                    "next": None if c.standing else {"rerun": c.rerun, "attempt": c.next_attempt()}})
    return tuple(out)


def run_stage(
    prereg_dir: str | os.PathLike[str],
    stage: str,
    results_dir: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    resume_paused: bool = False,
    preflight: bool = False,
    base_urls: Mapping[str, str] | None = None,
    progress: Callable[[RunProgress], None] | None = None,
) -> RunSummary:
    """Run (or continue) one stage of a frozen preregistration into `results_dir/<study>/<stage>/`.

    Args:
        prereg_dir: the preregistration folder (must be frozen and unchanged).
        stage: a registered stage id (or `matrix` / `full` for those scopes).
        results_dir: the results root; the stage folder is `<results_dir>/<study>/<stage>`.
        dry_run: list what stands and the next attempt owed; no provider call, no write.
        resume_paused: lift every pause logged before this invocation.
        preflight: report every problem that would stop the run, before any provider call.
        base_urls: catalog id -> base URL, overriding the catalog and its environment variable.
        progress: called (on the runner's thread) after every admission, attempt and final.

    Returns:
        The summary; `exit_code` 0 only when every cell of the stage has a standing final.

    Raises:
        Refusal: an unfrozen or changed preregistration, a changed plan, a folder held by
            another invocation (`invocation_locked`), or any history it cannot read.
    """
    if preflight:
        from harness.run.preflight import preflight as run_preflight

        return run_preflight(prereg_dir, stage, results_dir, base_urls=base_urls)
    setup = _setup(prereg_dir, stage, results_dir, base_urls)
    d = setup.design
    if dry_run:
        setup.requests = _requests_from(setup.folder, setup.plan_bytes, write=False)
        ledger = _load(setup)
        engine = _Engine(setup, ledger, resume_paused=False, progress=None)
        cells = _cells_summary(ledger, engine)
        complete = all(c["state"] == "standing" for c in cells)
        return RunSummary(True, 0 if complete else 1, "dry_run", d.study_id, stage, setup.folder, complete,
                          engine.progress(), cells=cells)
    os.makedirs(setup.folder, exist_ok=True)
    with InvocationLock(os.path.join(setup.folder, ".invocation.lock")):
        setup.requests = _requests_from(setup.folder, setup.plan_bytes, write=True)
        ledger = _load(setup)
        engine = _Engine(setup, ledger, resume_paused=resume_paused, progress=progress)
        with _deferred_signals(engine):
            engine.recover()
            engine.event("start", pid=os.getpid(), dry_run=False, resume_paused=resume_paused,
                         plan_sha256=sha256_hex(setup.plan_bytes), ceiling_usd=engine.ceiling,
                         spend_before_usd=d.budgets.spend_before_usd,
                         systems=[{"slot": s, "cap_usd": d.system(s).cap_usd, "lanes": d.run.lanes_per_system}
                                  for s in setup.systems])
            if resume_paused:
                for s in sorted(engine.paused):
                    engine.event("resume_paused", system=s)
                engine.paused.clear()
            engine.sample("start")
        engine.take_pending_signals()
        _run_loop(engine)
        with _deferred_signals(engine):
            engine.sample("end")
            engine.take_pending_signals()
            cells = _cells_summary(ledger, engine)
            complete = all(c["state"] == "standing" for c in cells)
            code = 0 if complete else 1
            engine.event("end", exit_code=code, complete=complete, stops=engine.stops)
            engine.anchor("end")
            engine.join_pushes()
        return RunSummary(complete, code, "run", d.study_id, stage, setup.folder, complete, engine.progress(),
                          stops=tuple(engine.stops), cells=cells)


def _load(setup: _Setup) -> Ledger:
    d = setup.design
    return load_ledger(setup.folder, d.study_id, setup.stage, setup.requests, reruns=d.run.reruns,
                       transport_retries=d.run.transport_retries, reserve_usd=d.budgets.reserve_per_item_usd)


@contextlib.contextmanager
def _deferred_signals(engine: _Engine) -> Iterator[None]:
    """Outside the event loop (start and end of an invocation): a first SIGINT/SIGTERM is
    remembered and logged by `take_pending_signals`, a second exits at once with 128+signum,
    as inside the loop. Without this a signal there would kill the run by the default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        engine.pending_signals.append(signum)
        if engine.signals + len(engine.pending_signals) >= 2:
            os._exit(128 + signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _run_loop(engine: _Engine) -> None:
    """asyncio.run the engine; from a thread when this one already runs a loop (a Jupyter kernel)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(engine.main())
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(engine.main())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="proctor-run")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
