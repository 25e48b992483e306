"""An attempt's allowance inside the metering proxy: what it may still spend, and each request's worst case.

The manual: docs/models.md, "Budgets inside an attempt".
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code, MeterRefusal
from harness.evidence.money import sum_costs
from harness.meter.cost import meter
from harness.meter.pricing import PricingTable
from harness.meter.wire import BUDGET_STOP
from harness.providers.registry import max_output_tokens
from harness.records.usage import TokenUsage

__all__ = ["BUDGET_STOP", "BUDGET_STOP_STATUS", "Allowance", "AllowanceLedger", "budget_stop_body", "worst_case"]

BUDGET_STOP_STATUS: Final = 402


@dataclass(frozen=True)
class Allowance:
    """What one attempt may still spend through its proxy, and the prices it meters with.

    Attributes:
        limit_usd: the amount (the least of what the system cap and the ceiling leave).
        pricing: the price table every exchange is metered with.
        reserve_usd: a request's worst case when it declares no output cap or its model has no price.
        keys: a request's model to its pricing key (default: the model itself).
    """

    limit_usd: float
    pricing: PricingTable
    reserve_usd: float
    keys: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("limit_usd", "reserve_usd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise MeterRefusal(Code.ALLOWANCE_INVALID, f"{name} must be a finite amount >= 0, not {value!r}")
        if self.reserve_usd == 0:
            raise MeterRefusal(Code.ALLOWANCE_INVALID, "reserve_usd must be above 0: a request with no output cap "
                                                       "would otherwise count as free")  # fmt: skip
        if not isinstance(self.pricing, PricingTable):
            raise MeterRefusal(Code.ALLOWANCE_INVALID, "pricing must be a PricingTable")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.keys.items()):
            raise MeterRefusal(Code.ALLOWANCE_INVALID, "keys must map model names to pricing keys")

    def to_json(self) -> dict[str, Any]:
        return {"limit_usd": self.limit_usd, "reserve_usd": self.reserve_usd, "pricing_sha256": self.pricing.sha256,
                "keys": dict(sorted(self.keys.items()))}  # fmt: skip


def worst_case(allowance: Allowance, api_shape: str, model: str | None, body: bytes) -> tuple[float, str]:
    """The most one request can cost, and how it was bounded ("max_tokens" or "reserve").

    With an output cap in the body and a price for its model: the body's bytes
    as prompt tokens (a token is at least one byte) and the cap as output, each
    at the dearest rate that could apply; otherwise the reserve.
    """
    cap = max_output_tokens(api_shape, body)
    key = None if model is None else allowance.keys.get(model, model)
    price = allowance.pricing.get(key)
    if cap is None or price is None:
        return float(allowance.reserve_usd), "reserve"
    prompt = len(body)
    totals = [
        cost.total
        for usage in (
            TokenUsage(input=prompt, output=cap), TokenUsage(input=prompt, reasoning=cap),
            TokenUsage(cache_write=prompt, output=cap), TokenUsage(cache_write=prompt, reasoning=cap),
        )
        if (cost := meter(usage, price)).total is not None
    ]
    return (max(totals), "max_tokens") if totals else (float(allowance.reserve_usd), "reserve")


def budget_stop_body(worst_usd: float, remaining_usd: float) -> bytes:
    """The proxy's own answer to a stopped request: an OpenAI-shaped error naming `budget_stop`."""
    message = (f"budget stop: this request may cost up to ${worst_usd:.6g}; the attempt has ${remaining_usd:.6g} "
               "left of its allowance (not sent upstream)")  # fmt: skip
    doc = {"error": {"message": message, "type": "proxy_error", "code": BUDGET_STOP,
                     "worst_usd": worst_usd, "remaining_usd": remaining_usd}}  # fmt: skip
    return json.dumps(doc, sort_keys=True).encode("utf-8")


class AllowanceLedger:
    """The proxy's running account against an allowance: settled costs and the holds of requests in flight.

    A request is admitted when the settled costs, every hold and its own worst
    case still fit in the limit (an exact sum); it then holds its worst case
    until it is settled at its metered cost (its worst case when the cost is
    unknown or could not be recorded). Thread-safe.
    """

    def __init__(self, allowance: Allowance) -> None:
        self.allowance = allowance
        self._lock = threading.Lock()
        self._settled: list[float] = []
        self._held: dict[int, float] = {}
        self._next = 0
        self.stops = 0
        self.over_worst = 0
        """Settled requests that cost more than the worst case they were admitted on (a reserve set too low)."""

    def admit(self, worst_usd: float) -> tuple[int | None, float]:
        """A hold ticket (None: stopped) and what was left before this request."""
        with self._lock:
            committed = sum_costs([*self._settled, *self._held.values()])
            remaining = max(0.0, self.allowance.limit_usd - committed)
            if sum_costs([*self._settled, *self._held.values(), worst_usd]) > self.allowance.limit_usd:
                self.stops += 1
                return None, remaining
            self._next += 1
            self._held[self._next] = worst_usd
            return self._next, remaining

    def settle(self, ticket: int, cost_usd: float | None) -> None:
        """Release the hold `ticket`, counting `cost_usd` (None: its worst case)."""
        with self._lock:
            held = self._held.pop(ticket)
            if cost_usd is not None and cost_usd > held:
                self.over_worst += 1
            self._settled.append(held if cost_usd is None else cost_usd)

    def spent(self) -> float:
        """The settled costs so far (worst cases for the unknown ones)."""
        with self._lock:
            return sum_costs(self._settled)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            spent = sum_costs(self._settled)
            return {**self.allowance.to_json(), "spent_usd": spent, "settled": len(self._settled),
                    "in_flight": len(self._held), "budget_stops": self.stops, "over_worst": self.over_worst}
