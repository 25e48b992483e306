"""Pure statistics, a leaf: pass-rate intervals, paired and independent comparisons, power (docs/statistics.md)."""
