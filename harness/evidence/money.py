"""Money: strict cost parsing and exact sums."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from harness.errors import Code, InputRefusal

__all__ = ["parse_cost", "sum_costs"]


def parse_cost(value: Any, *, field: str = "cost", path: str | os.PathLike[str] | None = None) -> float:
    """A cost: a finite, non-negative JSON number; never a bool, string or null."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputRefusal(Code.INVALID_COST, f"{field} must be a number, found {type(value).__name__}", path)
    try:
        number = float(value)
    except OverflowError:
        raise InputRefusal(Code.INVALID_COST, f"{field} is too large", path) from None
    if not math.isfinite(number):
        raise InputRefusal(Code.INVALID_COST, f"{field} must be finite", path)
    if number < 0:
        raise InputRefusal(Code.INVALID_COST, f"{field} must not be negative", path)
    return number + 0.0  # -0.0 becomes 0.0


def sum_costs(values: Iterable[float], *, path: str | os.PathLike[str] | None = None) -> float:
    """The exact (correctly rounded) sum of costs; an overflow to infinity is refused."""
    try:
        total = math.fsum(values)
    except (OverflowError, ValueError):  # ValueError: inf + -inf
        total = math.inf
    if not math.isfinite(total):
        raise InputRefusal(Code.COST_OVERFLOW, "the sum of costs overflows", path)
    return total
