"""Preflight: every problem that would stop a stage's run, found before any provider call.

The manual: docs/running.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harness.errors import Code, Refusal

if TYPE_CHECKING:
    from harness.evals.verify_pool import VerifierPool
    from harness.run.kinds import SuiteKind
    from harness.run.summary import RunSummary

__all__ = ["BLOCKING_CHECKS", "preflight", "require_ready"]

BLOCKING_CHECKS = ("endpoint", "credential", "pricing", "suite", "verifier")
"""The preflight checks `proctor run` refuses on before its first provider call (`require_ready`):
what would otherwise turn every attempt into a failure (an unreachable endpoint, a missing credential,
a model without a price, a suite or verifier that cannot judge). The others (the freeze, the plan, the
history, the lock, the budgets) the run itself refuses or handles, with their own codes."""


def _endpoint(url: str) -> str | None:
    """None when `url` answers a GET with any HTTP response, else why not. A plain `http://` URL (a local
    model, the simulator) is asked with the standard library's client, which sets up no TLS; others
    with httpx (its certificate store, as the transport's). Neither follows a redirect or a proxy."""
    if url.startswith("http://"):
        import http.client
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5.0)
            try:
                conn.request("GET", target, headers={"Accept": "*/*"})
                conn.getresponse().read()
            finally:
                conn.close()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None
    import httpx

    try:
        with httpx.Client(timeout=5.0, trust_env=False, follow_redirects=False) as client:
            client.get(url)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def preflight(
    prereg_dir: str | os.PathLike[str], stage: str, results_dir: str | os.PathLike[str],
    *, base_urls: Mapping[str, str] | None = None, verifiers: VerifierPool | None = None,
) -> RunSummary:
    """The preflight summary (`RunSummary` with mode `preflight`); exit_code 0 when nothing stands in the way.

    With `verifiers` (the pool the run that follows will check on), a kind that checks on warm verifiers
    has the stage's share of them (`pool_size` of its lanes) launched as soon as the plan is read, so
    that they start while the other checks run, and judges its trial check on one of them.
    """
    from harness.evidence.lock import lock_holder
    from harness.prereg.go import go_problem
    from harness.run.kinds import kind_for
    from harness.run.rules import ceiling_total
    from harness.run.setup import load_stage_ledger, pin_plan, setup_stage
    from harness.run.summary import RunProgress, RunSummary, SystemProgress

    problems: list[dict[str, Any]] = []

    def problem(check: str, message: str, **extra: Any) -> None:
        problems.append({"check": check, "message": message, **extra})

    try:
        setup = setup_stage(prereg_dir, stage, results_dir, base_urls)
    except Refusal as exc:
        problem("prereg" if exc.code.startswith(("prereg", "frozen", "amend")) else "plan",
                exc.message, refusal=exc.code, path=exc.path)
        empty = RunProgress("", stage, 0.0, 0.0, False, ())
        return RunSummary(False, 1, "preflight", "", stage, "", False, empty, problems=tuple(problems))
    d = setup.design
    kind: SuiteKind | None = None
    kind_refusal: Refusal | None = None
    try:
        kind = kind_for(os.path.dirname(d.packet_path))
    except Refusal as exc:  # reported with the suite's other problems, below
        kind_refusal = exc
    ledger = None
    try:
        pin_plan(setup, write=False)
        ledger = load_stage_ledger(setup)
    except Refusal as exc:
        problem("plan" if exc.code in (Code.RUN_PLAN_CHANGED, Code.AMENDMENT_CHANGES_STAGE) else "history", exc.message, refusal=exc.code, path=exc.path)
    if verifiers is not None and kind is not None and kind.uses_verifier_pool and setup.requests:
        from harness.evals.verify_pool import pool_size

        verifiers.prestart(pool_size(d.run.lanes_per_system * len(setup.systems)))  # the run's share
    holder = lock_holder(os.path.join(setup.folder, ".invocation.lock"))
    if holder is not None:
        problem("lock", f"another invocation (pid {holder}) holds the results folder", path=setup.folder)
    for slot, model in setup.models.items():
        if model.credential_set() is False:
            problem("credential", f"system {slot}: ${model.credential_env} is not set", system=slot)
        if setup.prices[slot] is None:
            problem("pricing", f"system {slot}: no price for {model.pricing_key!r} in {setup.pricing_path}",
                    system=slot)
    try:
        missing = go_problem(setup.frozen, stage, setup.models, setup.base_urls)
    except Refusal as exc:
        missing = (exc.message, [])
    if missing is not None:
        problem("go", missing[0], refusal=Code.GO_REQUIRED, systems=missing[1])
    for url in sorted(set(setup.base_urls.values())):
        why = _endpoint(url)
        if why is not None:
            problem("endpoint", f"{url} is not reachable: {why}", url=url)
    b = d.budgets
    total = b.spend_before_usd if ledger is None else ceiling_total(b.spend_before_usd, ledger.spend_parts)
    if total >= b.ceiling_usd:
        problem("budgets", f"spend {total} already reaches the ceiling {b.ceiling_usd}")
    for slot in setup.systems:
        if b.reserve_per_item_usd > d.system(slot).cap_usd:
            problem("budgets", f"system {slot}: the reserve per item exceeds its cap: nothing can be admitted",
                    system=slot)
    try:
        from harness.evals.suite import load_private

        load_private(os.path.dirname(d.packet_path))
    except Refusal as exc:
        problem("suite", exc.message, refusal=exc.code, path=exc.path)
    try:
        if kind_refusal is not None:
            raise kind_refusal
        assert kind is not None
        for check, message in kind.preflight(verifiers):  # can the kind judge?
            problem(check, message)
    except Refusal as exc:
        problem("suite", exc.message, refusal=exc.code, path=exc.path)
    systems = tuple(SystemProgress(s, 0, 0, 0, 0, sum(1 for r in setup.requests if r.system == s),
                                   0.0 if ledger is None else ledger.spend[s], d.system(s).cap_usd, "preflight",
                                   items=len({r.item for r in setup.requests if r.system == s}))
                    for s in setup.systems)
    prog = RunProgress(d.study_id, stage, total, b.ceiling_usd, False, systems)
    ok = not problems
    return RunSummary(ok, 0 if ok else 1, "preflight", d.study_id, stage, setup.folder, False, prog,
                      problems=tuple(problems))


def require_ready(summary: RunSummary) -> None:
    """Refuse `run_preflight_failed` (naming every blocking problem) unless the preflight found none of
    `BLOCKING_CHECKS`; called by `proctor run` before the stage's first provider call."""
    from harness.errors import RunRefusal

    blocking = [p for p in summary.problems if p.get("check") in BLOCKING_CHECKS]
    if blocking:
        raise RunRefusal(
            Code.RUN_PREFLIGHT_FAILED,
            f"the preflight of stage {summary.stage} found {len(blocking)} problem(s); no provider was called:\n"
            + "\n".join(f"  {p['check']}: {p['message']}" for p in blocking),
            summary.folder or None, problems=blocking,
        )
