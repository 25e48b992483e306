"""The `completion` kind (HumanEval): one request per attempt, judged by the warm verifier.

The engine's own request path (`Lanes.request_attempt`) and verifier (`Finals.verify`) carry it out;
its records are byte for byte those before kinds existed. The manual: docs/run.md ("Suite kinds").
"""

from __future__ import annotations

from typing import Any

from harness.run.kinds.base import KindHost, SuiteKind, VerifyHost
from harness.run.ledger import CellState

__all__ = ["CompletionKind"]


class CompletionKind(SuiteKind):
    """One request, one answer, one warm-verifier receipt."""

    name = "completion"

    async def attempt(self, host: KindHost, state: CellState, lane: int) -> dict[str, Any] | None:
        return await host.request_attempt(state, lane)

    def verify(self, host: VerifyHost, state: CellState) -> tuple[str, str, bool]:
        return host.verify(state)
