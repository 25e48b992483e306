"""Statistics (harness.stats.proportions) against statsmodels and by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from statsmodels.stats.proportion import proportion_confint

from harness.stats.proportions import clopper_pearson_interval, wilson_interval
from tests.support.stats import ALPHAS, TOL, counts

# -- proportions ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(counts(), ALPHAS)
def test_wilson_matches_statsmodels(pn: tuple[int, int], alpha: float) -> None:
    passes, n = pn
    got = wilson_interval(passes, n, alpha)
    lo, hi = proportion_confint(passes, n, alpha=alpha, method="wilson")
    assert got.low == pytest.approx(lo, abs=TOL)
    assert got.high == pytest.approx(hi, abs=TOL)
    assert 0.0 <= got.low <= got.estimate <= got.high <= 1.0


@settings(max_examples=300, deadline=None)
@given(counts(), ALPHAS)
def test_clopper_pearson_matches_statsmodels(pn: tuple[int, int], alpha: float) -> None:
    passes, n = pn
    got = clopper_pearson_interval(passes, n, alpha)
    lo, hi = proportion_confint(passes, n, alpha=alpha, method="beta")
    assert got.low == pytest.approx(lo, abs=TOL)
    assert got.high == pytest.approx(hi, abs=TOL)


def test_interval_edges() -> None:
    for f in (wilson_interval, clopper_pearson_interval):
        assert f(0, 10, 0.05).low == 0.0
        assert f(10, 10, 0.05).high == 1.0
        assert 0.0 < f(0, 10, 0.05).high < 1.0
        assert 0.0 < f(10, 10, 0.05).low < 1.0
    # Clopper-Pearson at x = 0: high = 1 - (alpha/2)^(1/n)
    assert clopper_pearson_interval(0, 10, 0.05).high == pytest.approx(1 - 0.025**0.1, abs=TOL)


@pytest.mark.parametrize(
    ("passes", "n", "alpha"),
    [
        (0, 0, 0.05),
        (1, -1, 0.05),
        (-1, 5, 0.05),
        (6, 5, 0.05),
        (1, 5, 0.0),
        (1, 5, 1.0),
        (True, 5, 0.05),
    ],
)
def test_intervals_refuse_bad_input(passes: int, n: int, alpha: float) -> None:
    for f in (wilson_interval, clopper_pearson_interval):
        with pytest.raises(ValueError):
            f(passes, n, alpha)
