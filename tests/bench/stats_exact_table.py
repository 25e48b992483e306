"""Print the exact type I error and power of the registered TOSTs (issue 15), by enumeration.

    .venv/bin/python -m tests.bench.stats_exact_table

Type I error: P("equivalent") with the true difference at the margin (paired: Tango's TOST over
the trinomial of discordant pairs; independent: Miettinen-Nurminen over two binomials, n per
system). Power: at the n `items_needed` returns, the exact power beside the normal approximation.
The manual: docs/statistics.md.
"""

from __future__ import annotations

from harness.stats.power import (
    exact_tost_power,
    independent_rejection,
    items_needed,
    paired_rejection,
)

ALPHA, MARGIN = 0.05, 0.1
PAIRED_CELLS = ((0.10, 0.0), (0.15, 0.05), (0.25, 0.15), (0.35, 0.25))
INDEPENDENT_RATES = (0.5, 0.7, 0.85)
DESIGNS = ((0.7, 0.7, 0.5), (0.8, 0.8, 0.3), (0.6, 0.65, 0.5), (0.85, 0.8, 0.4), (0.5, 0.5, 0.0))


def main() -> None:
    print(f"exact type I error at the margin (alpha {ALPHA}, margin {MARGIN}; both signs, the larger)")
    print(f"{'test':22} {'n':>5} {'cells':>22} {'type I':>8}")
    for n in (20, 50, 164):
        for p10, p01 in PAIRED_CELLS:
            e = max(paired_rejection(n, p10, p01, margin=MARGIN, alpha=ALPHA).probability,
                    paired_rejection(n, p01, p10, margin=MARGIN, alpha=ALPHA).probability)
            print(f"{'paired tango':22} {n:5d} {f'p10 {p10:.2f} p01 {p01:.2f}':>22} {e:8.4f}")
        for p in INDEPENDENT_RATES:
            e = max(independent_rejection(n, n, p, p - MARGIN, margin=MARGIN, alpha=ALPHA).probability,
                    independent_rejection(n, n, p - MARGIN, p, margin=MARGIN, alpha=ALPHA).probability)
            print(f"{'independent MN':22} {n:5d} {f'p_a {p:.2f} p_b {p - MARGIN:.2f}':>22} {e:8.4f}")
    print()
    print("power at the items needed (target 0.80): exact (chosen) and the normal approximation")
    print("n: items_needed (exact); exact: its exact power; n_norm: the normal approximation's n; "
          "exact@n_norm: the exact power there; normal@n: the approximation's power at n; CSW: the closed form")
    print(f"{'design':8} {'p_a':>5} {'p_b':>5} {'rho':>5} {'n':>6} {'exact':>7} {'n_norm':>7} {'exact@n_norm':>12} "
          f"{'normal@n':>8} {'CSW':>6}")
    for paired in (True, False):
        for pa, pb, rho in DESIGNS:
            s = items_needed(margin=MARGIN, alpha=ALPHA, power=0.8, p_a=pa, p_b=pb, correlation=rho, paired=paired)
            assert s.n is not None and s.n_normal is not None and s.power_at_n is not None
            exact_at_normal = exact_tost_power(s.n_normal, margin=MARGIN, alpha=ALPHA, p_a=pa, p_b=pb,
                                               correlation=rho, paired=paired)
            print(f"{'paired' if paired else 'indep':8} {pa:5.2f} {pb:5.2f} {rho if paired else 0:5.2f} {s.n:6d} "
                  f"{s.power_at_n:7.4f} {s.n_normal:7d} {exact_at_normal:12.4f} {s.power_at_n_normal or 0:8.4f} "
                  f"{s.n_closed_form:6d}")


if __name__ == "__main__":
    main()
