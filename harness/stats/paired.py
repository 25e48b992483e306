"""Paired and independent comparisons of two pass rates, with TOST equivalence.

The manual: docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = [
    "IndependentTostResult",
    "PairedResult",
    "binomial_design_effect",
    "cluster_robust_se",
    "independent_tost",
    "mcnemar_exact",
    "mn_restricted",
    "mn_z",
    "paired_comparison",
    "paired_from_counts",
    "score_interval",
    "tango_restricted_p01",
    "tango_z",
]

Method = Literal["tango", "wald"]
Verdict = Literal["equivalent", "not equivalent"]


def _phi(x: float) -> float:
    """Standard normal CDF, exact at +-inf."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _p_larger(diff_stat: float, se: float) -> float:
    """One-sided p-value for ``H1: stat > 0`` given ``z = diff_stat / se``."""
    return _phi(-diff_stat / se) if se > 0.0 else 1.0  # no certainty from a zero standard error


def _p_smaller(diff_stat: float, se: float) -> float:
    """One-sided p-value for ``H1: stat < 0`` given ``z = diff_stat / se``."""
    return _phi(diff_stat / se) if se > 0.0 else 1.0


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


def tango_z(b10: Any, b01: Any, n: Any, delta: float, design_effect: Any = 1.0) -> Any:
    """Tango's score statistic ``(d - delta) / sqrt(deff * var(delta))``, vectorised over numpy arrays.

    ``+inf`` / ``-inf`` where the restricted variance is 0 and ``d != delta`` (only at ``delta = -1, 1``);
    0 where ``d == delta``. The manual: docs/statistics.md.
    """
    b10f, b01f, nf = (np.asarray(x, dtype=np.float64) for x in (b10, b01, n))
    a = 2.0 * nf
    b = -(b10f + b01f) + (2.0 * nf - b10f + b01f) * delta
    c = -b01f * delta * (1.0 - delta)
    p01 = (-b + np.sqrt(np.maximum(0.0, b * b - 4.0 * a * c))) / (2.0 * a)
    var = np.maximum(0.0, (2.0 * p01 + delta - delta * delta) / nf) * design_effect
    gap = (b10f - b01f) / nf - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0.0, gap / np.sqrt(np.where(var > 0.0, var, 1.0)), np.sign(gap) * np.inf)
    return np.where(gap == 0.0, 0.0, z)


def _tango_z1(b10: int, b01: int, n: int, delta: float, deff: float) -> float:
    """`tango_z` for one table, in plain floats (the same arithmetic, without numpy's per-call cost)."""
    a = 2.0 * n
    b = -(b10 + b01) + (2.0 * n - b10 + b01) * delta
    c = -b01 * delta * (1.0 - delta)
    p01 = (-b + math.sqrt(max(0.0, b * b - 4.0 * a * c))) / (2.0 * a)
    var = max(0.0, (2.0 * p01 + delta - delta * delta) / n) * deff
    gap = (b10 - b01) / n - delta
    if gap == 0.0:
        return 0.0
    return gap / math.sqrt(var) if var > 0.0 else math.copysign(math.inf, gap)


def _mn_z1(xa: int, na: int, xb: int, nb: int, delta: float, da: float, db: float) -> float:
    """`mn_z` for one pair of samples, in plain floats."""
    theta = nb / na
    pa, pb = xa / na, xb / nb
    a = 1.0 + theta
    b = -(1.0 + theta + pa + theta * pb + delta * (theta + 2.0))
    c = delta * delta + delta * (2.0 * pa + theta + 1.0) + pa + theta * pb
    d = -pa * delta * (1.0 + delta)
    v = b**3 / (27.0 * a**3) - b * c / (6.0 * a * a) + d / (2.0 * a)
    u = math.sqrt(max(0.0, b * b / (9.0 * a * a) - c / (3.0 * a)))
    u = -u if v < 0.0 else u
    ratio = v / u**3 if u != 0.0 else 1.0
    w = (math.pi + math.acos(min(1.0, max(-1.0, ratio)))) / 3.0
    ta = min(max(2.0 * u * math.cos(w) - b / (3.0 * a), max(0.0, delta)), min(1.0, 1.0 + delta))
    tb = ta - delta
    total = na + nb
    correction = total / (total - 1.0) if total > 1 else 1.0
    var = (da * ta * (1.0 - ta) / na + db * tb * (1.0 - tb) / nb) * correction
    gap = pa - pb - delta
    if gap == 0.0:
        return 0.0
    return gap / math.sqrt(var) if var > 0.0 else math.copysign(math.inf, gap)


def _invert(reject: Callable[[float], bool], inside: float, outside: float) -> float:
    """The boundary of a one-sided score interval, by bisection to adjacent floats.

    ``reject(outside)`` holds and ``reject(inside)`` does not; returns the point nearest ``outside``
    at which ``reject`` does not hold, so that (for a monotone ``reject``) ``reject(x)`` holds exactly
    when ``x`` lies strictly beyond the returned bound.
    """
    for _ in range(2000):
        mid = (inside + outside) / 2.0
        if mid in (inside, outside):
            break
        if reject(mid):
            outside = mid
        else:
            inside = mid
    return inside


def score_interval(
    p_lower: Callable[[float], float], p_upper: Callable[[float], float], estimate: float, alpha: float
) -> tuple[float, float]:
    """The ``1 - 2 alpha`` interval that inverts two one-sided score tests of ``H0: diff = delta``.

    ``p_lower(delta)`` is the p-value of ``H0: d <= delta`` (growing with delta), ``p_upper(delta)``
    that of ``H0: d >= delta`` (falling with delta). The bounds lie in [-1, 1]; TOST at margin m
    rejects both nulls exactly when ``-m < low`` and ``high < m``. The manual: docs/statistics.md.
    """
    low = -1.0 if estimate <= -1.0 else _invert(lambda x: p_lower(x) < alpha, estimate, -1.0)
    high = 1.0 if estimate >= 1.0 else _invert(lambda x: p_upper(x) < alpha, estimate, 1.0)
    return low, high


@dataclass(frozen=True)
class PairedResult:
    """A paired comparison of A against B on the same items (``d = p_a - p_b``).

    ``ci_low``/``ci_high`` are the registered ``method``'s ``1 - 2 alpha`` interval (Tango's score
    interval, or Wald's), so that ``verdict`` is "equivalent" exactly when it lies inside
    ``(-margin, margin)``; the Wald numbers are kept as ``wald_*``. The manual: docs/statistics.md.
    """

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
    ci_low: float | None
    ci_high: float | None
    ci_method: str
    p: float
    wald_ci_low: float | None
    wald_ci_high: float | None
    wald_p_lower: float
    wald_p_upper: float
    wald_p: float
    tango_ci_low: float
    tango_ci_high: float
    tango_p_lower: float
    tango_p_upper: float
    tango_p: float
    mcnemar_p: float
    method: Method
    verdict: Verdict
    note: str | None = None


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
    """The paired comparison from the 2x2 table (docs/statistics.md).

    ``cluster_se`` (from :func:`paired_comparison` when items repeat) replaces the paired Wald SE
    and inflates the Tango variance by the design effect, floored at 1: clustering never makes a
    comparison more certain than the unclustered one. A zero Wald SE gives Wald p-values of 1.
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
    notes: list[str] = []
    if cluster_se is None:
        se, se_method, deff = se_paired, "paired", 1.0
    else:
        if not (cluster_se >= 0.0 and math.isfinite(cluster_se)):
            raise ValueError(f"cluster_se must be finite and >= 0, got {cluster_se!r}")
        se_method = "cluster"
        raw = (cluster_se / se_paired) ** 2 if se_paired > 0.0 else 1.0
        deff = max(1.0, raw)
        se = max(cluster_se, se_paired)
        if raw < 1.0:
            notes.append(f"the item-clustered variance is below the unclustered one (design effect {raw:.4g}): "
                         "floored at 1, the unclustered variance")

    z = NormalDist().inv_cdf(1.0 - alpha)
    if se > 0.0:
        wald_lo, wald_hi = _p_larger(d + margin, se), _p_smaller(d - margin, se)
        wald_ci: tuple[float | None, float | None] = (d - z * se, d + z * se)
    else:
        wald_lo = wald_hi = 1.0
        wald_ci = (None, None)
        notes.append("the Wald standard error is 0 (no discordant pairs, or all one way): "
                     "the Wald interval is undefined and its p-values are 1")

    def t_lower(delta: float) -> float:
        return _phi(-_tango_z1(b10, b01, n, delta, deff))

    def t_upper(delta: float) -> float:
        return _phi(_tango_z1(b10, b01, n, delta, deff))

    tango_lo, tango_hi = t_lower(-margin), t_upper(margin)
    tango_ci = score_interval(t_lower, t_upper, d, alpha)
    wald_p, tango_p = max(wald_lo, wald_hi), max(tango_lo, tango_hi)
    ci: tuple[float | None, float | None]
    if method == "tango":
        chosen, ci, ci_method = tango_p, tango_ci, "tango score"
    else:
        chosen, ci, ci_method = wald_p, wald_ci, "wald"
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
        ci_low=ci[0],
        ci_high=ci[1],
        ci_method=ci_method,
        p=chosen,
        wald_ci_low=wald_ci[0],
        wald_ci_high=wald_ci[1],
        wald_p_lower=wald_lo,
        wald_p_upper=wald_hi,
        wald_p=wald_p,
        tango_ci_low=tango_ci[0],
        tango_ci_high=tango_ci[1],
        tango_p_lower=tango_lo,
        tango_p_upper=tango_hi,
        tango_p=tango_p,
        mcnemar_p=mcnemar_exact(b10, b01),
        method=method,
        verdict="equivalent" if chosen < alpha else "not equivalent",
        note="; ".join(notes) or None,
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


def mn_restricted(x_a: Any, n_a: Any, x_b: Any, n_b: Any, delta: float) -> tuple[Any, Any]:
    """Restricted MLEs ``(p_a~, p_b~)`` under ``p_a - p_b = delta`` (Farrington and Manning 1990), vectorised.

    The root in ``[max(0, delta), min(1, 1 + delta)]`` of the likelihood equation's cubic, by its
    trigonometric closed form (Miettinen and Nurminen 1985). The manual: docs/statistics.md.
    """
    xa, na, xb, nb = (np.asarray(v, dtype=np.float64) for v in (x_a, n_a, x_b, n_b))
    theta = nb / na
    pa, pb = xa / na, xb / nb
    a = 1.0 + theta
    b = -(1.0 + theta + pa + theta * pb + delta * (theta + 2.0))
    c = delta * delta + delta * (2.0 * pa + theta + 1.0) + pa + theta * pb
    d = -pa * delta * (1.0 + delta)
    v = b**3 / (27.0 * a**3) - b * c / (6.0 * a * a) + d / (2.0 * a)
    u = np.sqrt(np.maximum(0.0, b * b / (9.0 * a * a) - c / (3.0 * a)))
    u = np.where(v < 0.0, -u, u)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(u != 0.0, v / np.where(u != 0.0, u**3, 1.0), 1.0)
    w = (math.pi + np.arccos(np.clip(ratio, -1.0, 1.0))) / 3.0
    p_a = np.clip(2.0 * u * np.cos(w) - b / (3.0 * a), max(0.0, delta), min(1.0, 1.0 + delta))
    return p_a, p_a - delta


def mn_z(x_a: Any, n_a: Any, x_b: Any, n_b: Any, delta: float, deff_a: Any = 1.0, deff_b: Any = 1.0) -> Any:
    """Miettinen-Nurminen score statistic for ``H0: p_a - p_b = delta``, vectorised.

    ``z = (d - delta) / sqrt(V)``, ``V = (deff_a p_a~(1-p_a~)/n_a + deff_b p_b~(1-p_b~)/n_b) N/(N-1)``
    with ``N = n_a + n_b`` (``N/(N-1)`` is 1 when N is 1); +-inf where V is 0 and ``d != delta``.
    """
    xa, na, xb, nb = (np.asarray(v, dtype=np.float64) for v in (x_a, n_a, x_b, n_b))
    ta, tb = mn_restricted(xa, na, xb, nb, delta)
    total = na + nb
    correction = np.where(total > 1.0, total / np.maximum(total - 1.0, 1.0), 1.0)
    var = (deff_a * ta * (1.0 - ta) / na + deff_b * tb * (1.0 - tb) / nb) * correction
    gap = xa / na - xb / nb - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0.0, gap / np.sqrt(np.where(var > 0.0, var, 1.0)), np.sign(gap) * np.inf)
    return np.where(gap == 0.0, 0.0, z)


def binomial_design_effect(per_item: Sequence[tuple[int, int]]) -> float:
    """The design effect of one sample's pass rate clustered by item, floored at 1.

    ``per_item`` holds ``(passes, cells)`` per item; with ``p = sum passes / n`` the CR0 variance
    ``sum_j (S_j - k_j p)^2 / n^2`` over the binomial ``p (1 - p) / n`` (1 when p is 0 or 1).
    """
    n = sum(k for _, k in per_item)
    if n <= 0:
        raise ValueError("no cells")
    passes = sum(s for s, _ in per_item)
    p = passes / n
    binomial = p * (1.0 - p) / n
    if binomial <= 0.0:
        return 1.0
    clustered = sum((s - k * p) ** 2 for s, k in per_item) / (n * n)
    return max(1.0, clustered / binomial)


@dataclass(frozen=True)
class IndependentTostResult:
    """TOST for ``d = p_a - p_b`` from independent samples: Miettinen-Nurminen score test and interval.

    ``ci_low``/``ci_high``/``p*``/``verdict`` are the score method's (the verdict is "equivalent"
    exactly when the ``1 - 2 alpha`` interval lies inside ``(-margin, margin)``); ``se`` and
    ``wald_*`` are the unrestricted Wald numbers, kept for reference. The manual: docs/statistics.md.
    """

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
    method: str = "miettinen-nurminen"
    design_effect_a: float = 1.0
    design_effect_b: float = 1.0
    wald_ci_low: float | None = None
    wald_ci_high: float | None = None
    wald_p_lower: float = 1.0
    wald_p_upper: float = 1.0
    wald_p: float = 1.0


def independent_tost(
    pass_a: int, n_a: int, pass_b: int, n_b: int, margin: float, alpha: float = 0.05, *,
    design_effect_a: float = 1.0, design_effect_b: float = 1.0,
) -> IndependentTostResult:
    """TOST for two independent proportions by the Miettinen-Nurminen (1985) score test.

    ``p_lower`` tests ``H0: d <= -m``, ``p_upper`` ``H0: d >= m``; the interval inverts the same test.
    ``design_effect_a``/``_b`` (each floored at 1) inflate each sample's variance when cells cluster
    by item. Matches statsmodels ``tost_proportions_2indep(..., method='score')`` without clustering.
    """
    for name, count, total in (("pass_a", pass_a, n_a), ("pass_b", pass_b, n_b)):
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ValueError(f"sample size for {name} must be a positive integer, got {total!r}")
        _check_count(name, count)
        if count > total:
            raise ValueError(f"{name}={count} exceeds its sample size {total}")
    _check_margin_alpha(margin, alpha)
    for name, value in (("design_effect_a", design_effect_a), ("design_effect_b", design_effect_b)):
        if not (isinstance(value, float | int) and math.isfinite(value) and value > 0.0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    da, db = max(1.0, float(design_effect_a)), max(1.0, float(design_effect_b))
    pa, pb = pass_a / n_a, pass_b / n_b
    d = pa - pb
    se = math.sqrt(da * pa * (1.0 - pa) / n_a + db * pb * (1.0 - pb) / n_b)

    def s_lower(delta: float) -> float:
        return _phi(-_mn_z1(pass_a, n_a, pass_b, n_b, delta, da, db))

    def s_upper(delta: float) -> float:
        return _phi(_mn_z1(pass_a, n_a, pass_b, n_b, delta, da, db))

    lo, hi = s_lower(-margin), s_upper(margin)
    ci_low, ci_high = score_interval(s_lower, s_upper, d, alpha)
    z = NormalDist().inv_cdf(1.0 - alpha)
    w_lo, w_hi = _p_larger(d + margin, se), _p_smaller(d - margin, se)
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
        ci_low=ci_low,
        ci_high=ci_high,
        p_lower=lo,
        p_upper=hi,
        p=p,
        verdict="equivalent" if p < alpha else "not equivalent",
        design_effect_a=da,
        design_effect_b=db,
        wald_ci_low=d - z * se if se > 0.0 else None,
        wald_ci_high=d + z * se if se > 0.0 else None,
        wald_p_lower=w_lo,
        wald_p_upper=w_hi,
        wald_p=max(w_lo, w_hi),
    )
