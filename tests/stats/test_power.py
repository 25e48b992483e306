"""Items needed for TOST equivalence of two pass rates: worked examples and properties."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.stats.paired import paired_from_counts
from harness.stats.power import (
    correlation_bounds,
    difference_variance,
    exact_tost_power,
    independent_rejection,
    items_needed,
    minimum_detectable_margin,
    paired_rejection,
    tost_power,
)

Z95 = 1.6448536269514722  # z_{0.95}
Z90 = 1.2815515655446004  # z_{0.90}
Z80 = 0.8416212335729143  # z_{0.80}


# --------------------------------------------------------------------------
# Worked examples, checked by hand


def test_equal_rates_paired() -> None:
    # sigma_d^2 = .24 + .24 - 2(.5)(.24) = .24;  n = (1.6449 + 1.2816)^2 .24 / .1^2 = 8.5638 x 24 = 205.53 -> 206
    assert difference_variance(0.6, 0.6, 0.5) == pytest.approx(0.24)
    hand = (Z95 + Z90) ** 2 * 0.24 / 0.01
    assert hand == pytest.approx(205.532, abs=1e-3)
    s = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=0.6, p_b=0.6, correlation=0.5)
    # issue 15: n now comes from the exact power of Tango's TOST; the normal approximation's n is n_normal
    assert (s.n_normal, s.n_closed_form, s.reason) == (206, 206, None)
    assert s.n is not None and s.n >= 206 and s.power_at_n is not None and s.power_at_n >= 0.8
    # power(n) = 2 Phi(.1 sqrt(n)/sqrt(.24) - 1.6449) - 1
    assert tost_power(206, margin=0.1, alpha=0.05, p_a=0.6, p_b=0.6, correlation=0.5) == pytest.approx(0.80117, abs=1e-5)
    assert tost_power(205, margin=0.1, alpha=0.05, p_a=0.6, p_b=0.6, correlation=0.5) == pytest.approx(0.79867, abs=1e-5)


def test_different_rates_paired() -> None:
    # sigma_d^2 = .24 + .2275 - 2(.5) sqrt(.24 x .2275) = .4675 - .233666 = .233834
    # n = (1.6449 + 0.8416)^2 x .233834 / (.1 - .05)^2 = 6.18256 x 93.5336 = 578.27 -> 579
    assert difference_variance(0.6, 0.65, 0.5) == pytest.approx(0.233834, abs=1e-6)
    hand = (Z95 + Z80) ** 2 * 0.233834 / 0.05**2
    assert hand == pytest.approx(578.27, abs=0.01)
    s = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=0.6, p_b=0.65, correlation=0.5)
    # issue 15: the normal approximation's n is n_normal; n_closed_form is now Chow, Shao & Wang's, with
    # z_{1-beta/2}: (1.6449 + 1.2816)^2 x 93.5336 = 801.03 -> 802 (it was the one-tail form, 579)
    assert (s.n_normal, s.n_closed_form) == (579, 802)
    assert s.delta == pytest.approx(-0.05) and s.sd == pytest.approx(math.sqrt(0.233834), abs=1e-6)


def test_independent_samples() -> None:
    # sigma^2 = .24 + .2275 = .4675;  n = 6.18256 x .4675 / .0025 = 1156.13 -> 1157 per system
    s = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=0.6, p_b=0.65, correlation=0.9, paired=False)
    assert (s.n_normal, s.paired) == (1157, False)  # issue 15: n is now the exact one
    assert s.to_json()["design"] == "independent"
    assert difference_variance(0.6, 0.65, 0.9, paired=False) == pytest.approx(0.4675)


def test_positive_correlation_needs_fewer_items() -> None:
    values = [items_needed(margin=0.1, alpha=0.05, power=0.9, p_a=0.7, p_b=0.7, correlation=r).n
              for r in (0.0, 0.3, 0.6, 0.9)]
    assert values == sorted(values, reverse=True) and values[0] is not None and values[-1] is not None
    assert values[0] > 2 * values[-1]


def test_the_closed_form_can_undershoot_and_the_search_corrects_it() -> None:
    # delta != 0: the closed form with z_{1-beta} drops the far tail, which matters when |delta| is small.
    # n lies between it and the conservative closed form with z_{1-beta/2} (each tail then reaches 1 - beta/2).
    # issue 15: n_closed_form is now that conservative one (Chow, Shao & Wang's); n_normal is the old n
    undershoots = 0
    for p_b in (0.6, 0.601, 0.605, 0.61, 0.62, 0.65):
        s = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=0.6, p_b=p_b, correlation=0.3, exact=False)
        assert s.n is not None and s.n_closed_form is not None and s.n == s.n_normal
        one_tail = math.ceil((Z95 + (Z80 if p_b != 0.6 else Z90)) ** 2 * s.sd**2 / (0.1 - abs(s.delta)) ** 2)
        conservative = math.ceil((Z95 + Z90) ** 2 * s.sd**2 / (0.1 - abs(s.delta)) ** 2)
        assert one_tail <= s.n <= conservative == s.n_closed_form
        undershoots += s.n > one_tail
        assert tost_power(s.n, margin=0.1, alpha=0.05, p_a=0.6, p_b=p_b, correlation=0.3) >= 0.8
        assert tost_power(s.n - 1, margin=0.1, alpha=0.05, p_a=0.6, p_b=p_b, correlation=0.3) < 0.8
    assert undershoots >= 1


NOT_ACHIEVABLE: dict[str, dict[str, Any]] = {
    "difference beyond the margin": {"p_a": 0.5, "p_b": 0.7, "margin": 0.1},
    "difference exactly the margin": {"p_a": 0.6, "p_b": 0.7, "margin": 0.1},
    "impossible correlation": {"p_a": 0.3, "p_b": 0.9, "margin": 0.7, "correlation": 0.5},
    "perfect correlation of unequal rates": {"p_a": 0.6, "p_b": 0.65, "margin": 0.1, "correlation": 1.0},
}


@pytest.mark.parametrize("case", sorted(NOT_ACHIEVABLE))
def test_not_achievable(case: str) -> None:
    args = {"alpha": 0.05, "power": 0.8, "correlation": 0.0, **NOT_ACHIEVABLE[case]}
    s = items_needed(**args)
    assert s.n is None and s.n_closed_form is None and s.power_at_n is None
    assert s.reason is not None and s.reason.startswith("not achievable")
    assert s.to_json()["achievable"] is False


def test_correlation_bounds() -> None:
    low, high = correlation_bounds(0.6, 0.65)  # type: ignore[misc]
    assert high == pytest.approx((0.6 - 0.39) / math.sqrt(0.24 * 0.2275))
    assert low == pytest.approx((0.25 - 0.39) / math.sqrt(0.24 * 0.2275))
    assert correlation_bounds(0.5, 0.5) == pytest.approx((-1.0, 1.0))
    assert correlation_bounds(0.0, 0.4) is None


def test_certain_outcomes() -> None:
    s = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=1.0, p_b=1.0)
    # issue 15: the normal approximation says 1 item; Tango's TOST with every pair concordant is
    # "equivalent" only when z^2/(n + z^2) < m, i.e. n > z^2 (1 - m)/m = 24.35: the exact n is 25
    assert s.n_normal == 1 and s.power_at_n_normal == 1.0 and s.sd == 0.0
    assert (s.n, s.power_at_n) == (25, 1.0)
    same = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=0.5, p_b=0.5, correlation=1.0)
    assert (same.n_normal, same.n) == (1, 25)
    assert minimum_detectable_margin(5, alpha=0.05, power=0.8, p_a=1.0, p_b=1.0) == pytest.approx(0.0)


def test_minimum_detectable_margin_closed_form_at_equal_rates() -> None:
    # delta = 0: m = (z_{1-alpha} + z_{1-beta/2}) sigma_d / sqrt(n)
    m = minimum_detectable_margin(206, alpha=0.05, power=0.8, p_a=0.6, p_b=0.6, correlation=0.5)
    assert m == pytest.approx((Z95 + Z90) * math.sqrt(0.24) / math.sqrt(206), rel=1e-9)
    assert minimum_detectable_margin(10, alpha=0.05, power=0.8, p_a=0.3, p_b=0.9, correlation=0.5) is None


@pytest.mark.parametrize("bad", [
    {"margin": 0.0}, {"alpha": 0.0}, {"alpha": 1.0}, {"power": 1.0}, {"p_a": 1.2}, {"correlation": -1.5},
])
def test_invalid_inputs_raise(bad: dict[str, float]) -> None:
    args = {"margin": 0.1, "alpha": 0.05, "power": 0.8, "p_a": 0.6, "p_b": 0.6, "correlation": 0.0, **bad}
    with pytest.raises(ValueError):
        items_needed(**args)


# --------------------------------------------------------------------------
# Properties

rates = st.floats(0.02, 0.98)
alphas = st.floats(0.005, 0.25)
powers = st.floats(0.55, 0.99)
margins = st.floats(0.02, 0.5)


@st.composite
def comparisons(draw: st.DrawFn) -> dict[str, Any]:
    p_a, p_b = draw(rates), draw(rates)
    low, high = correlation_bounds(p_a, p_b)  # type: ignore[misc]
    rho = draw(st.floats(max(low, -0.9), min(high, 0.95))) if min(high, 0.95) > max(low, -0.9) else 0.0
    return {"p_a": p_a, "p_b": p_b, "correlation": rho, "paired": draw(st.booleans())}


def _n(**kwargs: Any) -> float:
    """The normal approximation's n (the exact power saw-tooths in n; issue 15 moved n to it)."""
    n = items_needed(**kwargs, exact=False).n
    return math.inf if n is None else n


@settings(max_examples=300, deadline=None)
@given(c=comparisons(), m1=margins, m2=margins, alpha=alphas, power=powers)
def test_n_is_non_increasing_in_the_margin(c: dict[str, Any], m1: float, m2: float, alpha: float, power: float) -> None:
    small, large = sorted((m1, m2))
    assert _n(margin=small, alpha=alpha, power=power, **c) >= _n(margin=large, alpha=alpha, power=power, **c)


@settings(max_examples=300, deadline=None)
@given(c=comparisons(), margin=margins, a1=alphas, a2=alphas, power=powers)
def test_n_is_non_increasing_in_alpha(c: dict[str, Any], margin: float, a1: float, a2: float, power: float) -> None:
    small, large = sorted((a1, a2))
    assert _n(margin=margin, alpha=small, power=power, **c) >= _n(margin=margin, alpha=large, power=power, **c)


@settings(max_examples=300, deadline=None)
@given(c=comparisons(), margin=margins, alpha=alphas, p1=powers, p2=powers)
def test_n_is_non_decreasing_in_power(c: dict[str, Any], margin: float, alpha: float, p1: float, p2: float) -> None:
    low, high = sorted((p1, p2))
    assert _n(margin=margin, alpha=alpha, power=low, **c) <= _n(margin=margin, alpha=alpha, power=high, **c)


@settings(max_examples=500, deadline=None)
@given(c=comparisons(), margin=margins, alpha=alphas, power=powers)
def test_power_at_n_needed_reaches_the_target_and_one_fewer_does_not(
    c: dict[str, Any], margin: float, alpha: float, power: float
) -> None:
    s = items_needed(margin=margin, alpha=alpha, power=power, **c, exact=False)
    assume(s.n is not None)
    assert s.n is not None
    at = tost_power(s.n, margin=margin, alpha=alpha, **c)
    assert at >= power and at == s.power_at_n
    if s.n > 1:
        assert tost_power(s.n - 1, margin=margin, alpha=alpha, **c) < power
    assert s.n_closed_form is not None
    if c["p_a"] == c["p_b"]:
        assert s.n == s.n_closed_form  # exact when delta == 0
    else:
        assert s.n <= s.n_closed_form  # issue 15: CSW's closed form (z_{1-beta/2}) is conservative


@settings(max_examples=300, deadline=None)
@given(c=comparisons(), n=st.integers(1, 5000), alpha=alphas, power=powers)
def test_minimum_detectable_margin_is_consistent(c: dict[str, Any], n: int, alpha: float, power: float) -> None:
    m = minimum_detectable_margin(n, alpha=alpha, power=power, **c)
    assert m is not None and m > abs(c["p_a"] - c["p_b"])
    assert tost_power(n, margin=m, alpha=alpha, **c) >= power
    assert tost_power(n, margin=m * (1 - 1e-6), alpha=alpha, **c) < power
    if m < 1.0:  # at that margin, n items are enough
        needed = items_needed(margin=m, alpha=alpha, power=power, **c, exact=False).n
        assert needed is not None and needed <= n


@settings(max_examples=200, deadline=None)
@given(c=comparisons(), margin=margins, alpha=alphas, n1=st.integers(1, 10**6), n2=st.integers(1, 10**6))
def test_power_grows_with_n(c: dict[str, Any], margin: float, alpha: float, n1: int, n2: int) -> None:
    assume(abs(c["p_a"] - c["p_b"]) < margin)  # beyond the margin, power falls towards 0 as n grows
    small, large = sorted((n1, n2))
    assert tost_power(small, margin=margin, alpha=alpha, **c) <= tost_power(large, margin=margin, alpha=alpha, **c)


# --------------------------------------------------------------------------
# Issue 15: exact power and type I error by enumeration; the closed form named correctly


def test_chow_shao_wang_two_sample_equivalence_example() -> None:
    """Chow, Shao & Wang (2008, 2nd ed.) section 4.2, test for equivalence of two proportions:
    p1 = 0.75, p2 = 0.80, margin 0.2, alpha 0.05, power 0.8: n = (z_{0.05} + z_{0.1})^2
    (0.75 x 0.25 + 0.8 x 0.2) / (0.2 - 0.05)^2 = 132.3 -> 133 per group (the one-tail form gave 96)."""
    s = items_needed(margin=0.2, alpha=0.05, power=0.8, p_a=0.75, p_b=0.8, paired=False)
    assert s.n_closed_form == 133
    assert s.n is not None and s.power_at_n is not None and s.power_at_n >= 0.8 and s.test == "miettinen-nurminen"


def test_exact_power_reaches_the_target_where_the_approximation_falls_short() -> None:
    s = items_needed(margin=0.1, alpha=0.05, power=0.8, p_a=0.7, p_b=0.7, correlation=0.5)
    assert s.method == "exact" and s.test == "tango"
    assert s.n is not None and s.n_normal is not None and s.power_at_n is not None and s.power_at_n >= 0.8
    assert s.power_at_n == exact_tost_power(s.n, margin=0.1, alpha=0.05, p_a=0.7, p_b=0.7, correlation=0.5)
    # at the normal approximation's n the exact power of Tango's TOST falls short of 0.8
    assert exact_tost_power(s.n_normal, margin=0.1, alpha=0.05, p_a=0.7, p_b=0.7, correlation=0.5) < 0.8
    assert s.n > s.n_normal and s.to_json()["method"] == "exact"


def test_exact_power_agrees_with_a_direct_sum_on_a_small_trinomial() -> None:
    """n = 30: every (b10, b01) through paired_from_counts, weighted by the trinomial pmf."""
    n, p10, p01, m = 30, 0.12, 0.08, 0.3
    total = 0.0
    for b10 in range(n + 1):
        for b01 in range(n - b10 + 1):
            pmf = math.comb(n, b10) * math.comb(n - b10, b01) * p10**b10 * p01**b01 * (1 - p10 - p01) ** (n - b10 - b01)
            if paired_from_counts(n - b10 - b01, b10, b01, 0, margin=m).verdict == "equivalent":
                total += pmf
    got = paired_rejection(n, p10, p01, margin=m, alpha=0.05)
    assert got.probability == pytest.approx(total, abs=1e-12) and got.mass == pytest.approx(1.0, abs=1e-12)


TYPE_ONE_TOLERANCE = 0.01
"""Tango's and Miettinen-Nurminen's tests are asymptotic: at the margin their exact size exceeds
alpha by up to 0.0053 in this grid (Tango, n 164, p10 0.10, p01 0); we allow alpha + 0.01."""


@pytest.mark.parametrize("n", [20, 50, 164])
def test_exact_type_one_error_at_the_margin(n: int) -> None:
    alpha, m = 0.05, 0.1
    worst = 0.0
    for p10, p01 in ((0.10, 0.0), (0.15, 0.05), (0.25, 0.15), (0.35, 0.25)):
        for a, b in ((p10, p01), (p01, p10)):
            r = paired_rejection(n, a, b, margin=m, alpha=alpha)
            assert r.mass > 1 - 1e-9
            worst = max(worst, r.probability)
    for p in (0.5, 0.7, 0.85):
        for a, b in ((p, p - m), (p - m, p)):
            worst = max(worst, independent_rejection(n, n, a, b, margin=m, alpha=alpha).probability)
    assert worst <= alpha + TYPE_ONE_TOLERANCE, (n, worst)


def test_nan_margin_is_refused() -> None:
    for bad in (math.nan, math.inf, -0.1, 0.0):
        with pytest.raises(ValueError):
            tost_power(10, margin=bad, alpha=0.05, p_a=0.5, p_b=0.5)
        with pytest.raises(ValueError):
            exact_tost_power(10, margin=bad, alpha=0.05, p_a=0.5, p_b=0.5)
        with pytest.raises(ValueError):
            items_needed(margin=bad, alpha=0.05, power=0.8, p_a=0.5, p_b=0.5)
