"""The runner's engine state and its bookkeeping under the ledger lock: events, stops, spend and the
ceiling, admission, and progress. The finals, lanes and upkeep build on it (`harness.run.runner`).

Every event time is `Clock.now()` taken under the lock that orders the event; the
clock's floor is the latest time found in the files.

The manual: docs/run.md.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from harness.evals.verify_pool import VerifierPool
from harness.evidence.clock import Clock
from harness.evidence.group import GroupWriter
from harness.evidence.money import RunningSum, sum_costs
from harness.meter.wire import WireLog
from harness.providers.base import Exchange, ProviderRequest
from harness.records.final import RunFinal
from harness.records.run_event import RunEvent
from harness.run.kinds import SuiteKind, kind_for
from harness.run.layout import log_seed
from harness.run.ledger import CellState, Ledger
from harness.run.rules import (
    AdmissionInputs,
    Room,
    admission_decision,
    admission_record,
    ceiling_total,
    cost_for_spend,
)
from harness.run.setup import StageSetup
from harness.run.summary import RunProgress, SystemProgress

if TYPE_CHECKING:  # a dry run never sends: the transport (httpx, h11) is imported by the run loop
    from harness.providers.transport import Transport
    from harness.run.remote import RayEngine

__all__ = ["BARRIERS", "FLUSH_ORDER", "EngineCore"]

FLUSH_ORDER: Final = ("attempts", "admission", "finals", "run", "host", "anchors")
"""The logs in the order a group flush writes them, after the wire log and the receipts: an attempt
before the admissions counting its spend, the attempt before the final and the run event naming it,
the final before the pause or stop it causes (docs/run.md, durability)."""
BARRIERS: Final = frozenset({"start", "end", "resume_paused", "signal", "stop", "ceiling", "pause", "late_cost"})
"""Run events after which later lines flush in a later group: the lines that follow may depend on them
(an admission counting a late cost, a budget stop after the ceiling)."""


class EngineCore:
    """One invocation's state: the set-up, the ledger, the logs, spend, stops and pauses."""

    def __init__(self, setup: StageSetup, ledger: Ledger, *, resume_paused: bool,
                 progress: Callable[[RunProgress], None] | None,
                 on_exit: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.s, self.ledger, self.progress_cb, self.on_exit = setup, ledger, progress, on_exit
        d = setup.design
        self.study, self.stage = d.study_id, setup.stage
        self.reserve = d.budgets.reserve_per_item_usd
        self.ceiling = d.budgets.ceiling_usd
        self.rules = d.run
        self.lock = threading.Lock()
        self.clock = Clock(floor=ledger.last_time)
        f = setup.folder
        # Group commit: every line is staged under the lock and made durable by one writer thread; logs
        # flush in this order (a line names only lines of logs flushed before it, or lines a lane waited for)
        self.writer = GroupWriter(name="proctor-logs")
        self.wire = WireLog(os.path.join(f, "wire.jsonl"), f"{self.study}:{self.stage}", group=self.writer)
        self.logs = {name: self.writer.log(os.path.join(f, f"{name}.jsonl"), log_seed(self.study, self.stage, name))
                     for name in FLUSH_ORDER}
        self._reports: list[tuple[int, RunProgress]] = []
        self._reporter: asyncio.Future[None] | None = None
        self.attempt_lines = ledger.attempt_lines
        self.spend = dict(ledger.spend)
        self.spend_parts = {k: list(v) for k, v in ledger.spend_parts.items()}
        # running exact sums (equal to `sum_costs` / `ceiling_total` over the parts, in constant time)
        self.spend_sums = {k: RunningSum(v) for k, v in self.spend_parts.items()}
        self.grand = RunningSum([d.budgets.spend_before_usd, *(p for v in self.spend_parts.values() for p in v)])
        self.under_way = dict.fromkeys(setup.systems, 0)  # attempts admitted whose record is not yet written
        self.admitted = dict.fromkeys(setup.systems, 0)  # this invocation's admitted items
        self.admitted_now: dict[str, set[str]] = {s: set() for s in setup.systems}
        self.refused_lanes: set[tuple[str, int]] = set()  # lanes whose admission refused in this invocation
        self.admitted_items: dict[str, set[str]] = {s: set() for s in setup.systems}  # every invocation's
        for a in ledger.admissions:
            if a["decision"] == "admit" and a["system"] in self.admitted_items:
                self.admitted_items[a["system"]].add(a["item"])
        self.refused = dict.fromkeys(setup.systems, 0)
        # running counters for the progress, counted once here and kept by every event after
        self.cells_of: dict[str, list[CellState]] = {s: [] for s in setup.systems}
        for c in ledger.cells.values():
            if c.request.system in self.cells_of:
                self.cells_of[c.request.system].append(c)
        self.attempts = {s: sum(len(r) for c in cells for r in c.attempts.values())
                         for s, cells in self.cells_of.items()}
        self.standing = {s: sum(c.standing for c in cells) for s, cells in self.cells_of.items()}
        self.items_of = {s: len({c.request.item for c in cells}) for s, cells in self.cells_of.items()}
        self.caps = {s: d.system(s).cap_usd for s in setup.systems}
        self.inconclusive: dict[str, set[str]] = {s: {c.request.item for c in cells if any(
            f.cls == "inconclusive" for _, f, _ in c.finals)} for s, cells in self.cells_of.items()}
        self.stopped: dict[str, str] = {}
        self.paused = {s for s in setup.systems if ledger.paused(s)}
        self.streak = dict.fromkeys(setup.systems, 0)  # transport failures in a row (the breaker)
        self.resume_paused = resume_paused
        self.refused_before = {s for s in setup.systems if ledger.refused_before(s)}
        self.crossed = self.total() > self.ceiling or any(e["event"] == "ceiling" for e in ledger.run_events)
        self.interrupted = False
        self.stops: list[dict[str, Any]] = []
        self.abandoned: set[asyncio.Task[Exchange]] = set()
        self.ceiling_event: asyncio.Event | None = None
        self.ceiling_crossed: asyncio.Future[Any] | None = None  # one waiter on the event for every attempt
        self.pool: VerifierPool | None = None  # the run's warm verifiers, made at the first check
        self.verify_slots: asyncio.Semaphore | None = None
        suite_dir = os.path.dirname(d.packet_path)
        self.suite_dir = suite_dir
        self.kind: SuiteKind = kind_for(suite_dir)  # how an attempt is carried out and scored (run/kinds/)
        self._private: Any = None
        self._private_sha256: Any = None
        self._packet: Any = None
        self._prompts: dict[str, str] | None = None
        self._made_folders: set[str] = set()
        self._requests: dict[str, ProviderRequest] = {}  # each cell's request, built at its first attempt
        self._request_templates: dict[tuple[str, str, str], ProviderRequest] = {}  # by system, arm and setting
        # a delivered attempt's writer ticket, by cell, until its receipt is staged after it (`Finals.verify`)
        self.attempt_tickets: dict[str, int] = {}
        self.transport: Transport | None = None
        self.remote: RayEngine | None = None  # the ray engine (docs/ray.md); None: attempts run here
        self.sent_from: dict[tuple[str, int, int], str] = {}  # the node each remote attempt was sent from
        self.signals = 0
        self.pushes: list[threading.Thread] = []
        self.pending_signals: list[int] = []

    def transport_timeout_s(self) -> float:
        """The transport's own timeout: past every deadline (the deadline abandons an attempt first)."""
        return max(2 * self.rules.attempt_deadline_s, 30.0)

    # ---- bookkeeping under the lock

    def total(self) -> float:
        """`ceiling_total` of spend before and every system's spend parts (kept running: the same exact sum)."""
        return self.grand.value()

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        """Log a run event and wait until it (and everything staged before it) is durable."""
        with self.lock:
            out = self._event_locked(event, **fields)
        self.writer.wait()
        return out

    async def aevent(self, event: str, **fields: Any) -> dict[str, Any]:
        """`event` for the event loop: awaits durability."""
        with self.lock:
            out = self._event_locked(event, **fields)
        await self.writer.settle()
        return out

    def _event_locked(self, event: str, **fields: Any) -> dict[str, Any]:
        """Stage a run event (durable once the writer's ticket is: `writer.wait`, `writer.settle`)."""
        return self.logs["run"].stage(RunEvent(event, self.clock.now(), fields).to_json(), barrier=event in BARRIERS)

    def stop(self, system: str | None, cause: str, detail: str = "") -> None:
        with self.lock:
            self._stop_locked(system, cause, detail)
        self.writer.wait()

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
        part = cost_for_spend(cost_usd, self.reserve)
        self.spend_parts[system].append(part)
        self.spend_sums[system].add(part)
        self.grand.add(part)
        self.spend[system] = self.spend_sums[system].value()  # one exact sum, as the ledger's
        total = self.total()
        if total > self.ceiling and not self.crossed:
            self.crossed = True
            at = self.clock.now()
            for s in self.s.systems:
                self._event_locked("ceiling", system=s, crossed_at=at, total_usd=total, ceiling_usd=self.ceiling)
            self._stop_locked(None, "ceiling", f"spend {total} crossed the ceiling {self.ceiling}")
            if self.ceiling_event is not None:
                self.ceiling_event.set()

    def room_locked(self, system: str) -> float:
        """What an attempt of `system` just admitted may spend inside itself (its allowance; docs/run.md,
        "Budgets inside an attempt"): the smaller of `rooms_locked`'s two, >= 0."""
        return self.rooms_locked(system).usd

    def rooms_locked(self, system: str) -> Room:
        """An attempt of `system` under way: the system's cap less its spend and the reserves its other attempts
        under way hold, and the ceiling less the total and every other attempt's reserve."""
        others = self.under_way[system] - 1
        everyone = sum(self.under_way.values()) - 1
        return Room(cap=sum_costs([self.caps[system], -self.spend[system], -self.reserve * others]),
                    ceiling=sum_costs([self.ceiling, -self.total(), -self.reserve * everyone]))

    def _admit_locked(self, system: str, item: str, lane: int, attempt: tuple[str, int, int]) -> bool:
        """Admit one attempt (run_id, rerun, attempt) under the lock: the decision is logged, and an admitted
        attempt holds the reserve (`under_way`) until its record is written. Every attempt is admitted,
        reruns and transport retries too, so the caps count attempts under way, not items."""
        inputs = AdmissionInputs(
            system=system, item=item, lane=lane, finished_usd=self.spend[system], reserve_usd=self.reserve,
            under_way=self.under_way[system] + 1, cap_usd=self.caps[system],
            refused_before=system in self.refused_before, total_usd=self.total(), ceiling_usd=self.ceiling,
            crossed=self.crossed,
        )
        self.logs["admission"].stage(admission_record(inputs, self.clock.now(), attempt).to_json())
        decision, _ = admission_decision(inputs)
        if decision == "admit":
            self.under_way[system] += 1
            if item not in self.admitted_now[system]:
                self.admitted_now[system].add(item)
                self.admitted[system] += 1
            self.admitted_items[system].add(item)
            return True
        self.refused_before.add(system)
        self.refused_lanes.add((system, lane))
        self.refused[system] += 1
        return False

    # ---- progress

    def _final_written_locked(self, state: CellState, final: RunFinal, was_standing: bool) -> None:
        """Keep the progress counters after a final is appended to `state.finals`."""
        system = state.request.system
        self.standing[system] += int(state.standing) - int(was_standing)
        if final.cls == "inconclusive":
            self.inconclusive[system].add(state.request.item)

    def system_progress(self) -> tuple[SystemProgress, ...]:
        """Each system's progress from the running counters: constant time per system, whatever the
        stage's size (`recount_progress` counts the same from the cells)."""
        out = []
        for s in self.s.systems:
            out.append(self._system_progress(s, self.standing[s], len(self.cells_of[s]), self.items_of[s]))
        return tuple(out)

    def recount(self) -> RunProgress:
        """What `progress` returns, counted again from every cell and spend part (the tests' check of the
        running counters; linear in the stage's size)."""
        total = ceiling_total(self.s.design.budgets.spend_before_usd, self.spend_parts)
        return RunProgress(self.study, self.stage, total, self.ceiling, self.crossed, self.recount_progress())

    def recount_progress(self) -> tuple[SystemProgress, ...]:
        """What `system_progress` returns, counted from every cell."""
        out = []
        for s in self.s.systems:
            cells = [c for c in self.ledger.cells.values() if c.request.system == s]
            out.append(self._system_progress(s, sum(c.standing for c in cells), len(cells),
                                             len({c.request.item for c in cells}),
                                             attempts=sum(len(r) for c in cells for r in c.attempts.values()),
                                             spend=sum_costs(self.spend_parts[s])))
        return tuple(out)

    def _system_progress(self, s: str, standing: int, cells: int, items: int, *, attempts: int | None = None,
                         spend: float | None = None) -> SystemProgress:
        state = ("done" if standing == cells else "paused" if s in self.paused else
                 "refused" if s in self.refused_before else "stopped" if s in self.stopped else "running")
        return SystemProgress(s, len(self.admitted_items[s]), self.refused[s],
                              self.attempts[s] if attempts is None else attempts, standing, cells,
                              self.spend[s] if spend is None else spend, self.caps[s], state,
                              items_admitted_now=self.admitted[s], items=items)

    def progress(self) -> RunProgress:
        return RunProgress(self.study, self.stage, self.total(), self.ceiling, self.crossed, self.system_progress())

    def report(self) -> None:
        """Hand the progress to the callback once every line it counts is durable (at once when it is; else
        from a task, in order)."""
        if self.progress_cb is None:
            return
        with self.lock:
            p, ticket = self.progress(), self.writer.staged
        if not self._reports and self.writer.durable >= ticket:
            self.progress_cb(p)
            return
        self._reports.append((ticket, p))
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.ensure_future(self._report_durable())

    async def _report_durable(self) -> None:
        while self._reports:
            ticket, p = self._reports[0]
            await self.writer.settle(ticket)
            self._reports.pop(0)
            if self.progress_cb is not None:
                self.progress_cb(p)

    async def reported(self) -> None:
        """Wait for the reports still waiting on the disk."""
        if self._reporter is not None:
            await self._reporter
