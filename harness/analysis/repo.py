"""Repository-task studies: cost per hidden-test pass with every request's spend, paired comparisons between
arms and systems on the same items, break-even with the gate's cost (measured or assumed, and saying which),
and pass rates by task feature (mutation kind, library, module).

`repo_tables` is pure (frames in, frames out); `harness.analysis.study.analyze_study` reads its inputs (late
costs, requests per attempt, the sealed suite's item metadata) from the validated files.

The manual: docs/analysis.md ("Repository-task studies").
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from harness.analysis.breakeven import break_even
from harness.analysis.frame_tables import frame_of, paired_row, stage_order
from harness.analysis.tables import q_table
from harness.audit.frame import validate_attempts
from harness.prereg.design import Comparison, Design
from harness.stats.proportions import wilson_interval

__all__ = [
    "ASSUMED_GATE_COST_USD",
    "FEATURES",
    "FEATURE_COLUMNS",
    "LATE_COLUMNS",
    "REPO_BREAKEVEN_SCHEMA",
    "REPO_FEATURES_SCHEMA",
    "REPO_PAIRED_SCHEMA",
    "REQUEST_COLUMNS",
    "RepoTables",
    "repo_tables",
    "with_late_costs",
]

_F, _I, _S = pl.Float64, pl.Int64, pl.String

ASSUMED_GATE_COST_USD: Final = 0.0
"""v when no record measured it: the visible tests run in the sandbox and send no model request."""
FEATURES: Final = ("mutation_kind", "library", "module")
"""The item metadata the features table breaks pass rates down by (`harness.evals.mutants`' packet metadata)."""
LATE_COLUMNS: Final[dict[str, Any]] = {"stage": _S, "run_id": _S, "cost_usd": _F}
"""One row per `late_cost` event of a stage's run log: the run it belongs to, its cost (null: unknown)."""
REQUEST_COLUMNS: Final[dict[str, Any]] = {"stage": _S, "run_id": _S, "requests": _I}
"""Per run: the model requests its attempts made (the sum of each attempt's `work.exchanges`)."""
FEATURE_COLUMNS: Final[dict[str, Any]] = {"item": _S, **{f: _S for f in FEATURES}}
"""Per item: its features from the sealed suite's packet metadata (null when the item has none)."""
REPO_PAIRED_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "between": _S, "a": _S, "b": _S, "arm": _S, "system": _S, "n": _I, "n_items": _I,
    "n11": _I, "b10": _I, "b01": _I, "n00": _I, "p_a": _F, "p_b": _F, "diff": _F, "ci_low": _F, "ci_high": _F,
    "ci_method": _S, "mcnemar_p": _F, "cost_a_usd": _F, "cost_b_usd": _F, "cost_diff_usd": _F,
    "registered_margin": _F, "verdict": _S, "note": _S,
}
REPO_BREAKEVEN_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "arm": _S, "cheap": _S, "strong": _S, "n_pairs": _I, "q": _F, "b": _F, "v": _F, "v_source": _S,
    "v_s": _F, "s": _F, "break_even_q": _F, "predicted_savings": _F, "strong_pass_rate": _F, "composed_pass_rate": _F,
    "composed_mean_cost_usd": _F, "cost_ratio": _F, "composed_cost_per_pass_usd": _F,
    "strong_cost_per_pass_usd": _F, "note": _S,
}
REPO_FEATURES_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "system": _S, "arm": _S, "feature": _S, "value": _S, "n": _I, "passes": _I, "pass_rate": _F,
    "wilson_low": _F, "wilson_high": _F, "cost_usd": _F, "cost_per_pass_usd": _F,
}
_PAIR_KEYS: Final = ["item", "repeat"]
_NO_FEATURE: Final = "(not recorded)"


@dataclass(frozen=True)
class RepoTables:
    """The repository-task tables (docs/analysis.md, "Repository-task studies").

    Attributes:
        q: the q table (`q_table`) on every cell's full spend (its attempts and its late costs), with
            `requests`, `late_cost_usd` and `late_unknown` per (stage, system, arm).
        paired: every pair of systems on each arm, and every pair of arms on each system, on the same
            (item, repeat) (`REPO_PAIRED_SCHEMA`).
        breakeven: each (cheaper, dearer) cascade per stage and arm with v and where it came from
            (`REPO_BREAKEVEN_SCHEMA`).
        features: pass rate with its 1 - alpha Wilson interval, spend and cost per pass per (stage, system, arm)
            and value of each feature (`REPO_FEATURES_SCHEMA`).
    """

    q: pl.DataFrame
    paired: pl.DataFrame
    breakeven: pl.DataFrame
    features: pl.DataFrame

    def tables(self) -> dict[str, pl.DataFrame]:
        """name -> frame: repo_q, repo_paired, repo_breakeven, repo_features."""
        return {"repo_q": self.q, "repo_paired": self.paired, "repo_breakeven": self.breakeven,
                "repo_features": self.features}


def with_late_costs(attempts: pl.DataFrame, late: pl.DataFrame) -> pl.DataFrame:
    """The scored-attempts frame with each cell's late costs added to `cost_usd` (null when any is unknown)."""
    per_run = (late.group_by("stage", "run_id")
               .agg(pl.col("cost_usd").sum().alias("_late"), pl.col("cost_usd").null_count().alias("_unknown")))
    joined = attempts.join(per_run, on=["stage", "run_id"], how="left")
    cost = (pl.when(pl.col("_unknown").fill_null(0) > 0).then(None)
            .otherwise(pl.col("cost_usd") + pl.col("_late").fill_null(0.0)))
    return joined.with_columns(cost.cast(_F).alias("cost_usd")).drop("_late", "_unknown")


def _q(attempts: pl.DataFrame, full: pl.DataFrame, late: pl.DataFrame, requests: pl.DataFrame,
       alpha: float) -> pl.DataFrame:
    keys = ["study", "stage", "system", "arm"]
    cells = attempts.select(*keys, "run_id")
    extra = (cells.join(requests, on=["stage", "run_id"], how="left")
             .join(late.group_by("stage", "run_id").agg(pl.col("cost_usd").sum().alias("late"),
                                                        pl.col("cost_usd").null_count().alias("unknown"),
                                                        pl.len().alias("events")),
                   on=["stage", "run_id"], how="left")
             .group_by(keys)
             .agg(pl.col("requests").sum().cast(_I).alias("requests"),
                  pl.col("late").sum().alias("late_known_usd"),
                  pl.col("unknown").fill_null(0).sum().cast(_I).alias("late_unknown"),
                  pl.col("events").fill_null(0).sum().cast(_I).alias("late_costs")))
    table = q_table(full, alpha=alpha).join(extra, on=keys, how="left")
    return table.with_columns(
        (pl.col("requests") / pl.col("n")).alias("requests_per_attempt"),
        (pl.col("cost_usd") / pl.col("n")).alias("cost_per_attempt_usd"),
        pl.when(pl.col("late_unknown") > 0).then(None).otherwise(pl.col("late_known_usd")).alias("late_cost_usd"),
    ).drop("late_known_usd")


def _registered(design: Design, a: str, b: str, arm: str) -> Comparison | None:
    return next((c for c in design.comparisons if (c.a, c.b, c.arm) == (a, b, arm)), None)


def _pair(cells: pl.DataFrame, label: str, a: str, b: str, arm: str, design: Design,
          registered: Comparison | None) -> dict[str, Any]:
    """One paired row: `cells` (one stage) with the compared side in column `label`."""
    sides = cells.select(pl.col(label).alias("system"), *_PAIR_KEYS, "passed", "cost_usd")
    margin = registered.margin if registered is not None else 0.5  # the interval and counts do not use it
    c = Comparison(a, b, arm, margin, 0.5, 0.5, 0.0)
    row = paired_row(sides.select("system", *_PAIR_KEYS, "passed"), c, design)
    out = {k: row.get(k) for k in ("n", "n_items", "n11", "b10", "b01", "n00", "p_a", "p_b", "diff", "ci_low",
                                   "ci_high", "ci_method", "mcnemar_p", "note")}
    if registered is not None:
        out["registered_margin"], out["verdict"] = registered.margin, row.get("verdict")
    costs = (sides.filter(pl.col("system") == a).select(*_PAIR_KEYS, pl.col("cost_usd").alias("ca"))
             .join(sides.filter(pl.col("system") == b).select(*_PAIR_KEYS, pl.col("cost_usd").alias("cb")),
                   on=_PAIR_KEYS, how="inner"))
    if costs.height and costs.select(pl.col("ca").null_count() + pl.col("cb").null_count()).item() == 0:
        ca, cb = costs.get_column("ca").mean(), costs.get_column("cb").mean()
        assert isinstance(ca, float) and isinstance(cb, float)
        out.update(cost_a_usd=ca, cost_b_usd=cb, cost_diff_usd=ca - cb)
    return out


def _paired(by_stage: Mapping[str, pl.DataFrame], design: Design) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    slots = [s.slot for s in design.systems]
    arms = [a.id for a in design.arms]
    for stage, cells in by_stage.items():
        ran_systems = [s for s in slots if s in set(cells.get_column("system").to_list())]
        ran_arms = [a for a in arms if a in set(cells.get_column("arm").to_list())]
        for arm in ran_arms:
            mine = cells.filter(pl.col("arm") == arm)
            for a, b in itertools.combinations(ran_systems, 2):
                rows.append({"stage": stage, "between": "systems", "a": a, "b": b, "arm": arm,
                             **_pair(mine, "system", a, b, arm, design, _registered(design, a, b, arm))})
        for system in ran_systems:
            mine = cells.filter(pl.col("system") == system)
            for a, b in itertools.combinations(ran_arms, 2):
                rows.append({"stage": stage, "between": "arms", "a": a, "b": b, "system": system,
                             **_pair(mine, "arm", a, b, "", design, None)})
    return frame_of(rows, REPO_PAIRED_SCHEMA)


def _breakeven(by_stage: Mapping[str, pl.DataFrame], design: Design, gate_costs: Mapping[str, float],
               gate_seconds: Mapping[str, float]) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    slots = [s.slot for s in design.systems]
    for stage, cells in by_stage.items():
        for arm in [a.id for a in design.arms]:
            mine = cells.filter(pl.col("arm") == arm)
            means = dict(mine.group_by("system").agg(pl.col("cost_usd").mean()).iter_rows())
            ran = sorted((s for s in slots if s in means),
                         key=lambda s: (means[s] is None, means[s] if means[s] is not None else 0.0))
            measured = gate_costs.get(stage)
            v = ASSUMED_GATE_COST_USD if measured is None else measured
            source = ("assumed" if measured is None else "measured")
            for i, cheap in enumerate(ran):
                for strong in ran[i + 1:]:
                    base = {"stage": stage, "arm": arm, "cheap": cheap, "strong": strong, "v": v, "v_source": source,
                            "v_s": gate_seconds.get(stage) if measured is not None else None}
                    pair = mine.filter(pl.col("system").is_in([cheap, strong]))
                    keys = (pair.filter(pl.col("system") == cheap).select(_PAIR_KEYS)
                            .join(pair.filter(pl.col("system") == strong).select(_PAIR_KEYS), on=_PAIR_KEYS))
                    paired = pair.join(keys, on=_PAIR_KEYS, how="semi")
                    try:
                        r = break_even(paired, cheap=cheap, strong=strong, arm=arm, stage=stage, gate_cost_usd=v)
                    except ValueError as exc:
                        rows.append({**base, "n_pairs": keys.height, "note": f"not composed: {exc}"})
                        continue
                    why = (f"v measured ${v:g}: the visible-test gate's dollars per live cascade attempt in the "
                           "stage's records (its seconds in v_s, not priced)" if measured is not None
                           else f"v assumed ${v:g}: no record measured the gate's cost (the visible tests send no "
                                "model request)")
                    rows.append({**base, **{k: v_ for k, v_ in r.to_dict().items() if k in REPO_BREAKEVEN_SCHEMA
                                            and k not in base and k != "note"},
                                 "note": f"{why}; composed with the hidden test as the gate (an upper bound)"})
    return frame_of(rows, REPO_BREAKEVEN_SCHEMA)


def _features(full: pl.DataFrame, features: pl.DataFrame, alpha: float) -> pl.DataFrame:
    keys = ["stage", "system", "arm"]
    cells = full.select(*keys, pl.col("item").cast(_S), "passed", "cost_usd").join(features, on="item", how="left")
    parts = [cells.select(*keys, pl.lit(f).alias("feature"), pl.col(f).fill_null(_NO_FEATURE).alias("value"),
                          "passed", "cost_usd") for f in FEATURES]
    grouped = (pl.concat(parts, how="vertical").group_by(*keys, "feature", "value")
               .agg(pl.len().cast(_I).alias("n"), pl.col("passed").sum().cast(_I).alias("passes"),
                    pl.col("cost_usd").sum().alias("known"), pl.col("cost_usd").null_count().alias("unknown"))
               .sort(*keys, "feature", "value"))
    rows = []
    for r in grouped.iter_rows(named=True):
        w = wilson_interval(r["passes"], r["n"], alpha)
        cost = None if r["unknown"] else r["known"]
        rows.append({**{k: r[k] for k in (*keys, "feature", "value", "n", "passes")},
                     "pass_rate": r["passes"] / r["n"], "wilson_low": w.low, "wilson_high": w.high, "cost_usd": cost,
                     "cost_per_pass_usd": cost / r["passes"] if cost is not None and r["passes"] else None})
    return frame_of(rows, REPO_FEATURES_SCHEMA)


def repo_tables(attempts: pl.DataFrame, design: Design, *, late: pl.DataFrame | None = None,
                requests: pl.DataFrame | None = None, features: pl.DataFrame | None = None,
                gate_costs: Mapping[str, float] | None = None, gate_seconds: Mapping[str, float] | None = None,
                stages: Sequence[str] | None = None) -> RepoTables:
    """The repository-task tables from the report's scored attempts (no I/O).

    Args:
        attempts: the report's scored attempts (one row per standing cell; `cost_usd` its attempts' spend).
        design: the registered design (systems, arms, comparisons, alpha).
        late: the stages' late costs (`LATE_COLUMNS`), added to their cells' spend.
        requests: the model requests per run (`REQUEST_COLUMNS`).
        features: each item's features (`FEATURE_COLUMNS`).
        gate_costs: stage -> the gate's mean cost per attempt its records measured (the visible-test gate of
            its live cascade arms, the same gate for every arm); a stage without one uses
            `ASSUMED_GATE_COST_USD` and says "assumed" (`harness.analysis.cascade.gate_costs` measures it).
        gate_seconds: stage -> the gate's mean seconds per attempt, shown as `v_s` where v is measured.
        stages: the stages, in design order (default: those in `attempts`).

    Raises:
        ValueError: a frame that is not a scored-attempts frame, or a stage the design does not run.
    """
    validate_attempts(attempts)
    attempts = attempts.with_columns(pl.col("item").cast(_S))
    late = pl.DataFrame(schema=LATE_COLUMNS) if late is None else late.cast(LATE_COLUMNS)  # type: ignore[arg-type]
    requests = pl.DataFrame(schema=REQUEST_COLUMNS) if requests is None else requests.cast(REQUEST_COLUMNS)  # type: ignore[arg-type]
    features = pl.DataFrame(schema=FEATURE_COLUMNS) if features is None else features.cast(FEATURE_COLUMNS)  # type: ignore[arg-type]
    full = with_late_costs(attempts, late)
    stage_ids = stage_order(design, list(stages) if stages is not None else
                            attempts.get_column("stage").unique().to_list())
    by_stage = {s: full.filter(pl.col("stage") == s) for s in stage_ids}
    return RepoTables(q=_q(attempts, full, late, requests, design.alpha), paired=_paired(by_stage, design),
                      breakeven=_breakeven(by_stage, design, gate_costs or {}, gate_seconds or {}),
                      features=_features(full, features, design.alpha))
