"""Preflight: every problem that would stop a stage's run, found before any provider call.

`preflight(...)` (what `run_stage(..., preflight=True)` and `proctor run
--preflight` call) checks, and reports each failure as a problem
`{check, message, ...}` rather than stopping at the first:

    prereg      the preregistration is frozen and unchanged (`check_frozen`)
    plan        the stage plans, and matches the folder's plan.jsonl if there is one
    history     the folder's logs read and cross-check (`load_ledger`)
    lock        no other invocation holds the folder
    catalog     every system's model is in the catalog
    credential  every credential variable the catalog names is set
    endpoint    every base URL answers an HTTP GET (any status counts: it is reachable)
    pricing     every system's pricing key is in the pricing table
    budgets     the ceiling is above the spend before; the reserve fits every cap
    suite       the suite's private part loads and seals
    verifier    the warm verifier starts and passes a trivial check

The endpoint check is the only network call, and only preflight makes it. The
admission rule itself lives in `harness.run.rules.admission_decision`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harness.errors import Code, Refusal

if TYPE_CHECKING:
    from harness.run.summary import RunSummary

__all__ = ["preflight"]


def _endpoint(url: str) -> str | None:
    import httpx

    try:
        with httpx.Client(timeout=5.0, trust_env=False, follow_redirects=False) as client:
            client.get(url)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def preflight(
    prereg_dir: str | os.PathLike[str], stage: str, results_dir: str | os.PathLike[str],
    *, base_urls: Mapping[str, str] | None = None,
) -> RunSummary:
    """The preflight summary (`RunSummary` with mode `preflight`); exit_code 0 when nothing stands in the way."""
    from harness.evidence.lock import lock_holder
    from harness.run.rules import ceiling_total
    from harness.run.setup import load_stage_ledger, requests_from, setup_stage
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
    ledger = None
    try:
        setup.requests = requests_from(setup.folder, setup.plan_bytes, write=False)
        ledger = load_stage_ledger(setup)
    except Refusal as exc:
        problem("history" if exc.code != Code.RUN_PLAN_CHANGED else "plan", exc.message, refusal=exc.code, path=exc.path)
    holder = lock_holder(os.path.join(setup.folder, ".invocation.lock"))
    if holder is not None:
        problem("lock", f"another invocation (pid {holder}) holds the results folder", path=setup.folder)
    for slot, model in setup.models.items():
        if model.credential_set() is False:
            problem("credential", f"system {slot}: ${model.credential_env} is not set", system=slot)
        if setup.prices[slot] is None:
            problem("pricing", f"system {slot}: no price for {model.pricing_key!r} in {setup.pricing_path}",
                    system=slot)
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
        from harness.evals.verify_humaneval import VerifierUnavailable, WarmVerifier

        with WarmVerifier() as verifier:
            verdict = verifier.run("def check(candidate):\n    pass\ncheck(None)\n")
        if not verdict.passed:
            problem("verifier", f"the verifier judged a trivial check {verdict.status}: {verdict.detail}")
    except (VerifierUnavailable, OSError) as exc:
        problem("verifier", f"the verifier does not start: {exc}")
    systems = tuple(SystemProgress(s, 0, 0, 0, 0, sum(1 for r in setup.requests if r.system == s),
                                   0.0 if ledger is None else ledger.spend[s], d.system(s).cap_usd, "preflight")
                    for s in setup.systems)
    prog = RunProgress(d.study_id, stage, total, b.ceiling_usd, False, systems)
    ok = not problems
    return RunSummary(ok, 0 if ok else 1, "preflight", d.study_id, stage, setup.folder, False, prog,
                      problems=tuple(problems))
