"""Statistics for the analysis notebooks (see DESIGN.md, "Statistics").

- ``proportions``: Wilson and Clopper-Pearson intervals for a pass rate.
- ``paired``: paired comparisons of two systems on the same items (difference,
  item-clustered standard error, 1-2 alpha interval, TOST by the Liu et al.
  (2002) Wald and Tango (1998) score methods, McNemar's exact test, verdict)
  and the independent-sample Wald TOST for two proportions.
- ``tables``: the q table per stage, system and arm from a polars frame of
  scored attempts (vectorised: a million rows in well under a second).
- ``breakeven``: cheap-first routing: predicted and composed cascade cost and
  pass rate with the hidden test as the gate, and the sensitivity to a noisy gate.

Everything here is a pure function of counts or outcomes returning frozen
dataclasses; results agree with statsmodels to 1e-9 where it implements the
same method (tests/test_analysis_stats.py).
"""
