"""A run's end: its final (class and action by the rules), the archives of the finals it replaces,
and the warm verifier's receipt for a delivered answer.

The manual: docs/run.md.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import nullcontext
from typing import Any

from harness.errors import Code, RunRefusal
from harness.evals.suite import load_private
from harness.evals.verify_humaneval import VerifierUnavailable, verify_response
from harness.evals.verify_pool import VerifierPool, pool_size
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import (
    canonical_line,
    read_bytes,
    read_json,
    sha256_hex,
)
from harness.records.final import Replaced, RunFinal
from harness.run.engine import EngineCore
from harness.run.layout import archive_name, receipt_name
from harness.run.ledger import CellState
from harness.run.rules import INCONCLUSIVE_ITEMS_LIMIT, action_for, classify

__all__ = ["Finals"]


class Finals(EngineCore):
    """Writing finals and receipts (on the engine's state)."""

    def write_final(self, state: CellState, receipt: tuple[str, str, bool] | None) -> RunFinal:
        line, attempt, sha = state.current()[-1]
        rerun = state.rerun
        cls = classify(attempt)
        action = action_for(cls, rerun, self.rules.reruns)
        replaced = tuple(Replaced(old.rerun, archive_name(state.request.run_id, old.rerun), sha256_hex(raw + b"\n"),
                                  old.attempt_sha256) for _, old, raw in state.finals)
        r = state.request
        with self.lock:
            final = RunFinal(
                run_id=r.run_id, system=r.system, item=r.item, arm=r.arm, repeat=r.repeat, rerun=rerun, cls=cls,
                action=action, error_code=attempt.get("error_code"), attempt=attempt["attempt"], attempt_line=line,
                attempt_sha256=sha, passed=None if receipt is None else receipt[2],
                receipt=None if receipt is None else receipt[0],
                receipt_sha256=None if receipt is None else receipt[1], replaced=replaced, at=self.clock.now(),
            )
            log = self.logs["finals"]
            log.stage(final.to_json())
            was_standing = state.standing
            state.finals.append((0, final, log.appended_line))  # the line's bytes, as the writer encoded them
            self._final_written_locked(state, final, was_standing)
            if action == "pause":
                self.paused.add(r.system)
                self._event_locked("pause", system=r.system, run_id=r.run_id, error_code=attempt.get("error_code"))
            elif action == "stop":
                cause = "deadline" if attempt.get("error_code") == "AttemptDeadline" else cls
                self._stop_locked(r.system, cause, f"{r.run_id}: {attempt.get('error_code')}")
            if cls == "inconclusive" and len(self.inconclusive[r.system]) > INCONCLUSIVE_ITEMS_LIMIT:
                self._stop_locked(r.system, "inconclusive", "inconclusive failures ended runs in more than "
                                  f"{INCONCLUSIVE_ITEMS_LIMIT} items")
        return final

    def ensure_archives(self, state: CellState) -> None:
        """Byte copies of every earlier final, before the cell's next run (idempotent after a crash)."""
        for _, old, raw in state.finals:
            path = os.path.join(self.s.folder, archive_name(state.request.run_id, old.rerun))
            if os.path.exists(path):
                if read_bytes(path) != raw + b"\n":
                    raise RunRefusal(Code.RUN_ARCHIVE_MISMATCH, "an archive is not a byte copy of its final", path)
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, raw + b"\n", mode=0o644)

    # ---- verification

    def private(self) -> Any:
        """The suite's private part and the manifest's `private_sha256`, read once per invocation."""
        if self._private is None:
            manifest = read_json(os.path.join(self.suite_dir, "SUITE.json")).value
            self._private_sha256 = manifest.get("private_sha256")
            self._private = load_private(self.suite_dir)
        return self._private

    def verifier_pool(self) -> VerifierPool:
        """The run's warm verifiers, shared by every system: min(lanes, cores), started on demand."""
        if self.pool is None:
            self.pool = VerifierPool(pool_size(self.rules.lanes_per_system * len(self.s.systems)))
        return self.pool

    def verify(self, state: CellState) -> tuple[str, str, bool]:
        """Verify the current run's delivered answer; write its receipt; (name, sha256, passed)."""
        _, attempt, sha = state.current()[-1]
        r = state.request
        item = self.private()[r.item]
        if item.test is None or item.entry_point is None:
            raise VerifierUnavailable(f"item {r.item} has no hidden test")
        packet_prompt = self._packet_prompt(r.item)
        # the ray engine checks on a node's warm verifier (docs/ray.md); the local one leases from its pool
        lease = nullcontext(self.remote.verifier) if self.remote is not None else self.verifier_pool().lease()
        with lease as verifier:
            _, receipt = verify_response(
                verifier, suite=self.s.design.suite_name, item=r.item, prompt=packet_prompt,
                entry_point=item.entry_point, test=item.test, response_text=attempt.get("text") or "",
                private_sha256=self._private_sha256, clock=self.clock.now,
            )
        receipt.update(run_id=r.run_id, rerun=state.rerun, attempt_sha256=sha)
        ticket = self.attempt_tickets.pop(r.run_id, None)
        if ticket is not None:  # the check ran while its attempt was made durable: the receipt comes after it
            self.writer.wait(ticket)
        name = receipt_name(r.run_id, state.rerun)
        data = canonical_line(receipt)
        path = os.path.join(self.s.folder, name)
        folder = os.path.dirname(path)
        if folder not in self._made_folders:
            os.makedirs(folder, exist_ok=True)
            self._made_folders.add(folder)
        self.writer.stage_file(path, data, mode=0o644)  # durable (group flush) before the final naming it
        return name, sha256_hex(data), bool(receipt["passed"])

    def _packet_prompt(self, item: str) -> str:
        """The item's prompt from the packet, read once per invocation."""
        if self._prompts is None:
            from harness.evals.suite import load_packet

            self._packet = load_packet(self.s.design.packet_path, self.s.design.packet_sha256)
            self._prompts = {it.item: str(it.prompt) for it in self._packet}
        prompt = self._prompts.get(item)
        return str(self._packet.get(item).prompt) if prompt is None else prompt  # else: the refusal

    async def finish_run(self, state: CellState) -> None:
        """Stage the final of a run that ended (verifying a delivered answer first). The lane's next wait makes
        it durable (its next admission, a rerun's archives, its end): nothing acts on it before then, and
        its report waits for it (`report`)."""
        _, attempt, _ = state.current()[-1]
        receipt = None
        if attempt["outcome"] == "delivered":
            if self.verify_slots is None:  # a lease never waits on a thread: the checks queue here
                self.verify_slots = asyncio.Semaphore(self.verifier_pool().size)
            try:
                async with self.verify_slots:
                    receipt = await asyncio.to_thread(self.kind.verify, self, state)
            except (VerifierUnavailable, OSError) as exc:
                self.stop(state.request.system, "harness", f"the verifier failed: {exc}")
                return
        self.write_final(state, receipt)
