"""The q table: per stage, system and arm, pass rates with intervals, cost, latency and tokens.

The input is the report's frame of scored attempts (one row per attempt). Every
per-row computation stays in polars expressions (one `group_by().agg()`); only
the interval functions run in Python, once per group on the aggregated counts,
because there are few groups and the exact intervals need scipy.

The manual: docs/analysis.md.
"""

from __future__ import annotations

import polars as pl

from harness.audit.frame import TOKEN_COLUMNS, validate_attempts
from harness.stats.proportions import clopper_pearson_interval, wilson_interval

__all__ = ["GROUP_KEYS", "q_table"]

# The q table's rows; `study` is a key too so a frame holding two studies never mixes them.
GROUP_KEYS: tuple[str, ...] = ("study", "stage", "system", "arm")


def q_table(frame: pl.DataFrame, *, alpha: float = 0.05) -> pl.DataFrame:
    """The q table of a scored-attempts frame, one row per (study, stage, system, arm).

    Columns, besides the keys: `n` attempts, `passes` (hidden test passed),
    `pass_rate`, `wilson_low/high` and `cp_low/high` (two-sided 1-alpha intervals from
    `harness.stats.proportions`), `cost_usd` (the total; null when any attempt's
    cost is unknown), `cost_unknown` (attempts with unknown cost), `cost_known_usd`
    (the sum over known costs), `cost_per_pass_usd` (total cost / passes; null when
    the total is unknown or there are no passes), `latency_median_s`,
    `latency_p95_s` (linear interpolation between order statistics, numpy's default)
    and the sum of each token column.

    Args:
        frame: the report's scored attempts (see `validate_attempts`).
        alpha: one minus the intervals' confidence level.

    Returns:
        The table sorted by its keys.

    Raises:
        ValueError: when `frame` is not a scored-attempts frame or alpha is not in (0, 1).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    validate_attempts(frame)
    keys = list(GROUP_KEYS)
    counts = (
        frame.lazy()
        .group_by(keys)
        .agg(
            pl.len().alias("n"),
            pl.col("passed").sum().cast(pl.Int64).alias("passes"),
            pl.col("cost_usd").null_count().cast(pl.Int64).alias("cost_unknown"),
            pl.col("cost_usd").sum().alias("cost_known_usd"),
            pl.col("latency_s").cast(pl.Float64).median().alias("latency_median_s"),
            pl.col("latency_s")
            .cast(pl.Float64)
            .quantile(0.95, interpolation="linear")
            .alias("latency_p95_s"),
            *(pl.col(name).cast(pl.Int64).sum().alias(name) for name in TOKEN_COLUMNS),
        )
        .with_columns(
            pl.col("n").cast(pl.Int64),
            (pl.col("passes") / pl.col("n")).alias("pass_rate"),
            pl.when(pl.col("cost_unknown") == 0)
            .then(pl.col("cost_known_usd"))
            .otherwise(None)
            .alias("cost_usd"),
        )
        .with_columns(
            pl.when(pl.col("passes") > 0)
            .then(pl.col("cost_usd") / pl.col("passes"))
            .otherwise(None)
            .alias("cost_per_pass_usd"),
        )
        .sort(keys)
        .collect()
    )
    # Few groups: the exact intervals are computed per group on the counts, in Python.
    pairs = list(
        zip(counts.get_column("passes").to_list(), counts.get_column("n").to_list(), strict=True)
    )
    wilson = [wilson_interval(passes, n, alpha) for passes, n in pairs]
    exact = [clopper_pearson_interval(passes, n, alpha) for passes, n in pairs]
    intervals = pl.DataFrame(
        {
            "wilson_low": [i.low for i in wilson],
            "wilson_high": [i.high for i in wilson],
            "cp_low": [i.low for i in exact],
            "cp_high": [i.high for i in exact],
        },
        schema={name: pl.Float64 for name in ("wilson_low", "wilson_high", "cp_low", "cp_high")},
    )
    return pl.concat([counts, intervals], how="horizontal").select(
        *keys,
        "n",
        "passes",
        "pass_rate",
        "wilson_low",
        "wilson_high",
        "cp_low",
        "cp_high",
        "cost_usd",
        "cost_unknown",
        "cost_known_usd",
        "cost_per_pass_usd",
        "latency_median_s",
        "latency_p95_s",
        *TOKEN_COLUMNS,
    )
