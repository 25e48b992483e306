"""Paired and independent comparisons of two pass rates, with TOST equivalence.

The manual: docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from scipy import stats

__all__ = [
    "IndependentTostResult",
    "PairedResult",
    "cluster_robust_se",
    "independent_tost",
    "mcnemar_exact",
    "paired_comparison",
    "paired_from_counts",
    "tango_restricted_p01",
]

Method = Literal["tango", "wald"]
Verdict = Literal["equivalent", "not equivalent"]


def _phi(x: float) -> float:
    """Standard normal CDF, exact at +-inf."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _p_larger(diff_stat: float, se: float) -> float:
    """One-sided p-value for ``H1: stat > 0`` given ``z = diff_stat / se``."""
    if se > 0.0:
        return _phi(-diff_stat / se)
    return 0.0 if diff_stat > 0.0 else 1.0


def _p_smaller(diff_stat: float, se: float) -> float:
    """One-sided p-value for ``H1: stat < 0`` given ``z = diff_stat / se``."""
    if se > 0.0:
        return _phi(diff_stat / se)
    return 0.0 if diff_stat < 0.0 else 1.0


def _check_margin_alpha(margin: float, alpha: float) -> None:
    if not (isinstance(margin, float | int) and 0.0 < margin < 1.0):
        raise ValueError(f"margin must be in (0, 1), got {margin!r}")
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 0.5):
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def mcnemar_exact(b10: int, b01: int) -> float:
    """McNemar's exact two-sided p-value: binomial test of ``b10`` vs ``b01`` at 1/2."""
    _check_count("b10", b10)
    _check_count("b01", b01)
    k = b10 + b01
    if k == 0:
        return 1.0
    return min(1.0, 2.0 * float(stats.binom.cdf(min(b10, b01), k, 0.5)))


def tango_restricted_p01(b10: int, b01: int, n: int, delta: float) -> float:
    """Restricted MLE of ``p01`` under ``p10 - p01 = delta`` (Tango 1998)."""
    a = 2.0 * n
    b = -(b10 + b01) + (2.0 * n - b10 + b01) * delta
    c = -b01 * delta * (1.0 - delta)
    disc = max(0.0, b * b - 4.0 * a * c)
    return (-b + math.sqrt(disc)) / (2.0 * a)


def _tango_var(b10: int, b01: int, n: int, delta: float) -> float:
    """Variance of ``d`` under ``H0: d = delta`` from the restricted MLE."""
    p01 = tango_restricted_p01(b10, b01, n, delta)
    return max(0.0, (2.0 * p01 + delta - delta * delta) / n)


@dataclass(frozen=True)
class PairedResult:
    """A paired comparison of A against B on the same items (``d = p_a - p_b``)."""

    n: int
    n_items: int
    n11: int
    b10: int
    b01: int
    n00: int
    p_a: float
    p_b: float
    diff: float
    se: float
    se_method: Literal["paired", "cluster"]
    design_effect: float
    alpha: float
    margin: float
    ci_low: float
    ci_high: float
    wald_p_lower: float
    wald_p_upper: float
    wald_p: float
    tango_p_lower: float
    tango_p_upper: float
    tango_p: float
    mcnemar_p: float
    method: Method
    verdict: Verdict


def paired_from_counts(
    n11: int,
    b10: int,
    b01: int,
    n00: int,
    *,
    margin: float,
    alpha: float = 0.05,
    method: Method = "tango",
    cluster_se: float | None = None,
    n_items: int | None = None,
) -> PairedResult:
    """The paired comparison from the 2x2 table (see the module docstring).

    ``cluster_se`` (from :func:`paired_comparison` when items repeat) replaces
    the paired Wald SE and inflates the Tango variance by the design effect.
    """
    for name, value in (("n11", n11), ("b10", b10), ("b01", b01), ("n00", n00)):
        _check_count(name, value)
    _check_margin_alpha(margin, alpha)
    if method not in ("tango", "wald"):
        raise ValueError(f"method must be 'tango' or 'wald', got {method!r}")
    n = n11 + b10 + b01 + n00
    if n <= 0:
        raise ValueError("no pairs")
    d = (b10 - b01) / n
    se_paired = math.sqrt(max(0.0, ((b10 + b01) / n - d * d) / n))
    se_method: Literal["paired", "cluster"]
    if cluster_se is None:
        se, se_method, deff = se_paired, "paired", 1.0
    else:
        if not (cluster_se >= 0.0 and math.isfinite(cluster_se)):
            raise ValueError(f"cluster_se must be finite and >= 0, got {cluster_se!r}")
        se, se_method = cluster_se, "cluster"
        deff = (cluster_se / se_paired) ** 2 if se_paired > 0.0 else 1.0

    z = NormalDist().inv_cdf(1.0 - alpha)
    wald_lo = _p_larger(d + margin, se)
    wald_hi = _p_smaller(d - margin, se)
    tango_lo = _p_larger(d + margin, math.sqrt(deff * _tango_var(b10, b01, n, -margin)))
    tango_hi = _p_smaller(d - margin, math.sqrt(deff * _tango_var(b10, b01, n, margin)))
    wald_p, tango_p = max(wald_lo, wald_hi), max(tango_lo, tango_hi)
    chosen = tango_p if method == "tango" else wald_p
    return PairedResult(
        n=n,
        n_items=n if n_items is None else n_items,
        n11=n11,
        b10=b10,
        b01=b01,
        n00=n00,
        p_a=(n11 + b10) / n,
        p_b=(n11 + b01) / n,
        diff=d,
        se=se,
        se_method=se_method,
        design_effect=deff,
        alpha=float(alpha),
        margin=float(margin),
        ci_low=d - z * se,
        ci_high=d + z * se,
        wald_p_lower=wald_lo,
        wald_p_upper=wald_hi,
        wald_p=wald_p,
        tango_p_lower=tango_lo,
        tango_p_upper=tango_hi,
        tango_p=tango_p,
        mcnemar_p=mcnemar_exact(b10, b01),
        method=method,
        verdict="equivalent" if chosen < alpha else "not equivalent",
    )


def _outcome(name: str, i: int, value: bool | int) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value in (0, 1):
        return value
    raise ValueError(f"{name}[{i}] must be a bool or 0/1, got {value!r}")


def _cluster_se(xa: Sequence[int], xb: Sequence[int], items: Sequence[str]) -> float:
    sums: dict[str, tuple[int, int]] = {}
    for item, x, y in zip(items, xa, xb, strict=True):
        s, k = sums.get(item, (0, 0))
        sums[item] = (s + x - y, k + 1)
    n = len(xa)
    d = sum(s for s, _ in sums.values()) / n
    return math.sqrt(sum((s - k * d) ** 2 for s, k in sums.values())) / n


def cluster_robust_se(
    a: Sequence[bool | int], b: Sequence[bool | int], items: Sequence[str]
) -> float:
    """CR0 standard error of ``d = mean(a - b)`` clustered by item (Liang and Zeger 1986).

    ``se^2 = sum_j (S_j - n_j d)^2 / n^2``; with one pair per item it equals the
    paired Wald SE ``sqrt(((b10 + b01)/n - d^2)/n)``.
    """
    if not len(a) == len(b) == len(items) or len(a) == 0:
        raise ValueError("a, b and items must be non-empty and of equal length")
    xa = [_outcome("a", i, v) for i, v in enumerate(a)]
    xb = [_outcome("b", i, v) for i, v in enumerate(b)]
    return _cluster_se(xa, xb, items)


def paired_comparison(
    a: Sequence[bool | int],
    b: Sequence[bool | int],
    *,
    items: Sequence[str] | None = None,
    margin: float,
    alpha: float = 0.05,
    method: Method = "tango",
) -> PairedResult:
    """Compare A with B on the same pairs (``a[i]``, ``b[i]``), clustered by ``items``."""
    if len(a) != len(b):
        raise ValueError(f"a and b differ in length ({len(a)} != {len(b)})")
    if len(a) == 0:
        raise ValueError("no pairs")
    if items is not None and len(items) != len(a):
        raise ValueError(f"items has length {len(items)}, expected {len(a)}")
    xa = [_outcome("a", i, v) for i, v in enumerate(a)]
    xb = [_outcome("b", i, v) for i, v in enumerate(b)]
    n = len(xa)
    n11 = sum(1 for x, y in zip(xa, xb, strict=True) if x and y)
    b10 = sum(1 for x, y in zip(xa, xb, strict=True) if x and not y)
    b01 = sum(1 for x, y in zip(xa, xb, strict=True) if y and not x)
    n00 = n - n11 - b10 - b01

    cluster_se: float | None = None
    n_items = n
    if items is not None:
        n_items = len(set(items))
        if n_items < n:
            cluster_se = _cluster_se(xa, xb, items)
    return paired_from_counts(
        n11,
        b10,
        b01,
        n00,
        margin=margin,
        alpha=alpha,
        method=method,
        cluster_se=cluster_se,
        n_items=n_items,
    )


@dataclass(frozen=True)
class IndependentTostResult:
    """Wald TOST for ``d = p_a - p_b`` from independent samples."""

    pass_a: int
    n_a: int
    pass_b: int
    n_b: int
    diff: float
    se: float
    alpha: float
    margin: float
    ci_low: float
    ci_high: float
    p_lower: float
    p_upper: float
    p: float
    verdict: Verdict


def independent_tost(
    pass_a: int, n_a: int, pass_b: int, n_b: int, margin: float, alpha: float = 0.05
) -> IndependentTostResult:
    """Wald TOST for two independent proportions (Schuirmann 1987).

    ``se^2 = p_a(1-p_a)/n_a + p_b(1-p_b)/n_b``; ``p_lower = 1 - Phi((d + m)/se)``,
    ``p_upper = Phi((d - m)/se)``. Matches statsmodels
    ``tost_proportions_2indep(pass_a, n_a, pass_b, n_b, -m, m, method='wald')``.
    """
    for name, count, total in (("pass_a", pass_a, n_a), ("pass_b", pass_b, n_b)):
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ValueError(f"sample size for {name} must be a positive integer, got {total!r}")
        _check_count(name, count)
        if count > total:
            raise ValueError(f"{name}={count} exceeds its sample size {total}")
    _check_margin_alpha(margin, alpha)
    pa, pb = pass_a / n_a, pass_b / n_b
    d = pa - pb
    se = math.sqrt(pa * (1.0 - pa) / n_a + pb * (1.0 - pb) / n_b)
    lo = _p_larger(d + margin, se)
    hi = _p_smaller(d - margin, se)
    z = NormalDist().inv_cdf(1.0 - alpha)
    p = max(lo, hi)
    return IndependentTostResult(
        pass_a=pass_a,
        n_a=n_a,
        pass_b=pass_b,
        n_b=n_b,
        diff=d,
        se=se,
        alpha=float(alpha),
        margin=float(margin),
        ci_low=d - z * se,
        ci_high=d + z * se,
        p_lower=lo,
        p_upper=hi,
        p=p,
        verdict="equivalent" if p < alpha else "not equivalent",
    )
