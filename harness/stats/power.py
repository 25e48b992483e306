"""Items needed to show equivalence of two pass rates (TOST), from registered expectations.

The manual: docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from scipy import special, stats

from harness.stats.paired import mn_z, tango_z

__all__ = [
    "EXACT_MAX_ITEMS",
    "EXACT_TAIL",
    "MAX_ITEMS",
    "ExactRejection",
    "SampleSize",
    "cell_probabilities",
    "correlation_bounds",
    "difference_variance",
    "exact_tost_power",
    "independent_rejection",
    "items_needed",
    "minimum_detectable_margin",
    "paired_rejection",
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


def _check_margin(margin: float) -> None:
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")


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
    """The normal-approximation power of TOST with `n` items (paired) or `n` items per system (independent).

    The approximation (a normal estimate with known SE, both tails) is 1-2.5 points optimistic
    for the registered score tests at the usual sizes; `exact_tost_power` enumerates them.

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
    _check_margin(margin)
    sd = math.sqrt(difference_variance(p_a, p_b, correlation, paired=paired))
    return _power_at(n, margin, alpha, p_a - p_b, sd)


@dataclass(frozen=True)
class SampleSize:
    """The items a comparison needs (docs/statistics.md).

    Attributes:
        n: the items (paired) or items per system (independent) chosen from the exact power of the
            registered test (`method` "exact"), or from the normal approximation (`method` "normal")
            beyond `EXACT_MAX_ITEMS`; None when not achievable.
        n_closed_form: Chow, Shao & Wang's closed form (None when not achievable).
        reason: why it is not achievable (None otherwise).
        paired: the paired design (else independent samples).
        delta: the expected difference p_a - p_b.
        sd: the standard deviation of one item's difference (sigma_d).
        margin: the equivalence margin.
        alpha: the level of each one-sided test.
        power: the target power.
        power_at_n: the power at n, exact when `method` is "exact" (None when not achievable).
        n_normal: the smallest n whose normal-approximation power reaches the target.
        power_at_n_normal: the normal-approximation power at n.
        method: "exact" or "normal" (how n was chosen).
        test: the registered test whose power is enumerated ("tango" paired, "miettinen-nurminen").
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
    n_normal: int | None = None
    power_at_n_normal: float | None = None
    method: str = "exact"
    test: str = "tango"

    @property
    def achievable(self) -> bool:
        return self.n is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "n_closed_form": self.n_closed_form,
            "n_normal": self.n_normal,
            "achievable": self.achievable,
            "reason": self.reason,
            "design": "paired" if self.paired else "independent",
            "test": self.test,
            "method": self.method,
            "delta": self.delta,
            "sd": self.sd,
            "margin": self.margin,
            "alpha": self.alpha,
            "power": self.power,
            "power_at_n": self.power_at_n,
            "power_at_n_normal": self.power_at_n_normal,
        }


# --------------------------------------------------------------------------
# Exact power and type I error, by enumeration


@dataclass(frozen=True)
class ExactRejection:
    """The exact probability that a TOST says "equivalent", by enumerating the outcomes.

    Attributes:
        probability: P(equivalent) over the enumerated outcomes.
        mass: the probability the enumeration covers (outcomes beyond binomial tails of
            `EXACT_TAIL` each are left out; 1 - mass is at most 4 * EXACT_TAIL).
        test: "tango" (paired) or "miettinen-nurminen" (independent).
    """

    probability: float
    mass: float
    test: str


EXACT_MAX_ITEMS: Final = 100_000
"""Above this many items `items_needed` uses the normal approximation (the enumeration grows as n)."""
EXACT_TAIL: Final = 1e-13


def _support(n: int, p: float) -> npt.NDArray[np.int64]:
    if p <= 0.0:
        return np.zeros(1, dtype=np.int64)
    if p >= 1.0:
        return np.full(1, n, dtype=np.int64)
    lo = max(0, int(stats.binom.ppf(EXACT_TAIL, n, p)) - 1)
    hi = min(n, int(stats.binom.isf(EXACT_TAIL, n, p)) + 1)
    return np.arange(lo, hi + 1, dtype=np.int64)


def cell_probabilities(p_a: float, p_b: float, correlation: float) -> tuple[float, float]:
    """``(p10, p01)``: P(a passes, b fails) and P(b passes, a fails) for rates p_a, p_b and their correlation."""
    both = p_a * p_b + correlation * math.sqrt(p_a * (1 - p_a) * p_b * (1 - p_b))
    return min(1.0, max(0.0, p_a - both)), min(1.0, max(0.0, p_b - both))


def paired_rejection(n: int, p10: float, p01: float, *, margin: float, alpha: float) -> ExactRejection:
    """P(Tango's TOST says "equivalent") for n pairs with discordant probabilities p10, p01 (the trinomial)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if not (0.0 <= p10 <= 1.0 and 0.0 <= p01 <= 1.0 and p10 + p01 <= 1.0 + _TOLERANCE):
        raise ValueError(f"p10 and p01 must be probabilities with p10 + p01 <= 1, got {p10!r}, {p01!r}")
    _check_margin(margin)
    b10 = _support(n, p10)[:, None]
    b01 = _support(n, p01)[None, :]
    rest = np.maximum(n - b10, 0)
    q = 0.0 if p10 >= 1.0 else min(1.0, p01 / (1.0 - p10))
    pmf = np.where(b10 + b01 <= n, stats.binom.pmf(b10, n, p10) * stats.binom.pmf(b01, rest, q), 0.0)
    p_lo = special.ndtr(-tango_z(b10, b01, n, -margin))
    p_hi = special.ndtr(tango_z(b10, b01, n, margin))
    reject = (p_lo < alpha) & (p_hi < alpha)
    return ExactRejection(float(np.sum(pmf[reject])), float(np.sum(pmf)), "tango")


def independent_rejection(n_a: int, n_b: int, p_a: float, p_b: float, *, margin: float,
                          alpha: float) -> ExactRejection:
    """P(the Miettinen-Nurminen TOST says "equivalent") for independent Binomial(n_a, p_a), Binomial(n_b, p_b)."""
    if n_a < 1 or n_b < 1:
        raise ValueError(f"sample sizes must be >= 1, got {n_a!r}, {n_b!r}")
    _check(alpha, None, p_a, p_b, 0.0)
    _check_margin(margin)
    xa = _support(n_a, p_a)[:, None]
    xb = _support(n_b, p_b)[None, :]
    pmf = stats.binom.pmf(xa, n_a, p_a) * stats.binom.pmf(xb, n_b, p_b)
    p_lo = special.ndtr(-mn_z(xa, n_a, xb, n_b, -margin))
    p_hi = special.ndtr(mn_z(xa, n_a, xb, n_b, margin))
    reject = (p_lo < alpha) & (p_hi < alpha)
    return ExactRejection(float(np.sum(pmf[reject])), float(np.sum(pmf)), "miettinen-nurminen")


def exact_tost_power(
    n: int, *, margin: float, alpha: float, p_a: float, p_b: float, correlation: float = 0.0, paired: bool = True
) -> float:
    """The exact power of the registered TOST (Tango paired, Miettinen-Nurminen independent) at n items.

    Enumerates the trinomial of discordant pairs (paired; one pair per item) or the two binomials
    (independent; n items per system). Below 1 item the power is 0; a correlation the rates
    cannot have is a ValueError.
    """
    _check(alpha, None, p_a, p_b, correlation)
    _check_margin(margin)
    reason = _infeasible(p_a, p_b, correlation, paired)
    if reason is not None:
        raise ValueError(reason)
    if n < 1:
        return 0.0
    if paired:
        p10, p01 = cell_probabilities(p_a, p_b, correlation)
        return paired_rejection(n, p10, p01, margin=margin, alpha=alpha).probability
    return independent_rejection(n, n, p_a, p_b, margin=margin, alpha=alpha).probability


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
    correlation: float = 0.0, paired: bool = True, exact: bool = True,
) -> SampleSize:
    """The items needed to show equivalence within `margin` at level `alpha` with the target `power`.

    `n` comes from the exact power of the registered test (`exact_tost_power`), found by a
    bisection that treats it as growing with n (it saw-tooths by a little: `power_at_n` always
    reaches the target); `n_normal` from the normal approximation; `n_closed_form` is Chow, Shao
    & Wang's. See docs/statistics.md.

    Args:
        margin: the equivalence margin on the difference of pass rates, > 0.
        alpha: the level of each one-sided test.
        power: the target power (1 - beta).
        p_a: the expected pass rate of system a.
        p_b: the expected pass rate of system b.
        correlation: of the two systems' per-item outcomes (paired only).
        paired: the paired design (else two independent samples; n per system).
        exact: choose n from the exact power (else from the normal approximation: n = n_normal).
    """
    _check(alpha, power, p_a, p_b, correlation)
    _check_margin(margin)
    delta = p_a - p_b
    sd = math.sqrt(difference_variance(p_a, p_b, correlation, paired=paired))
    test = "tango" if paired else "miettinen-nurminen"
    common: dict[str, Any] = {"margin": margin, "alpha": alpha, "p_a": p_a, "p_b": p_b,
                              "correlation": correlation, "paired": paired}

    def result(n: int | None, closed: int | None, reason: str | None, n_normal: int | None = None,
               method: str = "exact") -> SampleSize:
        at_normal = None if n is None else _power_at(n, margin, alpha, delta, sd)
        at = at_normal if n is None or method == "normal" else exact_tost_power(n, **common)
        return SampleSize(n, closed, reason, paired, delta, sd, margin, alpha, power, at, n_normal, at_normal,
                          method, test)

    reason = _infeasible(p_a, p_b, correlation, paired)
    if reason is not None:
        return result(None, None, reason)
    if abs(delta) >= margin - _TOLERANCE:  # .6 - .7 is 0.0999...98 in floats, yet exactly the margin .1
        return result(None, None, (
            f"not achievable: the expected difference |{p_a} - {p_b}| = {abs(delta):.6g} is not inside "
            f"the margin {margin}, so equivalence cannot be shown with any number of items"
        ))
    beta = 1.0 - power
    # Chow, Shao & Wang (2008) sections 3.1 and 4.2: z_{1-beta/2} for equivalence whatever delta
    raw = (_z(1.0 - alpha) + _z(1.0 - beta / 2.0)) ** 2 * sd**2 / (margin - abs(delta)) ** 2
    closed = max(1, math.ceil(raw)) if raw < MAX_ITEMS else MAX_ITEMS
    n_normal = _smallest(lambda k: _power_at(k, margin, alpha, delta, sd) >= power, closed)
    if n_normal is None:
        return result(None, closed, f"not achievable within {MAX_ITEMS} items")
    if exact and n_normal <= EXACT_MAX_ITEMS // 2:
        n = _smallest(lambda k: k > EXACT_MAX_ITEMS or exact_tost_power(k, **common) >= power, n_normal)
        if n is not None and n <= EXACT_MAX_ITEMS:
            return result(n, closed, None, n_normal)
    return result(n_normal, closed, None, n_normal, "normal")


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
