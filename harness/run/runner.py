"""The interleaved study runner: `run_stage` (the library call) behind `proctor run` and the notebook.

`proctor run PREREG --stage S --results DIR` and `notebooks/run_study.ipynb`
make the same call, `run_stage(prereg_dir, stage, results_dir, ...)`. The engine
is split by rule: `engine` (bookkeeping, spend and the ceiling, admission),
`finals` (finals, reruns, archives, receipts), `lanes` (lanes and attempts) and
`upkeep` (host samples, anchors, signals, crash repair); the stage's set-up is
`setup`. The results folder's files are described in docs/records.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from harness.errors import Code, Refusal, RunRefusal
from harness.evals.verify_pool import VerifierPool, pool_size
from harness.evidence.jsonio import sha256_hex
from harness.evidence.lock import InvocationLock
from harness.prereg.folder import GO_NAME
from harness.prereg.go import go_problem
from harness.records.provenance import Provenance, provenance_soon
from harness.run.ledger import CellState, Ledger
from harness.run.remote import ENGINES, open_engine
from harness.run.rules import exhausted
from harness.run.setup import StageSetup, load_stage_ledger, pin_plan, setup_stage
from harness.run.summary import RunProgress, RunSummary
from harness.run.upkeep import Interrupts, Upkeep, deferred_signals

__all__ = ["run_stage"]

LATE_COST_GRACE_S: Final = 30.0
"""At most this long (and at most one deadline) the end waits for abandoned requests' spend."""


class _Engine(Upkeep):
    """One invocation of a stage: every rule of the engine, and the whole run (`main`)."""

    given_pool = False
    """Whether `pool` is the caller's (`run_stage(verifiers=...)`): then the caller closes it."""

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
        crossed: asyncio.Future[Any] = asyncio.ensure_future(self.ceiling_event.wait())
        self.ceiling_crossed = crossed
        background: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self.sampler()), asyncio.ensure_future(self.anchorer()), crossed]
        n_lanes = self.rules.lanes_per_system
        try:
            if self.remote is None and self.kind.uses_verifier_pool and any(
                    not c.standing for c in self.ledger.cells.values()):
                # launched now: their start overlaps the transport's import and the first requests
                self.verifier_pool().prestart(pool_size(n_lanes * len(self.s.systems)))
            # httpx and h11: only a run that sends needs them, never a dry run
            from harness.providers.transport import Transport

            async with Transport(timeout_s=self.transport_timeout_s(),
                                 max_connections=max(1, n_lanes * len(self.s.systems)) + 4) as transport:
                self.transport = transport
                # each lane's cells by lane position, in one pass over the cells (not one per lane)
                by_lane: dict[tuple[str, int], dict[int, list[CellState]]] = {}
                for c in self.ledger.cells.values():
                    by_lane.setdefault((c.request.system, c.request.lane), {}).setdefault(
                        c.request.lane_position, []).append(c)
                lanes = []
                for system in self.s.systems:
                    for lane in range(n_lanes):
                        positions = by_lane.get((system, lane), {})
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
                await self.reported()
        finally:
            for task in background:
                task.cancel()
            for installed_signum in installed:
                loop.remove_signal_handler(installed_signum)
            if self.pool is not None and not self.given_pool:
                self.pool.close()


# --------------------------------------------------------------------------
# The library call


def _cells_summary(ledger: Ledger, engine: _Engine | None) -> tuple[dict[str, Any], ...]:
    out = []
    for c in ledger.cells.values():
        last = c.last_final
        paused = engine is not None and c.request.system in engine.paused
        state = ("exhausted" if c.standing and last is not None and exhausted(last.cls, last.action) else
                 "standing" if c.standing else "paused" if paused else "owed")
        out.append({"run_id": c.request.run_id, "system": c.request.system, "item": c.request.item,
                    "arm": c.request.arm, "repeat": c.request.repeat, "state": state,
                    "class": None if last is None else last.cls,
                    "action": None if last is None else last.action,
                    "passed": None if last is None else last.passed,
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
    on_exit: Callable[[dict[str, Any]], None] | None = None,
    interrupts: Interrupts | None = None,
    engine: str = "local",
    address: str | None = None,
    verifiers: VerifierPool | None = None,
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
        on_exit: called with the exit record (`Upkeep.exit_record`) when a second signal
            exits the process at once; the process then ends with 128 + the signal number.
        interrupts: signals delivered from another thread (a kernel's KeyboardInterrupt, when
            this call runs on a worker thread): the same first and second signal as SIGINT.
        engine: where the attempts' work runs: `local` (this process) or `ray` (a Ray cluster's nodes,
            this process the single writer; docs/ray.md).
        address: the Ray cluster's address for the ray engine (default: Ray's own discovery).
        verifiers: warm verifiers to check on (the local engine) and for the preflight's trial check,
            shared by a preflight and the run after it (`proctor run`); the caller closes them. By
            default the run makes its own pool, launched at its start, and closes it at its end.

    Returns:
        The summary; `exit_code` 0 only when every cell of the stage has a standing final.

    Raises:
        Refusal: an unfrozen or changed preregistration, a changed plan, a folder held by
            another invocation (`invocation_locked`), or any history it cannot read.
    """
    if preflight:
        from harness.run.preflight import preflight as run_preflight

        return run_preflight(prereg_dir, stage, results_dir, base_urls=base_urls, verifiers=verifiers)
    if engine not in ENGINES or (engine == "local" and address is not None):
        open_engine(engine, address)  # refuses (engine_invalid)
    # a run's provenance (two git commands, ~30 ms) is found while the stage is set up and its folder read
    provenance = None if dry_run else provenance_soon()
    setup = setup_stage(prereg_dir, stage, results_dir, base_urls)
    d = setup.design
    if not dry_run:
        missing = go_problem(setup.frozen, stage, setup.models, setup.base_urls)
        if missing is not None:
            raise RunRefusal(Code.GO_REQUIRED, missing[0], os.path.join(setup.frozen.path, GO_NAME), systems=missing[1])
    if dry_run:
        pin_plan(setup, write=False)
        ledger = load_stage_ledger(setup)
        dry = _Engine(setup, ledger, resume_paused=False, progress=None)
        cells = _cells_summary(ledger, dry)
        complete = all(c["state"] == "standing" for c in cells)
        return RunSummary(True, 0 if complete else 1, "dry_run", d.study_id, stage, setup.folder, complete,
                          dry.progress(), cells=cells)
    os.makedirs(setup.folder, exist_ok=True)
    with InvocationLock(os.path.join(setup.folder, ".invocation.lock")):
        pin_plan(setup, write=True)
        ledger = load_stage_ledger(setup)
        remote = open_engine(engine, address)  # the ray engine checks every node's sandbox before the start
        run = _Engine(setup, ledger, resume_paused=resume_paused, progress=progress, on_exit=on_exit)
        run.remote = remote
        if verifiers is not None and remote is None:
            run.pool, run.given_pool = verifiers, True
        try:
            assert provenance is not None
            summary = _invoke(run, setup, ledger, resume_paused, interrupts, provenance)
        except BaseException:
            with contextlib.suppress(Refusal):  # the first error is the one to report
                run.writer.close()
            raise
        finally:
            if remote is not None:
                remote.close()
        run.writer.close()  # every line is durable already: this stops the writer thread
        return summary


def _invoke(engine: _Engine, setup: StageSetup, ledger: Ledger, resume_paused: bool,
            interrupts: Interrupts | None, provenance: Callable[[], Provenance]) -> RunSummary:
    """One invocation under the folder's lock: recover, start, the loop, the end and its anchor."""
    d, stage = setup.design, setup.stage
    with deferred_signals(engine):
        engine.recover()
        engine.event("start", pid=os.getpid(), dry_run=False, resume_paused=resume_paused,
                     plan_sha256=sha256_hex(setup.plan_bytes), ceiling_usd=engine.ceiling,
                     spend_before_usd=d.budgets.spend_before_usd, reruns=d.run.reruns,
                     transport_retries=d.run.transport_retries,
                     provenance=provenance().to_json(),
                     systems=[{"slot": s, "cap_usd": d.system(s).cap_usd, "lanes": d.run.lanes_per_system}
                              for s in setup.systems],
                     **({} if engine.remote is None else {"engine": engine.remote.record()}))
        if resume_paused:
            for s in sorted(engine.paused):
                engine.event("resume_paused", system=s)
            engine.paused.clear()
        engine.sample("start")
    engine.take_pending_signals()
    if interrupts is not None:
        interrupts.attach(engine)
    _run_loop(engine)
    with deferred_signals(engine):
        engine.sample("end")
        if interrupts is not None:
            interrupts.detach()
        engine.take_pending_signals()
        cells = _cells_summary(ledger, engine)
        complete = all(c["state"] == "standing" for c in cells)
        code = 0 if complete else 1
        engine.event("end", exit_code=code, complete=complete, stops=engine.stops)
        engine.anchor("end")
        engine.join_pushes()
    return RunSummary(complete, code, "run", d.study_id, stage, setup.folder, complete, engine.progress(),
                      stops=tuple(engine.stops), cells=cells)


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
