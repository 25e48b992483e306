"""The lanes: each system's lanes take their items in plan order, run each item's cells in arm order
and then the reruns they ask for. Every attempt is admitted (its reserve held while it is under way)
and its intent written before it is sent; it is then metered, recorded and logged, or abandoned at
the deadline or the ceiling (its spend then arrives as a late cost).

The manual: docs/run.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from harness.evidence.money import sum_costs
from harness.meter.cost import Cost, meter
from harness.providers.base import Exchange, GenerationSettings, ProviderRequest
from harness.providers.registry import adapter_for
from harness.records.plan import PlanCell
from harness.run.attempts import attempt_from_exchange, error_attempt, never_sent
from harness.run.finals import Finals
from harness.run.ledger import CellState
from harness.run.remote import NodeLost
from harness.run.rules import (
    BREAKER_CODE,
    BREAKER_FAILURES,
    Room,
    booked_spend,
    classify,
    run_ended,
    unreachable,
)

__all__ = ["Lanes"]


class Lanes(Finals):
    """Attempts and lanes (on the engine's state, writing finals)."""

    # ---- records

    def _append_attempt_locked(self, cell: PlanCell, record: dict[str, Any], lane: int, *,
                               recovered: bool = False, node: str | None = None) -> tuple[int, str]:
        log = self.logs["attempts"]
        written = log.stage(record)
        self.attempt_lines += 1
        line, sha = self.attempt_lines, log.appended_head  # the writer's hash of the line: never encoded twice
        assert sha is not None
        body = {k: v for k, v in written.items() if k not in ("prev", "seed")}
        self.ledger.cells[cell.run_id].attempts.setdefault(record["rerun"], []).append((line, body, sha))
        self.attempts[cell.system] += 1
        self._event_locked("attempt", system=cell.system, lane=lane, run_id=cell.run_id, rerun=record["rerun"],
                           attempt=record["attempt"], attempts_line=line, attempt_sha256=sha,
                           started=record["started"], ended=record["ended"], cost_usd=record["cost_usd"],
                           **{"class": classify(record)}, **({"recovered": True} if recovered else {}),
                           **({"node": node} if node is not None else {}))
        self.ledger.logged_attempt_lines.add(line)
        self._breaker_locked(cell, record)
        for system, amount in booked_spend(record, cell.system, self.reserve, self.spend_parts):
            self._add_spend_locked(system, amount)
        return line, sha

    def _breaker_locked(self, cell: PlanCell, record: dict[str, Any]) -> None:
        """Count unreachable attempts in a row; the `BREAKER_FAILURES`th pauses the system (logged next)."""
        system = cell.system
        if not unreachable(record):
            self.streak[system] = 0
            return
        self.streak[system] += 1
        if self.streak[system] >= BREAKER_FAILURES and system not in self.paused:
            self.paused.add(system)
            self._event_locked("pause", system=system, run_id=cell.run_id, error_code=BREAKER_CODE)

    # ---- attempts

    def provider_request(self, r: PlanCell) -> ProviderRequest:
        """The cell's request (the plan's exact bytes), built once per cell and invocation."""
        built = self._requests.get(r.run_id)
        if built is None:
            built = self._requests[r.run_id] = self._build_request(r)
        return built

    def _build_request(self, r: PlanCell) -> ProviderRequest:
        """The adapter's request for the cell's system and arm, with the plan's exact body bytes. The URL and
        headers an adapter makes do not depend on the prompt, so the adapter builds them once per system and
        arm (its checks of the model and settings included) and each cell takes them with its own body."""
        key = (r.system, r.arm, r.setting)
        made = self._request_templates.get(key)
        if made is None:
            settings = GenerationSettings(
                max_output_tokens=self.rules.max_output_tokens, temperature=self.s.design.arm(r.arm).temperature,
                reasoning_effort=None if r.setting == "default" else r.setting,
            )
            made = adapter_for(r.api_shape).build_request(r.api_model, r.prompt, settings, self.s.base_urls[r.system])
            self._request_templates[key] = made
        return dataclasses.replace(made, body=r.body, body_sha256=r.request_sha256)  # the plan's exact bytes

    def _meter(self, exchange: Exchange, system: str) -> Cost:
        return meter(exchange.parsed.usage, self.s.prices[system])

    async def attempt(self, state: CellState, lane: int) -> dict[str, Any] | None:
        """Carry out the next attempt of the cell's current run as the suite's kind does (run/kinds/)."""
        return await self.kind.attempt(self, state, lane)

    async def begin_attempt(self, r: PlanCell, rerun: int, number: int, lane: int) -> tuple[float, float] | None:
        """Admit an attempt and write its intent (a kind's own attempt), both durable before it returns;
        (its start time, the intent's: a `runner_lost` resolving it starts there; what it may spend inside
        itself: `room_locked` at its admission), or None when refused."""
        begun: tuple[float, float] | None = None
        with self.lock:
            if self.halted(r.system):
                return None
            if self._admit_locked(r.system, r.item, lane, (r.run_id, rerun, number)):
                intent = self._event_locked("intent", system=r.system, lane=lane, run_id=r.run_id, rerun=rerun,
                                            attempt=number, reserve_usd=self.reserve)
                begun = (float(intent["at"]), self.room_locked(r.system))
        await self.writer.settle()  # the decision and the intent durable before acting on them
        return begun

    def room_now(self, system: str) -> Room:
        """`rooms_locked` now, for an attempt of `system` under way (its allowance when it gets its turn)."""
        with self.lock:
            return self.rooms_locked(system)

    def escalation_room(self, system: str, spent: float) -> Room:
        """What a live cascade's later step on `system` may spend inside its attempt (docs/run.md, "Cascade
        arms"): `system`'s cap less its spend and the reserve of each of its attempts under way (the asking
        attempt is under its first system), and the ceiling less the total, the earlier steps' `spent` (not
        yet recorded) and every other attempt's reserve; nothing when `system` is halted. The ray engine asks
        it when the order is made, `spent` the earlier steps' whole allowances (docs/ray.md)."""
        with self.lock:
            if self.halted(system) or system not in self.spend:
                return Room(0.0, 0.0)
            room = self.rooms_locked(system)  # as for an attempt of `system`: this one holds no reserve of it
            return Room(cap=sum_costs([room.cap, -self.reserve]), ceiling=sum_costs([room.ceiling, -spent]))

    async def end_attempt(self, r: PlanCell, lane: int, record: dict[str, Any], *, node: str | None = None) -> None:
        """Append a kind's attempt record (its `ended` stamped now; `node`: the ray engine's node that did its
        work, for the run event), release its reserve, wait until durable."""
        with self.lock:
            ended = max(self.clock.now(), record["started"])
            record.update(ended=ended, latency_s=ended - record["started"])
            self._append_attempt_locked(r, record, lane, node=node)
            self.under_way[r.system] -= 1
        await self.writer.settle()

    async def request_attempt(self, state: CellState, lane: int) -> dict[str, Any] | None:
        """Send the next attempt of the cell's current run; its record, or None when none may start."""
        r, rerun, number = state.request, state.rerun, state.next_attempt()
        request = self.provider_request(r)
        model = self.s.models[r.system]
        credential = os.environ.get(model.credential_env) if model.credential_env else None
        with self.lock:
            if self.halted(r.system):
                return None
            admitted = self._admit_locked(r.system, r.item, lane, (r.run_id, rerun, number))
            if admitted:
                # the intent, fsynced before the request leaves: a crash from here on leaves it to be
                # resolved on resume at the reserve (or its true cost from the wire log)
                intent = self._event_locked("intent", system=r.system, lane=lane, run_id=r.run_id, rerun=rerun,
                                            attempt=number, reserve_usd=self.reserve)
                started = self.clock.now()  # under the lock of the admission: before any later stop
        await self.writer.settle()  # the decision and the intent durable before acting on them
        if not admitted:
            return None
        assert self.transport is not None and self.ceiling_event is not None and self.ceiling_crossed is not None
        key = (r.run_id, rerun, number)
        send = asyncio.ensure_future(self.transport.asend(request, credential) if self.remote is None
                                     else self._remote_send(key, request, credential))
        # the run's one waiter on the ceiling (not a task per attempt); `wait` leaves it running
        waiting: set[asyncio.Future[Any]] = {send, self.ceiling_crossed}
        done, _ = await asyncio.wait(waiting, timeout=self.rules.attempt_deadline_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if send in done and self.remote is not None and isinstance(send.exception(), NodeLost):
            return await self._node_lost(r, lane, rerun, number, float(intent["at"]), str(send.exception()))
        if send in done:
            exchange = send.result()
            cost = self._meter(exchange, r.system)
            record = attempt_from_exchange(r, number, exchange, cost)
            with self.lock:
                self.wire.append_exchange(exchange)
                ended = self.clock.now()
                record.update(rerun=rerun, started=started, ended=ended, latency_s=ended - started)
                node = None if self.remote is None else self.sent_from.pop(key, None)
                self._append_attempt_locked(r, record, lane, node=node)
                self.under_way[r.system] -= 1
                ticket = self.writer.staged
            if record["outcome"] == "delivered":
                # its check may start while the writer makes these lines durable: the receipt is staged only
                # once they are (`Finals.verify`); the lane's next admission waits for the final after it
                self.attempt_tickets[r.run_id] = ticket
                return record
            await self.writer.settle()
            return record
        code = "budget_stop" if self.ceiling_event.is_set() else "AttemptDeadline"
        if self.remote is not None:
            self.remote.close_attempt(key)  # its result, if it comes, is ignored as a result (its spend is a late cost)
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
            self.under_way[r.system] -= 1
        await self.writer.settle()
        return record

    async def _remote_send(self, key: tuple[str, int, int], request: ProviderRequest,
                           credential: str | None) -> Exchange:
        """The provider call on a node of the Ray engine; the node that sent it is kept for the run event."""
        assert self.remote is not None
        exchange, node = await self.remote.asend(key, request, credential, self.transport_timeout_s())
        self.sent_from[key] = node
        return exchange

    async def _node_lost(self, r: PlanCell, lane: int, rerun: int, number: int, intent_at: float,
                         why: str) -> dict[str, Any]:
        """A node died with the attempt under way: resolved through its intent as a crash is (a `runner_lost`
        attempt costing the reserve, class provider), so the cell is retried, on a node still alive."""
        with self.lock:
            record = error_attempt(
                r, number, error_code="runner_lost", started=intent_at, ended=self.clock.now(),
                error_message=f"the Ray node running the attempt was lost before its result came back ({why})",
                cost=Cost(None, status="usage_unknown", reason="the node was lost with the request under way"),
            )
            record["rerun"] = rerun
            self._append_attempt_locked(r, record, lane)
            self.under_way[r.system] -= 1
        await self.writer.settle()
        return record

    def _late(self, task: asyncio.Task[Exchange], r: PlanCell, rerun: int, number: int) -> None:
        self.abandoned.discard(task)
        if task.cancelled() or task.exception() is not None:
            # It may still have been billed: unknown, counted as the reserve like every unknown cost.
            with self.lock:
                self._event_locked("late_cost", system=r.system, run_id=r.run_id, rerun=rerun, attempt=number,
                                   cost_usd="unknown", cost_status="usage_unknown", wire_line=None)
                self._add_spend_locked(r.system, "unknown")
            return
        exchange = task.result()
        cost = Cost(0.0) if never_sent(exchange) else self._meter(exchange, r.system)  # never left: $0
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
        if state.last_final is not None and state.last_final.action == "pause" and state.request.system in self.paused:
            return
        if state.unfinalised(self.rules.transport_retries):
            await self.finish_run(state)
            return
        if state.finals and not state.current():
            await self.writer.settle()  # the final before its byte copy and the run that replaces it
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
        await self.aevent("lane", system=system, lane=lane, what="start", cause=None)
        cause = "done"
        for cells in items:
            if all(c.standing for c in cells):
                continue
            if self.halted(system):
                cause = "interrupt" if self.interrupted else ("paused" if system in self.paused else "stopped")
                break
            for c in cells:
                await self.run_cell(c, lane)
                if (system, lane) in self.refused_lanes:
                    break
            while not self.halted(system) and (system, lane) not in self.refused_lanes:  # reruns, in passes
                todo = [c for c in cells if c.last_final is not None and c.last_final.action == "rerun"]
                if not todo:
                    break
                for c in todo:
                    await self.run_cell(c, lane)
                    if (system, lane) in self.refused_lanes:
                        break
            if (system, lane) in self.refused_lanes:
                cause = "refused"
                self.report()
                break
        await self.aevent("lane", system=system, lane=lane, what="end", cause=cause)
