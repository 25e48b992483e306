"""Confidence intervals for a binomial proportion (a pass rate).

Both functions refuse ``n <= 0``, ``passes`` outside ``[0, n]`` and ``alpha``
outside ``(0, 1)`` with ``ValueError``; callers validate their own inputs.

The manual: docs/statistics.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from scipy import stats

__all__ = ["ProportionInterval", "clopper_pearson_interval", "wilson_interval"]


@dataclass(frozen=True)
class ProportionInterval:
    """A two-sided ``1 - alpha`` interval for ``passes / n``."""

    passes: int
    n: int
    alpha: float
    estimate: float
    low: float
    high: float
    method: str


def _check(passes: int, n: int, alpha: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(passes, bool) or not isinstance(passes, int) or not 0 <= passes <= n:
        raise ValueError(f"passes must be an integer in [0, {n}], got {passes!r}")
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def wilson_interval(passes: int, n: int, alpha: float = 0.05) -> ProportionInterval:
    """Wilson (1927) score interval.

    With ``p = passes/n`` and ``z = z_{1-alpha/2}``::

        centre = (p + z^2/(2n)) / (1 + z^2/n)
        half   = z * sqrt(p(1-p)/n + z^2/(4n^2)) / (1 + z^2/n)

    The bounds are exactly 0 when ``passes == 0`` and 1 when ``passes == n``.
    """
    _check(passes, n, alpha)
    p = passes / n
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    low = 0.0 if passes == 0 else max(0.0, centre - half)
    high = 1.0 if passes == n else min(1.0, centre + half)
    return ProportionInterval(passes, n, float(alpha), p, low, high, "wilson")


def clopper_pearson_interval(passes: int, n: int, alpha: float = 0.05) -> ProportionInterval:
    """Clopper and Pearson (1934) exact interval from beta quantiles.

    ``low = Beta(alpha/2; x, n-x+1)`` and ``high = Beta(1-alpha/2; x+1, n-x)``
    with ``x = passes``; ``low = 0`` when ``x == 0`` and ``high = 1`` when
    ``x == n`` (each end then has the full ``alpha/2``, the usual convention).
    """
    _check(passes, n, alpha)
    low = 0.0 if passes == 0 else float(stats.beta.ppf(alpha / 2.0, passes, n - passes + 1))
    high = 1.0 if passes == n else float(stats.beta.isf(alpha / 2.0, passes + 1, n - passes))
    return ProportionInterval(passes, n, float(alpha), passes / n, low, high, "clopper-pearson")
