"""Cost: token usage x price, exactly, with unknown kept unknown (never $0).

A request is priced whole at one tier: the highest tier whose
`above_prompt_tokens` its prompt (`TokenUsage.prompt_tokens`: fresh + cached +
cache-write tokens) exceeds, or the base prices when none does. Each category
costs `tokens * price / 1e6`; the total is the correctly rounded sum of the
parts (`sum_costs`, i.e. `math.fsum`). Reasoning tokens are billed at the
output price of the tier in force unless the model lists its own reasoning
price. Unknown usage, an unknown model price, or tokens in a category the
model has no price for all give `total=None` with the reason in `status`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code, InputRefusal
from harness.evidence.money import sum_costs
from harness.meter.pricing import Price
from harness.records.attempt import COST_STATUSES as _COST_STATUSES
from harness.records.usage import CATEGORIES, TokenUsage

__all__ = ["COST_STATUSES", "Cost", "meter", "total_cost"]

COST_STATUSES: Final = _COST_STATUSES  # declared with the attempt record (harness.records.attempt)


@dataclass(frozen=True)
class Cost:
    """What one or more requests cost.

    Attributes:
        total: dollars, or None when unknown (never 0 for unknown).
        parts: dollars by token category (of the known requests, for a sum).
        status: "metered", or why `total` is unknown: "usage_unknown" wins
            over "price_unknown" when a sum has both.
        tier: the tier threshold a single request was priced at (None: base prices, or a sum).
        known_total: the sum over the requests whose cost is known.
        requests: how many requests this covers.
        usage_unknown: how many of them had unknown usage.
        price_unknown: how many of them had no price.
        reason: why the cost is unknown, for a person (single requests).
    """

    total: float | None
    parts: Mapping[str, float] = field(default_factory=dict)
    status: str = "metered"
    tier: int | None = None
    known_total: float = 0.0
    requests: int = 1
    usage_unknown: int = 0
    price_unknown: int = 0
    reason: str | None = None

    @property
    def unknown(self) -> int:
        """How many requests have an unknown cost."""
        return self.usage_unknown + self.price_unknown

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "unknown": self.total is None,
            "status": self.status,
            "parts": dict(self.parts),
            "tier": self.tier,
            "known_total": self.known_total,
            "requests": self.requests,
            "usage_unknown": self.usage_unknown,
            "price_unknown": self.price_unknown,
            "reason": self.reason,
        }


def _part(tokens: int, per_mtok: float) -> float:
    try:
        return tokens * per_mtok / 1_000_000
    except OverflowError:
        raise InputRefusal(Code.COST_OVERFLOW, f"{tokens} tokens at {per_mtok} $/Mtok overflows") from None


def _rates(usage: TokenUsage, price: Price) -> tuple[dict[str, float | None], int | None]:
    """$/Mtok by category for this request, and the tier threshold used."""
    tier = None
    for candidate in price.tiers:
        if usage.prompt_tokens > candidate.above_prompt_tokens:
            tier = candidate
    base = tier if tier is not None else price
    rates: dict[str, float | None] = {
        "input": base.input_per_mtok,
        "cached_input": base.cached_input_per_mtok,
        "cache_write": base.cache_write_per_mtok,
        "output": base.output_per_mtok,
        "reasoning": base.output_per_mtok if price.reasoning_per_mtok is None else price.reasoning_per_mtok,
    }
    return rates, None if tier is None else tier.above_prompt_tokens


def meter(usage: TokenUsage | None, price: Price | None) -> Cost:
    """The cost of one request with `usage` at `price`; unknown (None) stays unknown."""
    if usage is None:
        return Cost(None, status="usage_unknown", usage_unknown=1, reason="the response carried no usable usage")
    if price is None:
        return Cost(None, status="price_unknown", price_unknown=1, reason="no price for this model")
    rates, tier = _rates(usage, price)
    parts: dict[str, float] = {}
    for category in CATEGORIES:
        tokens = getattr(usage, category)
        rate = rates[category]
        if rate is None:
            if tokens:
                return Cost(
                    None, status="price_unknown", tier=tier, price_unknown=1,
                    reason=f"{tokens} {category} tokens but {price.key!r} lists no {category} price",
                )
            parts[category] = 0.0
            continue
        parts[category] = _part(tokens, rate)
    total = sum_costs(parts.values())
    return Cost(total, parts, "metered", tier, known_total=total)


def total_cost(costs: Iterable[Cost]) -> Cost:
    """The sum of many costs: unknown if any is unknown, with the known partial sum and the counts."""
    items = list(costs)
    parts = {category: sum_costs(c.parts.get(category, 0.0) for c in items) for category in CATEGORIES}
    known_total = sum_costs(c.known_total for c in items)
    usage_unknown = sum(c.usage_unknown for c in items)
    price_unknown = sum(c.price_unknown for c in items)
    requests = sum(c.requests for c in items)
    if usage_unknown:
        status = "usage_unknown"
    elif price_unknown:
        status = "price_unknown"
    else:
        status = "metered"
    total = known_total if status == "metered" else None
    return Cost(
        total, parts, status, None, known_total, requests, usage_unknown, price_unknown,
        None if status == "metered" else f"{usage_unknown + price_unknown} of {requests} requests have an unknown cost",
    )
