"""The `completion` kind (HumanEval): one request per attempt, judged by the warm verifier.

The engine's own request path (`Lanes.request_attempt`) and verifier (`Finals.verify`) carry it out;
its records are byte for byte those before kinds existed. The manual: docs/run.md ("Suite kinds").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.run.kinds.base import KindHost, SuiteKind, VerifyHost
from harness.run.ledger import CellState

if TYPE_CHECKING:
    from harness.evals.verify_pool import VerifierPool

__all__ = ["CompletionKind"]


class CompletionKind(SuiteKind):
    """One request, one answer, one warm-verifier receipt."""

    name = "completion"
    uses_verifier_pool = True

    async def attempt(self, host: KindHost, state: CellState, lane: int) -> dict[str, Any] | None:
        return await host.request_attempt(state, lane)

    def preflight(self, verifiers: VerifierPool | None = None) -> list[tuple[str, str]]:
        """A warm verifier (one of `verifiers`, kept for the run, else one of its own) starts and judges a
        trivial check."""
        from contextlib import AbstractContextManager

        from harness.evals.verify_humaneval import VerifierUnavailable, WarmVerifier

        lease: AbstractContextManager[WarmVerifier] = WarmVerifier() if verifiers is None else verifiers.lease()
        try:
            with lease as verifier:
                verdict = verifier.run("def check(candidate):\n    pass\ncheck(None)\n")
        except (VerifierUnavailable, OSError) as exc:
            return [("verifier", f"the verifier does not start: {exc}")]
        if not verdict.passed:
            return [("verifier", f"the verifier judged a trivial check {verdict.status}: {verdict.detail}")]
        return []

    def verify(self, host: VerifyHost, state: CellState) -> tuple[str, str, bool]:
        return host.verify(state)
