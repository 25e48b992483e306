"""Items needed to show equivalence of two pass rates (TOST), from registered expectations.

The manual: docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Final

__all__ = [
    "MAX_ITEMS",
    "SampleSize",
    "correlation_bounds",
    "difference_variance",
    "items_needed",
    "minimum_detectable_margin",
    "tost_power",
]

MAX_ITEMS: Final = 2**62
"""Beyond this many items a margin is reported as not achievable."""

_NORMAL: Final = NormalDist()
_TOLERANCE: Final = 1e-12  # slack for rates and correlations rounded in decimal-to-binary conversion


def _z(p: float) -> float:
    return _NORMAL.inv_cdf(p)


def _check(alpha: float, power: float | None, p_a: float, p_b: float, correlation: float) -> None:
    for name, value in (("p_a", p_a), ("p_b", p_b)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name} must be a rate in [0, 1], got {value!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if power is not None and not 0.0 < power < 1.0:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    if not -1.0 <= correlation <= 1.0:
        raise ValueError(f"correlation must be in [-1, 1], got {correlation!r}")


def correlation_bounds(p_a: float, p_b: float) -> tuple[float, float] | None:
    """The correlations two Bernoulli outcomes with rates `p_a`, `p_b` can have (Frechet bounds).

    Returns None when a rate is 0 or 1: the outcome is then constant and its
    correlation undefined (and irrelevant to the variance).
    """
    var_a, var_b = p_a * (1 - p_a), p_b * (1 - p_b)
    if var_a <= 0 or var_b <= 0:
        return None
    scale = math.sqrt(var_a * var_b)
    both_low, both_high = max(0.0, p_a + p_b - 1.0), min(p_a, p_b)  # P(both pass) ranges over this
    return ((both_low - p_a * p_b) / scale, (both_high - p_a * p_b) / scale)


def difference_variance(p_a: float, p_b: float, correlation: float = 0.0, *, paired: bool = True) -> float:
    """sigma_d^2: the variance of one item's difference (paired) or the sum of the two variances."""
    var_a, var_b = p_a * (1 - p_a), p_b * (1 - p_b)
    rho = correlation if paired else 0.0
    return max(0.0, var_a + var_b - 2.0 * rho * math.sqrt(var_a * var_b))


def _infeasible(p_a: float, p_b: float, correlation: float, paired: bool) -> str | None:
    if not paired:
        return None
    bounds = correlation_bounds(p_a, p_b)
    if bounds is None or bounds[0] - _TOLERANCE <= correlation <= bounds[1] + _TOLERANCE:
        return None
    return (
        f"not achievable: a correlation of {correlation} is impossible for pass rates {p_a} and {p_b} "
        f"(two pass/fail outcomes with these rates can only correlate within [{bounds[0]:.4f}, {bounds[1]:.4f}])"
    )


def _power_at(n: int, margin: float, alpha: float, delta: float, sd: float) -> float:
    if n < 1:
        return 0.0
    if sd == 0.0:  # the difference is certain: shown exactly when it lies strictly inside the margin
        return 1.0 if abs(delta) < margin else 0.0
    se = sd / math.sqrt(n)
    z = _z(1.0 - alpha)
    value = _NORMAL.cdf((margin - delta) / se - z) + _NORMAL.cdf((margin + delta) / se - z) - 1.0
    return min(1.0, max(0.0, value))


def tost_power(
    n: int, *, margin: float, alpha: float, p_a: float, p_b: float, correlation: float = 0.0, paired: bool = True
) -> float:
    """The power of TOST with `n` items (paired) or `n` items per system (independent).

    Args:
        n: items (paired) or items per system (independent); below 1 the power is 0.
        margin: the equivalence margin on the difference of pass rates, > 0.
        alpha: the level of each one-sided test.
        p_a: the expected pass rate of system a.
        p_b: the expected pass rate of system b.
        correlation: of the two systems' per-item outcomes (paired only).
        paired: the paired design (else two independent samples).
    """
    _check(alpha, None, p_a, p_b, correlation)
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    sd = math.sqrt(difference_variance(p_a, p_b, correlation, paired=paired))
    return _power_at(n, margin, alpha, p_a - p_b, sd)


@dataclass(frozen=True)
class SampleSize:
    """The items a comparison needs.

    Attributes:
        n: the smallest n with power(n) >= the target: items (paired) or items
            per system (independent); None when not achievable.
        n_closed_form: Chow, Shao & Wang's closed form (None when not achievable).
        reason: why it is not achievable (None otherwise).
        paired: the paired design (else independent samples).
        delta: the expected difference p_a - p_b.
        sd: the standard deviation of one item's difference (sigma_d).
        margin: the equivalence margin.
        alpha: the level of each one-sided test.
        power: the target power.
        power_at_n: the power at n (None when not achievable).
    """

    n: int | None
    n_closed_form: int | None
    reason: str | None
    paired: bool
    delta: float
    sd: float
    margin: float
    alpha: float
    power: float
    power_at_n: float | None

    @property
    def achievable(self) -> bool:
        return self.n is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "n_closed_form": self.n_closed_form,
            "achievable": self.achievable,
            "reason": self.reason,
            "design": "paired" if self.paired else "independent",
            "delta": self.delta,
            "sd": self.sd,
            "margin": self.margin,
            "alpha": self.alpha,
            "power": self.power,
            "power_at_n": self.power_at_n,
        }


def _smallest(reaches: Callable[[int], bool], start: int) -> int | None:
    """The smallest n >= 1 with reaches(n), for a monotone `reaches`, searching from `start`."""
    start = min(max(1, start), MAX_ITEMS)
    if reaches(start):
        hi, step = start, 1
        lo = start - 1
        while lo >= 1 and reaches(lo):  # gallop down: the closed form overshoots rarely and by little
            hi = lo
            step *= 2
            lo = max(0, hi - step)
        # not reaches(lo) (or lo == 0), reaches(hi)
    else:
        lo = start
        while True:
            if lo >= MAX_ITEMS:
                return None
            hi = min(lo * 2, MAX_ITEMS)
            if reaches(hi):
                break
            lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    return hi


def items_needed(
    *, margin: float, alpha: float, power: float, p_a: float, p_b: float,
    correlation: float = 0.0, paired: bool = True,
) -> SampleSize:
    """The items needed to show equivalence within `margin` at level `alpha` with the target `power`.

    Args:
        margin: the equivalence margin on the difference of pass rates, > 0.
        alpha: the level of each one-sided test.
        power: the target power (1 - beta).
        p_a: the expected pass rate of system a.
        p_b: the expected pass rate of system b.
        correlation: of the two systems' per-item outcomes (paired only).
        paired: the paired design (else two independent samples; n per system).
    """
    _check(alpha, power, p_a, p_b, correlation)
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    delta = p_a - p_b
    sd = math.sqrt(difference_variance(p_a, p_b, correlation, paired=paired))

    def result(n: int | None, closed: int | None, reason: str | None) -> SampleSize:
        at = None if n is None else _power_at(n, margin, alpha, delta, sd)
        return SampleSize(n, closed, reason, paired, delta, sd, margin, alpha, power, at)

    reason = _infeasible(p_a, p_b, correlation, paired)
    if reason is not None:
        return result(None, None, reason)
    if abs(delta) >= margin - _TOLERANCE:  # .6 - .7 is 0.0999...98 in floats, yet exactly the margin .1
        return result(None, None, (
            f"not achievable: the expected difference |{p_a} - {p_b}| = {abs(delta):.6g} is not inside "
            f"the margin {margin}, so equivalence cannot be shown with any number of items"
        ))
    beta = 1.0 - power
    z_beta = _z(1.0 - beta / 2.0) if delta == 0 else _z(1.0 - beta)
    exact = (_z(1.0 - alpha) + z_beta) ** 2 * sd**2 / (margin - abs(delta)) ** 2
    closed = max(1, math.ceil(exact)) if exact < MAX_ITEMS else MAX_ITEMS
    n = _smallest(lambda k: _power_at(k, margin, alpha, delta, sd) >= power, closed)
    if n is None:
        return result(None, closed, f"not achievable within {MAX_ITEMS} items")
    return result(n, closed, None)


def minimum_detectable_margin(
    n: int, *, alpha: float, power: float, p_a: float, p_b: float,
    correlation: float = 0.0, paired: bool = True,
) -> float | None:
    """The smallest margin at which `n` items reach the target power (None for an impossible correlation).

    Found by bisection (power grows with the margin); the value returned
    always has `tost_power(n, margin=value, ...) >= power`. With a certain
    difference (sd 0) it is the next float above |delta|.
    """
    _check(alpha, power, p_a, p_b, correlation)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if _infeasible(p_a, p_b, correlation, paired) is not None:
        return None
    delta = p_a - p_b
    sd = math.sqrt(difference_variance(p_a, p_b, correlation, paired=paired))
    low = abs(delta)
    if sd == 0.0:
        return math.nextafter(low, math.inf)
    se = sd / math.sqrt(n)
    # At margin |delta| + (z_{1-alpha} + z_{1-beta/2}) SE each tail is >= 1 - beta/2, so power >= 1 - beta.
    high = low + (_z(1.0 - alpha) + _z(1.0 - (1.0 - power) / 2.0)) * se
    while _power_at(n, high, alpha, delta, sd) < power:  # rounding only
        high += se * 1e-9 + abs(high) * 1e-15
    for _ in range(200):
        mid = (low + high) / 2.0
        if mid <= low or mid >= high:
            break
        if _power_at(n, mid, alpha, delta, sd) >= power:
            high = mid
        else:
            low = mid
    return high
