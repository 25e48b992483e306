"""Statistics (harness.stats.paired: McNemar, TOST, clustering) against statsmodels and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import score_test_proportions_2indep, tost_proportions_2indep

from harness.stats.paired import (
    binomial_design_effect,
    cluster_robust_se,
    independent_tost,
    mcnemar_exact,
    mn_restricted,
    mn_z,
    paired_comparison,
    paired_from_counts,
    tango_restricted_p01,
    tango_z,
)
from tests.support.stats import ALPHAS, TOL, counts

# -- McNemar and independent TOST -------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60), st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_exact_matches_statsmodels(n11: int, b10: int, b01: int, n00: int) -> None:
    table = np.array([[n11, b10], [b01, n00]])
    assert mcnemar_exact(b10, b01) == pytest.approx(mcnemar(table, exact=True).pvalue, abs=TOL)
    if n11 + b10 + b01 + n00:
        got = paired_from_counts(n11, b10, b01, n00, margin=0.1).mcnemar_p
        assert got == pytest.approx(mcnemar(table, exact=True).pvalue, abs=TOL)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # statsmodels divides by zero at the edges
@settings(max_examples=300, deadline=None)
@given(counts(), counts(), st.sampled_from([0.02, 0.05, 0.1, 0.2]), ALPHAS)
def test_independent_tost_matches_statsmodels(
    a: tuple[int, int], b: tuple[int, int], margin: float, alpha: float
) -> None:
    (xa, na), (xb, nb) = a, b
    """The Wald numbers (kept as wald_*; issue 15 made the registered p and interval Miettinen-Nurminen's)."""
    got = independent_tost(xa, na, xb, nb, margin, alpha)
    ref = tost_proportions_2indep(xa, na, xb, nb, -margin, margin, method="wald")
    if got.se == 0.0:  # statsmodels divides by zero; a zero SE gives no certainty (issue 15)
        assert got.wald_p == 1.0 and got.wald_ci_low is None
        return
    # statsmodels: diff = p1 - p2; results_larger tests H0: diff <= low, results_smaller diff >= upp
    assert got.diff == pytest.approx(float(ref.results_larger.diff), abs=TOL)
    assert got.wald_p_lower == pytest.approx(float(ref.results_larger.pvalue), abs=TOL)
    assert got.wald_p_upper == pytest.approx(float(ref.results_smaller.pvalue), abs=TOL)
    assert got.wald_p == pytest.approx(float(ref.pvalue), abs=TOL)
    assert (got.verdict == "equivalent") == (got.ci_low > -margin and got.ci_high < margin)


# -- paired: a worked example by hand ---------------------------------------------


def test_paired_worked_example_by_hand() -> None:
    # n = 30 pairs: n11 = 15, b10 = 5 (A pass, B fail), b01 = 2, n00 = 8; margin m = 0.1.
    n11, b10, b01, n00, m = 15, 5, 2, 8, 0.1
    r = paired_from_counts(n11, b10, b01, n00, margin=m, alpha=0.05)
    # p_a = 20/30, p_b = 17/30, d = (5 - 2)/30 = 0.1
    assert (r.n, r.p_a, r.p_b) == (30, 20 / 30, 17 / 30)
    assert r.diff == pytest.approx(0.1, abs=1e-15)

    # Wald (Liu et al. 2002): se^2 = ((b10 + b01)/n - d^2)/n = (7/30 - 0.01)/30
    #   = 0.2233333.../30 = 0.00744444...,  se = 0.0862812...
    se = math.sqrt((7 / 30 - 0.01) / 30)
    assert se == pytest.approx(0.0862812, abs=1e-7)
    assert r.se == pytest.approx(se, abs=TOL)
    # lower: z = (d + m)/se = 0.2/0.0862812 = 2.318003, p = 1 - Phi(2.318003) = 0.010225
    assert r.wald_p_lower == pytest.approx(0.5 * math.erfc(0.2 / se / math.sqrt(2)), abs=TOL)
    assert r.wald_p_lower == pytest.approx(0.010225, abs=1e-6)
    # upper: z = (d - m)/se = 0, p = 0.5
    assert r.wald_p_upper == pytest.approx(0.5, abs=TOL)
    # 90% Wald interval: 0.1 -+ 1.644854 * 0.0862812 = (-0.041920, 0.241920); the reported
    # interval (ci_low, ci_high) is Tango's since issue 15, the Wald one is wald_ci_*
    assert (r.wald_ci_low, r.wald_ci_high) == (
        pytest.approx(-0.041920, abs=1e-6),
        pytest.approx(0.241920, abs=1e-6),
    )

    # Tango (1998) at delta = +0.1: A = 2n = 60, B = -(5 + 2) + (60 - 5 + 2)(0.1) = -1.3,
    #   C = -b01 delta (1 - delta) = -2(0.1)(0.9) = -0.18,
    #   B^2 - 4AC = 1.69 + 43.2 = 44.89 = 6.7^2,  p01~ = (1.3 + 6.7)/120 = 1/15
    #   (equal to the unrestricted b01/n since d = delta), var = (2/15 + 0.1 - 0.01)/30,
    #   z = 0, p_upper = 0.5.
    assert tango_restricted_p01(b10, b01, 30, 0.1) == pytest.approx(1 / 15, abs=TOL)
    assert r.tango_p_upper == pytest.approx(0.5, abs=TOL)
    # at delta = -0.1: B = -7 + 57(-0.1) = -12.7, C = -2(-0.1)(1.1) = 0.22,
    #   B^2 - 4AC = 161.29 - 52.8 = 108.49,  p01~ = (12.7 + sqrt(108.49))/120 = 0.1926321
    #   (the other root, 0.0190, is infeasible: p10 = p01 - 0.1 < 0),
    #   var = (2(0.1926321) - 0.1 - 0.01)/30 = 0.2752642/30 = 0.00917547,  se = 0.0957887,
    #   z = 0.2/0.0957887 = 2.087929,  p_lower = 1 - Phi(2.087929) = 0.018402
    p01 = (12.7 + math.sqrt(108.49)) / 120
    assert p01 == pytest.approx(0.1926321, abs=1e-7)
    assert tango_restricted_p01(b10, b01, 30, -0.1) == pytest.approx(p01, abs=TOL)
    se_t = math.sqrt((2 * p01 - 0.1 - 0.01) / 30)
    assert se_t == pytest.approx(0.0957887, abs=1e-7)
    assert r.tango_p_lower == pytest.approx(0.5 * math.erfc(0.2 / se_t / math.sqrt(2)), abs=TOL)
    assert r.tango_p_lower == pytest.approx(0.018402, abs=1e-6)

    assert r.tango_p == pytest.approx(0.5) and r.wald_p == pytest.approx(0.5)
    assert r.verdict == "not equivalent"
    # McNemar exact: 2 P(Binom(7, 1/2) <= 2) = 2 (1 + 7 + 21)/128 = 58/128
    assert r.mcnemar_p == pytest.approx(58 / 128, abs=TOL)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 40),
    st.sampled_from([-0.2, -0.1, -0.05, 0.05, 0.1, 0.2]),
)
def test_tango_root_is_the_restricted_mle(b10: int, b01: int, conc: int, delta: float) -> None:
    """The closed form maximises the profile likelihood under p10 = p01 + delta."""
    n = b10 + b01 + conc
    if n == 0:
        return
    lo, hi = max(0.0, -delta), (1.0 - delta) / 2.0

    def negll(p: float) -> float:
        terms = [(b10, p + delta), (b01, p), (conc, 1.0 - 2.0 * p - delta)]
        return -sum(k * math.log(q) for k, q in terms if k)

    eps = 1e-12
    best = optimize.minimize_scalar(
        negll, bounds=(lo + eps, hi - eps), method="bounded", options={"xatol": 1e-12}
    )
    got = tango_restricted_p01(b10, b01, n, delta)
    assert lo - 1e-12 <= got <= hi + 1e-12
    assert negll(min(max(got, lo + eps), hi - eps)) <= best.fun + 1e-6


# -- paired: clustering -------------------------------------------------------------


def test_cluster_se_equals_paired_se_when_items_are_unique() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        a = rng.integers(0, 2, 57).tolist()
        b = rng.integers(0, 2, 57).tolist()
        items = [f"item-{i}" for i in range(57)]
        plain = paired_comparison(a, b, margin=0.1)
        assert cluster_robust_se(a, b, items) == pytest.approx(plain.se, abs=TOL)
        with_items = paired_comparison(a, b, items=items, margin=0.1)
        assert with_items.se_method == "paired" and with_items.se == plain.se
        assert with_items.tango_p == plain.tango_p


def test_cluster_se_balanced_repeats_is_variance_of_item_means() -> None:
    rng = np.random.default_rng(11)
    k, r = 40, 3
    a = rng.integers(0, 2, k * r).tolist()
    b = rng.integers(0, 2, k * r).tolist()
    items = [f"i{j}" for j in range(k) for _ in range(r)]
    item_means = (np.array(a) - np.array(b)).reshape(k, r).mean(axis=1)
    expected = math.sqrt(item_means.var(ddof=0) / k)
    res = paired_comparison(a, b, items=items, margin=0.1)
    assert res.se_method == "cluster" and res.n_items == k and res.n == k * r
    assert res.se == pytest.approx(expected, abs=TOL)
    assert res.design_effect == pytest.approx(
        (expected / paired_comparison(a, b, margin=0.1).se) ** 2
    )


def test_perfectly_correlated_repeats_inflate_the_se() -> None:
    # each item's 4 repeats are identical: clustering should inflate the variance 4x
    a1, b1 = [1, 0, 1, 1, 0, 1, 0, 1], [0, 0, 1, 0, 1, 1, 0, 0]
    a = [x for x in a1 for _ in range(4)]
    b = [x for x in b1 for _ in range(4)]
    items = [str(j) for j in range(8) for _ in range(4)]
    res = paired_comparison(a, b, items=items, margin=0.2)
    assert res.design_effect == pytest.approx(4.0, abs=TOL)
    assert res.se == pytest.approx(paired_comparison(a1, b1, margin=0.2).se, abs=TOL)


# -- paired: type I error at the margin -------------------------------------------


@pytest.mark.parametrize("method", ["wald", "tango"])
@pytest.mark.parametrize("sign", [1, -1])
def test_paired_tost_type_one_error_at_margin(method: str, sign: int) -> None:
    rng = np.random.default_rng(20240601)
    reps, n, alpha, margin = 2000, 200, 0.05, 0.1
    # true p10 - p01 = sign * margin exactly
    p10, p01 = (0.15, 0.05) if sign > 0 else (0.05, 0.15)
    tables = rng.multinomial(n, [0.5, p10, p01, 0.3], size=reps)
    rejections = 0
    for n11, b10, b01, n00 in tables.tolist():
        res = paired_from_counts(n11, b10, b01, n00, margin=margin, alpha=alpha, method=method)  # type: ignore[arg-type]
        rejections += res.verdict == "equivalent"
    rate = rejections / reps
    mc_se = math.sqrt(alpha * (1 - alpha) / reps)
    assert rate <= alpha + 3 * mc_se, (method, sign, rate)


def test_verdict_equivalent_when_close() -> None:
    res = paired_from_counts(150, 10, 9, 131, margin=0.1)
    assert res.verdict == "equivalent" and res.tango_p < 0.05 and res.wald_p < 0.05
    assert -0.1 < res.ci_low < res.ci_high < 0.1


def test_no_discordant_pairs() -> None:
    res = paired_from_counts(20, 0, 0, 10, margin=0.1)
    assert res.se == 0.0 and res.wald_p == 1.0  # a zero Wald SE gives no certainty (issue 15; was 0.0)
    assert 0.0 < res.tango_p < 1.0 and math.isfinite(res.tango_p)
    assert res.mcnemar_p == 1.0


# -- refusals -------------------------------------------------------------------------


def test_paired_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        paired_comparison([1, 0], [1], margin=0.1)
    with pytest.raises(ValueError):
        paired_comparison([], [], margin=0.1)
    with pytest.raises(ValueError):
        paired_comparison([1, 2], [1, 0], margin=0.1)
    with pytest.raises(ValueError):
        paired_comparison([1, 0], [1, 0], items=["x"], margin=0.1)
    for margin in (0.0, -0.1, 1.0):
        with pytest.raises(ValueError):
            paired_comparison([1, 0], [1, 0], margin=margin)
    for alpha in (0.0, 0.5, 1.2):
        with pytest.raises(ValueError):
            paired_comparison([1, 0], [1, 0], margin=0.1, alpha=alpha)
    with pytest.raises(ValueError):
        paired_comparison([1, 0], [1, 0], margin=0.1, method="exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        paired_from_counts(0, 0, 0, 0, margin=0.1)
    with pytest.raises(ValueError):
        paired_from_counts(1, -1, 0, 0, margin=0.1)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_independent_tost_refuses_bad_input() -> None:
    for args in [(1, 0, 1, 5), (6, 5, 1, 5), (1, 5, -1, 5), (1, 5, 1, 0)]:
        with pytest.raises(ValueError):
            independent_tost(*args, margin=0.1)
    with pytest.raises(ValueError):
        independent_tost(1, 5, 1, 5, margin=0.0)


# -- issue 15: the registered method's interval, published examples --------------------


def test_tango_interval_reproduces_fagerland_2014_cavo() -> None:
    """Fagerland, Lydersen & Laake 2014 (BMC Med Res Methodol 14:25), complete response before and
    after consolidation therapy (Cavo et al. 2012): n11 59, n12 6, n21 16, n22 80; the Tango
    asymptotic score 95% interval is -0.1240 to -0.0054 (a 95% interval is the 1 - 2 alpha one at
    alpha 0.025)."""
    r = paired_from_counts(59, 6, 16, 80, margin=0.2, alpha=0.025)
    assert r.diff == pytest.approx(-0.0621, abs=5e-5)
    assert (round(r.ci_low, 4), round(r.ci_high, 4)) == (-0.1240, -0.0054)
    assert r.ci_method == "tango score" and (r.tango_ci_low, r.tango_ci_high) == (r.ci_low, r.ci_high)


def test_mn_interval_reproduces_published_examples() -> None:
    """Miettinen-Nurminen 95% intervals: Newcombe 1998 (Stat Med 17:873) Table II, example (a)
    56/70 - 48/80: 0.0528 to 0.3382; Fagerland, Lydersen & Laake 2017 (Statistical Analysis of
    Contingency Tables, ch. 4; Ritland et al. 2007) 0/16 - 15/72: -0.3164 to -0.0056."""
    a = independent_tost(56, 70, 48, 80, 0.1, alpha=0.025)
    assert (round(a.ci_low, 4), round(a.ci_high, 4)) == (0.0528, 0.3382)
    b = independent_tost(0, 16, 15, 72, 0.1, alpha=0.025)
    assert (round(b.ci_low, 4), round(b.ci_high, 4)) == (-0.3164, -0.0056)


def test_mn_restricted_mle_maximises_the_likelihood() -> None:
    """The closed-form root is the constrained MLE (checked numerically), where statsmodels' score
    test differs at a non-zero null (its restricted estimate is not the maximum); at delta 0 the two
    agree (below)."""
    for xa, na, xb, nb, delta in [(7, 10, 5, 8, -0.2), (30, 50, 22, 50, 0.1), (0, 16, 15, 72, -0.1)]:
        got, _ = mn_restricted(xa, na, xb, nb, delta)

        def negll(p: float, xa: int = xa, na: int = na, xb: int = xb, nb: int = nb, delta: float = delta) -> float:
            q = p - delta
            terms = [(xa, p), (na - xa, 1 - p), (xb, q), (nb - xb, 1 - q)]
            return -sum(k * math.log(v) for k, v in terms if k)

        lo, hi = max(0.0, delta) + 1e-12, min(1.0, 1.0 + delta) - 1e-12
        best = optimize.minimize_scalar(negll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12})
        assert negll(float(got)) <= best.fun + 1e-9


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=200, deadline=None)
@given(counts(), counts())
def test_mn_score_at_zero_matches_statsmodels(a: tuple[int, int], b: tuple[int, int]) -> None:
    (xa, na), (xb, nb) = a, b
    if xa + xb in (0, na + nb):
        return  # statsmodels divides by zero
    ref = score_test_proportions_2indep(xa, na, xb, nb, value=0, correction=True, return_results=True)
    assert float(mn_z(xa, na, xb, nb, 0.0)) == pytest.approx(float(ref.statistic), abs=TOL)


@pytest.mark.parametrize("margin", [0.05, 0.1, 0.3])
def test_paired_equivalent_iff_the_interval_lies_inside_the_margin(margin: float) -> None:
    """Every 2x2 table with up to 8 pairs (and larger tables near the margin)."""
    tables = [(n11, b10, b01, n - n11 - b10 - b01) for n in range(1, 9) for n11 in range(n + 1)
              for b10 in range(n - n11 + 1) for b01 in range(n - n11 - b10 + 1)]
    tables += [(40, b10, b01, 40) for b10 in range(0, 12, 2) for b01 in range(0, 12, 3)]
    for t in tables:
        r = paired_from_counts(*t, margin=margin)
        assert r.ci_low is not None and r.ci_high is not None
        inside = -margin < r.ci_low and r.ci_high < margin
        assert (r.verdict == "equivalent") == inside, (t, r.ci_low, r.ci_high, r.tango_p)
        assert r.ci_low <= r.diff <= r.ci_high
        if r.se > 0.0:  # clustered: the design effect scales Tango's variance; the same holds
            c = paired_from_counts(*t, margin=margin, cluster_se=1.7 * r.se, n_items=max(1, r.n // 2))
            assert c.ci_low is not None and c.ci_high is not None and c.design_effect == pytest.approx(1.7**2)
            assert (c.verdict == "equivalent") == (-margin < c.ci_low and c.ci_high < margin), t


@pytest.mark.parametrize("margin", [0.1, 0.3])
def test_independent_equivalent_iff_the_interval_lies_inside_the_margin(margin: float) -> None:
    for na in (1, 2, 5, 12):
        for nb in (1, 3, 9):
            for xa in range(na + 1):
                for xb in range(nb + 1):
                    r = independent_tost(xa, na, xb, nb, margin)
                    inside = -margin < r.ci_low and r.ci_high < margin
                    assert (r.verdict == "equivalent") == inside, (xa, na, xb, nb, r.ci_low, r.ci_high)


def test_no_certainty_from_zero_variance() -> None:
    """Issue 15 items 1-3: each of these once said "equivalent" with p 0, or an interval of [0, 0]."""
    r = paired_from_counts(20, 0, 0, 0, margin=0.1)
    assert r.verdict == "not equivalent" and r.ci_low is not None and r.ci_low < -0.1
    cancel = paired_comparison([1, 0, 1, 0], [0, 1, 0, 1], items=["x", "x", "y", "y"], margin=0.01)
    assert cancel.verdict == "not equivalent" and cancel.design_effect == 1.0 and cancel.note
    assert cancel.tango_p > 0.4
    ind = independent_tost(0, 1, 0, 1, 0.1)
    assert ind.verdict == "not equivalent" and ind.p > 0.05 and ind.wald_p == 1.0
    assert independent_tost(0, 2, 0, 2, 0.1).verdict == "not equivalent"
    wald = paired_comparison([1], [1], margin=0.1, method="wald")
    assert wald.verdict == "not equivalent" and wald.wald_p == 1.0 and wald.ci_low is None


def test_independent_design_effects_widen_the_interval() -> None:
    plain = independent_tost(30, 50, 28, 50, 0.2)
    clustered = independent_tost(30, 50, 28, 50, 0.2, design_effect_a=3.0, design_effect_b=2.0)
    assert clustered.ci_low < plain.ci_low and clustered.ci_high > plain.ci_high and clustered.p > plain.p
    floored = independent_tost(30, 50, 28, 50, 0.2, design_effect_a=0.5)
    assert floored.design_effect_a == 1.0 and floored.p == plain.p
    assert binomial_design_effect([(3, 3), (0, 3)]) == pytest.approx(3.0)
    assert binomial_design_effect([(1, 2), (1, 2)]) == 1.0  # below 1, floored


def test_independent_tost_clustered_by_item_keeps_its_level() -> None:
    """Issue 15 item 4: 40 items x 10 repeats per system, item pass rates Beta-distributed around
    0.6 and 0.5 (the difference at the margin 0.1). Counting repeats as independent cells says
    "equivalent" far more often than alpha; with each system's design effect it keeps the level."""
    rng = np.random.default_rng(15)
    reps, items, repeats, margin, alpha = 200, 40, 10, 0.1, 0.05
    clustered = naive = 0
    for _ in range(reps):
        sides = []
        for mean in (0.6, 0.5):
            k = rng.binomial(repeats, rng.beta(mean * 2, (1 - mean) * 2, items))
            sides.append((int(k.sum()), binomial_design_effect([(int(x), repeats) for x in k])))
        (xa, da), (xb, db) = sides
        n = items * repeats
        clustered += independent_tost(xa, n, xb, n, margin, alpha, design_effect_a=da,
                                      design_effect_b=db).verdict == "equivalent"
        naive += independent_tost(xa, n, xb, n, margin, alpha).verdict == "equivalent"
    mc_se = math.sqrt(alpha * (1 - alpha) / reps)
    assert clustered / reps <= alpha + 3 * mc_se
    assert naive / reps > alpha + 3 * mc_se  # what the unclustered test did


def test_scalar_and_vectorised_statistics_agree() -> None:
    """The verdicts use plain-float statistics, the enumerations numpy's: the same arithmetic."""
    from harness.stats.paired import _mn_z1, _tango_z1

    for n, b10, b01 in [(1, 0, 0), (5, 2, 0), (20, 3, 7), (164, 16, 0), (30, 30, 0)]:
        for delta in (-0.3, -0.1, 0.0, 0.05, 0.2):
            assert _tango_z1(b10, b01, n, delta, 1.5) == pytest.approx(float(tango_z(b10, b01, n, delta, 1.5)),
                                                                      rel=1e-12, abs=1e-12)
    for xa, na, xb, nb in [(0, 1, 0, 1), (7, 10, 5, 8), (0, 16, 15, 72), (40, 40, 0, 3)]:
        for delta in (-0.3, -0.1, 0.0, 0.2):
            assert _mn_z1(xa, na, xb, nb, delta, 1.0, 2.0) == pytest.approx(
                float(mn_z(xa, na, xb, nb, delta, 1.0, 2.0)), rel=1e-12, abs=1e-12)
