"""Money: strict cost parsing and exact sums.

The manual: docs/evidence.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from harness.errors import Code, InputRefusal

__all__ = ["RunningSum", "parse_cost", "sum_costs"]


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


class RunningSum:
    """`sum_costs` kept up to date in constant time per value: `value()` always equals `sum_costs(values)`
    of every value added so far, exactly (not approximately).

    It keeps Shewchuk's non-overlapping partials (the algorithm behind `math.fsum`): they add up
    to the exact sum of the values, so `math.fsum` over the few partials rounds that exact sum
    once, as `math.fsum` over every value does. A partial sum that leaves the finite floats (an
    overflow) falls back to `sum_costs` over the values themselves, which refuses as it always did.
    """

    __slots__ = ("_overflow", "_partials", "values")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.values: list[float] = []
        self._partials: list[float] = []
        self._overflow = False
        for x in values:
            self.add(x)

    def add(self, x: float) -> None:
        self.values.append(x)
        if self._overflow:
            return
        partials = self._partials
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]
        if not math.isfinite(x):
            self._overflow = True

    def value(self, *, path: str | os.PathLike[str] | None = None) -> float:
        if self._overflow:
            return sum_costs(self.values, path=path)
        return sum_costs(self._partials, path=path)
