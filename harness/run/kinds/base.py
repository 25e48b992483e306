"""What a suite kind is (`SuiteKind`) and what it may ask of the runner's engine (`KindHost`).

The manual: docs/run.md ("Suite kinds").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from harness.evidence.clock import Clock
from harness.prereg.design import RunRules
from harness.records.plan import PlanCell
from harness.run.ledger import CellState
from harness.run.setup import StageSetup

if TYPE_CHECKING:
    from harness.evals.verify_pool import VerifierPool
    from harness.run.rules import Room

__all__ = ["KindHost", "RemoteWork", "SuiteKind", "VerifyHost"]


class VerifyHost(Protocol):
    """The engine as a kind's `verify` sees it (`harness.run.finals.Finals`)."""

    s: StageSetup
    suite_dir: str
    clock: Clock

    def private(self) -> Any: ...

    def verify(self, state: CellState) -> tuple[str, str, bool]: ...


class RemoteWork(Protocol):
    """The ray engine as a kind sees it (`harness.run.remote.RayEngine`): work sent to a node."""

    sandbox: str

    async def arun(self, key: tuple[str, int, int], fn: Callable[..., Any], *args: Any,
                   limit_s: float | None = None) -> tuple[Any, str, bool]: ...

    def close_attempt(self, key: tuple[str, int, int]) -> bool: ...


class KindHost(VerifyHost, Protocol):
    """The engine as a kind's `attempt` sees it (`harness.run.lanes.Lanes`)."""

    rules: RunRules
    @property
    def remote(self) -> RemoteWork | None:
        """The ray engine, or None: the attempt's work runs in this process."""
        ...

    async def request_attempt(self, state: CellState, lane: int) -> dict[str, Any] | None: ...

    async def begin_attempt(self, r: PlanCell, rerun: int, number: int, lane: int) -> tuple[float, float] | None: ...

    async def end_attempt(self, r: PlanCell, lane: int, record: dict[str, Any], *, node: str | None = None) -> None: ...

    def room_now(self, system: str) -> Room: ...

    def escalation_room(self, system: str, spent: float) -> Room: ...


class SuiteKind(ABC):
    """How one attempt of a cell is carried out (`attempt`) and how a delivered one is scored (`verify`)."""

    name: ClassVar[str]
    uses_verifier_pool: ClassVar[bool] = False
    """Whether `verify` checks on the run's warm verifiers (the runner then launches them ahead)."""

    def __init__(self, suite_dir: str) -> None:
        self.suite_dir = suite_dir

    @abstractmethod
    async def attempt(self, host: KindHost, state: CellState, lane: int) -> dict[str, Any] | None:
        """Admit, carry out and record the cell's next attempt; its record, or None when none may start."""
        ...

    @abstractmethod
    def preflight(self, verifiers: VerifierPool | None = None) -> list[tuple[str, str]]:
        """What would keep this kind from judging, as (check, message) pairs (`harness.run.preflight`);
        a kind that checks on warm verifiers judges its trial check on one of `verifiers` when given."""
        ...

    @abstractmethod
    def verify(self, host: VerifyHost, state: CellState) -> tuple[str, str, bool]:
        """Judge the current run's delivered attempt and write its receipt: (name, sha256, passed).

        Raises `harness.evals.verify_humaneval.VerifierUnavailable` (or OSError) when it cannot judge.
        """
        ...
