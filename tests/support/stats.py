"""Hypothesis strategies and tolerances shared by the statistics tests."""

from __future__ import annotations

from hypothesis import strategies as st

TOL = 1e-9
ALPHAS = st.sampled_from([0.01, 0.05, 0.1])


@st.composite
def counts(draw: st.DrawFn) -> tuple[int, int]:
    n = draw(st.integers(1, 500))
    return draw(st.integers(0, n)), n
