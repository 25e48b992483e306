"""Break-even for cheap-first routing: a cascade (cheap system, then strong system) from fixed arms.

The manual: docs/analysis.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from harness.audit.frame import validate_attempts

__all__ = ["ORACLE_NOTE", "BreakEven", "break_even", "sensitivity_grid"]

ORACLE_NOTE = (
    "composed exactly from the fixed arms only because the gate is the hidden test "
    "(oracle gate): an upper bound for any real evaluator; see the noisy-gate sensitivity"
)

_PAIR_KEYS = ("stage", "item", "repeat")


@dataclass(frozen=True)
class BreakEven:
    """One cascade's break-even numbers and its composed (oracle-gate) result.

    Attributes:
        stage: the stage filtered on, or None for every stage in the frame.
        arm: the arm both systems ran.
        cheap: the system tried first.
        strong: the system a rejected answer goes to.
        gate: always "oracle": the hidden test is the gate in the composition.
        note: why the composition is exact (`ORACLE_NOTE`).
        n_pairs: paired attempts (stage, item, repeat) composed.
        n_items: distinct (stage, item).
        q: cheap pass rate.
        b: mean cheap cost per attempt, USD.
        v: gate cost per attempt, USD (the parameter; 0 for the hidden test).
        s: mean strong cost per attempt, USD.
        strong_pass_rate: the strong system's pass rate alone.
        predicted_cost_usd: b + v + (1 - q) s.
        predicted_savings: q - (b + v) / s; None when s is 0.
        break_even_q: (b + v) / s; None when s is 0.
        composed_pass_rate: mean of (cheap passed or strong passed) per pair.
        composed_mean_cost_usd: mean of b_i + v + [cheap failed] s_i per pair.
        composed_total_cost_usd: the sum of the same.
        cost_ratio: composed mean cost / s; None when s is 0.
        composed_cost_per_pass_usd: composed total cost / composed passes; None at 0 passes.
        strong_cost_per_pass_usd: strong total cost / strong passes; None at 0 passes.
    """

    stage: str | None
    arm: str
    cheap: str
    strong: str
    gate: str
    note: str
    n_pairs: int
    n_items: int
    q: float
    b: float
    v: float
    s: float
    strong_pass_rate: float
    predicted_cost_usd: float
    predicted_savings: float | None
    break_even_q: float | None
    composed_pass_rate: float
    composed_mean_cost_usd: float
    composed_total_cost_usd: float
    cost_ratio: float | None
    composed_cost_per_pass_usd: float | None
    strong_cost_per_pass_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-ready)."""
        return dataclasses.asdict(self)


def _paired(
    frame: pl.DataFrame, *, cheap: str, strong: str, arm: str, stage: str | None
) -> pl.DataFrame:
    """One row per (stage, item, repeat) with both systems' pass and cost; refuses unpaired data."""
    validate_attempts(frame)
    if cheap == strong:
        raise ValueError(f"cheap and strong are the same system: {cheap!r}")
    rows = frame.lazy().filter(pl.col("arm") == arm)
    if stage is not None:
        rows = rows.filter(pl.col("stage") == stage)
    keys = list(_PAIR_KEYS)
    sides: list[pl.DataFrame] = []
    for system, tag in ((cheap, "cheap"), (strong, "strong")):
        side = (
            rows.filter(pl.col("system") == system)
            .select(*keys, pl.col("passed"), pl.col("cost_usd"))
            .collect()
        )
        if side.height == 0:
            raise ValueError(f"no attempts for system {system!r} in arm {arm!r}")
        duplicates = side.height - side.select(keys).n_unique()
        if duplicates:
            raise ValueError(
                f"{system!r} has {duplicates} duplicate (stage, item, repeat) attempts"
            )
        unknown = side.get_column("cost_usd").null_count()
        if unknown:
            raise ValueError(
                f"{system!r} has {unknown} attempts of unknown cost; break-even needs every cost"
            )
        sides.append(side.rename({"passed": f"{tag}_passed", "cost_usd": f"{tag}_cost"}))
    joined = sides[0].join(sides[1], on=keys, how="full", coalesce=True)
    unpaired = joined.filter(
        pl.col("cheap_passed").is_null() | pl.col("strong_passed").is_null()
    ).height
    if unpaired:
        raise ValueError(
            f"{unpaired} (stage, item, repeat) attempts of {cheap!r} and {strong!r} are unpaired; "
            "the composition needs both systems on the same items and repeats"
        )
    return joined


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def break_even(
    frame: pl.DataFrame,
    *,
    cheap: str,
    strong: str,
    arm: str,
    stage: str | None = None,
    gate_cost_usd: float = 0.0,
) -> BreakEven:
    """The break-even numbers and the exact oracle-gate composition of one cascade.

    Args:
        frame: the report's scored attempts.
        cheap: the system tried first.
        strong: the system a failed cheap answer goes to.
        arm: the arm both systems ran (the same items and repeats).
        stage: restrict to one stage; None pairs across every stage (the key includes it).
        gate_cost_usd: v, the gate's cost per attempt (0 for the hidden test).

    Returns:
        A `BreakEven`.

    Raises:
        ValueError: on a malformed frame, a missing system, duplicate or unpaired
            attempts, an unknown cost, or a negative gate cost.
    """
    if gate_cost_usd < 0:
        raise ValueError(f"gate_cost_usd must be >= 0, got {gate_cost_usd}")
    pairs = _paired(frame, cheap=cheap, strong=strong, arm=arm, stage=stage)
    v = float(gate_cost_usd)
    cheap_failed = ~pl.col("cheap_passed")
    sums = pairs.select(
        pl.len().alias("n"),
        pl.struct("stage", "item").n_unique().alias("items"),
        pl.col("cheap_passed").sum().alias("cheap_passes"),
        pl.col("strong_passed").sum().alias("strong_passes"),
        pl.col("cheap_cost").sum().alias("cheap_cost"),
        pl.col("strong_cost").sum().alias("strong_cost"),
        (pl.col("cheap_passed") | pl.col("strong_passed")).sum().alias("composed_passes"),
        pl.when(cheap_failed)
        .then(pl.col("strong_cost"))
        .otherwise(0.0)
        .sum()
        .alias("escalated_cost"),
    ).row(0, named=True)
    n = int(sums["n"])
    q = sums["cheap_passes"] / n
    b = sums["cheap_cost"] / n
    s = sums["strong_cost"] / n
    composed_total = sums["cheap_cost"] + v * n + sums["escalated_cost"]
    composed_passes = int(sums["composed_passes"])
    return BreakEven(
        stage=stage,
        arm=arm,
        cheap=cheap,
        strong=strong,
        gate="oracle",
        note=ORACLE_NOTE,
        n_pairs=n,
        n_items=int(sums["items"]),
        q=q,
        b=b,
        v=v,
        s=s,
        strong_pass_rate=sums["strong_passes"] / n,
        predicted_cost_usd=b + v + (1.0 - q) * s,
        predicted_savings=None if s == 0 else q - (b + v) / s,
        break_even_q=_ratio(b + v, s),
        composed_pass_rate=composed_passes / n,
        composed_mean_cost_usd=composed_total / n,
        composed_total_cost_usd=composed_total,
        cost_ratio=_ratio(composed_total / n, s),
        composed_cost_per_pass_usd=_ratio(composed_total, composed_passes),
        strong_cost_per_pass_usd=_ratio(sums["strong_cost"], sums["strong_passes"]),
    )


def sensitivity_grid(
    frame: pl.DataFrame,
    *,
    cheap: str,
    strong: str,
    arm: str,
    stage: str | None = None,
    gate_cost_usd: float = 0.0,
    false_accept: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.3),
    false_reject: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.3),
) -> pl.DataFrame:
    """The expected cascade pass rate and cost under a noisy gate, over a grid of error rates.

    A gate with false-accept rate e_fa keeps a failed cheap answer with probability
    e_fa; with false-reject rate e_fr it sends a passed cheap answer to the strong
    system with probability e_fr, whose answer is then final. Errors are independent
    of the item. For a pair i with cheap pass c_i, strong pass t_i (0/1) and costs
    b_i, s_i, the expectations over the gate are

        E[pass_i] = c_i (1 - e_fr + e_fr t_i) + (1 - c_i)(1 - e_fa) t_i
        E[cost_i] = b_i + v + s_i (c_i e_fr + (1 - c_i)(1 - e_fa))

    Both are linear in the per-pair data, so the means need only five sums. At
    e_fa = e_fr = 0 they equal the oracle composition of `break_even`. Raising e_fa
    lowers (never raises) both the pass rate and the cost; raising e_fr lowers the
    pass rate and raises the cost.

    Args:
        frame, cheap, strong, arm, stage, gate_cost_usd: as for `break_even`.
        false_accept: the e_fa values, each in [0, 1].
        false_reject: the e_fr values, each in [0, 1].

    Returns:
        One row per (e_fa, e_fr): `false_accept`, `false_reject`, `pass_rate`,
        `mean_cost_usd`, `cost_ratio` (mean cost / s; null when s is 0) and
        `cost_per_pass_usd` (null when the expected pass rate is 0).
    """
    for name, grid in (("false_accept", false_accept), ("false_reject", false_reject)):
        bad = [e for e in grid if not 0.0 <= e <= 1.0]
        if bad:
            raise ValueError(f"{name} rates must be in [0, 1], got {bad}")
    if gate_cost_usd < 0:
        raise ValueError(f"gate_cost_usd must be >= 0, got {gate_cost_usd}")
    pairs = _paired(frame, cheap=cheap, strong=strong, arm=arm, stage=stage)
    c = pl.col("cheap_passed").cast(pl.Float64)
    t = pl.col("strong_passed").cast(pl.Float64)
    m = pairs.select(
        c.mean().alias("c"),
        (c * t).mean().alias("ct"),
        ((1.0 - c) * t).mean().alias("ft"),
        pl.col("cheap_cost").mean().alias("b"),
        (c * pl.col("strong_cost")).mean().alias("cs"),
        ((1.0 - c) * pl.col("strong_cost")).mean().alias("fs"),
    ).row(0, named=True)
    s = m["cs"] + m["fs"]
    rates = pl.DataFrame(
        {
            "false_accept": [float(fa) for fa in false_accept for _ in false_reject],
            "false_reject": [float(fr) for _ in false_accept for fr in false_reject],
        },
        schema={"false_accept": pl.Float64, "false_reject": pl.Float64},
    )
    fa, fr = pl.col("false_accept"), pl.col("false_reject")
    return rates.with_columns(
        (m["c"] * (1.0 - fr) + fr * m["ct"] + (1.0 - fa) * m["ft"]).alias("pass_rate"),
        (m["b"] + float(gate_cost_usd) + fr * m["cs"] + (1.0 - fa) * m["fs"]).alias(
            "mean_cost_usd"
        ),
    ).with_columns(
        (pl.col("mean_cost_usd") / s if s else pl.lit(None, dtype=pl.Float64)).alias("cost_ratio"),
        pl.when(pl.col("pass_rate") > 0)
        .then(pl.col("mean_cost_usd") / pl.col("pass_rate"))
        .otherwise(None)
        .alias("cost_per_pass_usd"),
    )
