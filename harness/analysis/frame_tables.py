"""The pure part of a study's analysis: every computed table from a scored-attempts frame and the design.

`analyze_frame` computes the q table, the comparisons, the break-even cascades with
their sensitivity grid and the power table, with no I/O; the tables are described in
`harness.analysis.study`, which adds validation and provenance from the files.

The manual: docs/analysis.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from harness.analysis.breakeven import break_even, sensitivity_grid
from harness.analysis.tables import q_table
from harness.audit.frame import validate_attempts
from harness.prereg.design import Comparison, Design, Stage
from harness.prereg.plan import FULL_STAGE, MATRIX_STAGE
from harness.stats.paired import binomial_design_effect, independent_tost, paired_from_counts
from harness.stats.power import (
    EXACT_MAX_ITEMS,
    exact_tost_power,
    items_needed,
    minimum_detectable_margin,
    tost_power,
)

__all__ = [
    "BREAKEVEN_SCHEMA",
    "COMPARISON_SCHEMA",
    "EXHAUSTED_COLUMNS",
    "POWER_SCHEMA",
    "SENSITIVITY_SCHEMA",
    "FrameTables",
    "analyze_frame",
    "frame_of",
    "paired_row",
    "stage_order",
]

_F, _I, _S = pl.Float64, pl.Int64, pl.String

COMPARISON_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "a": _S, "b": _S, "arm": _S, "margin": _F, "alpha": _F, "n": _I, "n_items": _I,
    "b10": _I, "b01": _I, "p_a": _F, "p_b": _F, "diff": _F, "se": _F, "se_method": _S,
    "ci_low": _F, "ci_high": _F, "wald_p": _F, "tango_p": _F, "mcnemar_p": _F, "method": _S, "verdict": _S,
    # beyond the contract's columns
    "test": _S, "n11": _I, "n00": _I, "n_a": _I, "n_b": _I, "unpaired": _I, "dropped_exhausted": _I,
    "design_effect": _F, "ci_method": _S, "p": _F, "wald_ci_low": _F, "wald_ci_high": _F,
    "wald_p_lower": _F, "wald_p_upper": _F, "tango_p_lower": _F, "tango_p_upper": _F,
    "design_effect_a": _F, "design_effect_b": _F, "note": _S,
}
BREAKEVEN_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "arm": _S, "cheap": _S, "strong": _S, "gate": _S, "note": _S, "n_pairs": _I, "n_items": _I,
    "q": _F, "b": _F, "v": _F, "s": _F, "strong_pass_rate": _F, "predicted_cost_usd": _F,
    "predicted_savings": _F, "break_even_q": _F, "composed_pass_rate": _F, "composed_mean_cost_usd": _F,
    "composed_total_cost_usd": _F, "cost_ratio": _F, "composed_cost_per_pass_usd": _F,
    "strong_cost_per_pass_usd": _F, "unpaired": _I,
}
SENSITIVITY_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "arm": _S, "cheap": _S, "strong": _S, "false_accept": _F, "false_reject": _F,
    "pass_rate": _F, "mean_cost_usd": _F, "cost_ratio": _F, "cost_per_pass_usd": _F,
}
POWER_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "a": _S, "b": _S, "arm": _S, "test": _S, "margin": _F, "alpha": _F, "power": _F,
    "expected_a": _F, "expected_b": _F, "correlation": _F, "items": _I, "repeats": _I,
    "items_registered": _I, "power_at_n": _F, "items_needed": _I, "items_needed_closed_form": _I,
    "reaches": pl.Boolean, "minimum_detectable_margin": _F, "note": _S,
    "power_at_n_normal": _F, "items_needed_normal": _I, "power_method": _S,
}
_PAIR_KEYS: Final = ("item", "repeat")
_CELL_KEYS: Final = ("stage", "system", "arm", "item", "repeat")


@dataclass(frozen=True)
class FrameTables:
    """The tables computed from a scored-attempts frame and the design (see the module docstring)."""

    q: pl.DataFrame
    comparisons: pl.DataFrame
    breakeven: pl.DataFrame
    sensitivity: pl.DataFrame
    power: pl.DataFrame


def frame_of(rows: list[dict[str, Any]], schema: dict[str, Any]) -> pl.DataFrame:
    """`rows` as a frame of exactly `schema`'s columns (a missing key is null); empty rows keep the schema."""
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame([[row.get(k) for k in schema] for row in rows], schema=schema, orient="row")


# --------------------------------------------------------------------------
# Stages


def _stage_shape(design: Design, stage_id: str) -> Stage:
    """What a stage runs: a registered stage, or the `matrix` / `full` scope's stage."""
    every_system, every_arm = tuple(s.slot for s in design.systems), tuple(a.id for a in design.arms)
    if stage_id == MATRIX_STAGE:
        return Stage(MATRIX_STAGE, every_system, every_arm, design.draw_items, 1)
    if stage_id == FULL_STAGE:
        return Stage(FULL_STAGE, every_system, every_arm, design.draw_items, design.run.full_repeats)
    found = next((s for s in design.stages if s.id == stage_id), None)
    if found is None:
        raise ValueError(f"stage {stage_id!r} is not registered in the design "
                         f"({', '.join(s.id for s in design.stages)}, {MATRIX_STAGE}, {FULL_STAGE})")
    return found


def stage_order(design: Design, stage_ids: Sequence[str]) -> list[str]:
    """`stage_ids` in design order (refusing a stage the design does not run)."""
    """The stages in design order (then `matrix`, `full`); a stage the design cannot run is a ValueError."""
    order = [s.id for s in design.stages] + [MATRIX_STAGE, FULL_STAGE]
    for stage_id in stage_ids:
        _stage_shape(design, stage_id)
    return sorted(dict.fromkeys(stage_ids), key=order.index)


def _systems_order(design: Design, shape: Stage) -> list[str]:
    return [s.slot for s in design.systems if s.slot in shape.systems]


def _missing(shape: Stage, c: Comparison) -> str | None:
    absent = [f"system {x}" for x in (c.a, c.b) if x not in shape.systems]
    if c.arm not in shape.arms:
        absent.append(f"arm {c.arm}")
    return f"stage {shape.id} does not run {' or '.join(absent)}" if absent else None


# --------------------------------------------------------------------------
# Comparisons


def _side(cells: pl.DataFrame, system: str, name: str) -> pl.DataFrame:
    return cells.filter(pl.col("system") == system).select(*_PAIR_KEYS, pl.col("passed").alias(name))


EXHAUSTED_COLUMNS: Final[dict[str, Any]] = {"stage": _S, "system": _S, "arm": _S, "item": _S, "repeat": _I}
"""The exhausted cells (`harness.audit.report`: standing on a transport failure, never scored) that
`analyze_frame` counts as dropped from the comparisons."""


def _dropped(gone: pl.DataFrame, a: str, b: str, *, paired: bool) -> tuple[int, str | None]:
    """How many pairs (paired test: (item, repeat) with an exhausted cell of either side) or cells
    (independent) of systems a and b exhausted cells took out, and why."""
    mine = gone.filter(pl.col("system").is_in([a, b]))
    if not mine.height:
        return 0, None
    n = mine.select(_PAIR_KEYS).n_unique() if paired else mine.height
    return n, (f"{n} {'pairs' if paired else 'cells'} dropped: exhausted by transport failures "
               "(an outage, not the model; never scored)")


def _with_note(row: dict[str, Any], note: str | None) -> dict[str, Any]:
    if note is None:
        return row
    return {**row, "note": note if not row.get("note") else f"{note}; {row['note']}"}


def paired_row(cells: pl.DataFrame, c: Comparison, design: Design) -> dict[str, Any]:
    """One paired comparison's row (`COMPARISON_SCHEMA`'s fields) of systems `c.a` and `c.b` in `cells` (one
    stage and arm; columns system, item, repeat, passed), item-clustered as the design registers."""
    side_a, side_b = _side(cells, c.a, "x_a"), _side(cells, c.b, "x_b")
    pairs = side_a.join(side_b, on=list(_PAIR_KEYS), how="inner")
    n = pairs.height
    row: dict[str, Any] = {"n_a": side_a.height, "n_b": side_b.height,
                           "unpaired": side_a.height + side_b.height - 2 * n}
    if n == 0:
        return {**row, "n": 0, "note": f"no paired standing cells: {c.a} has {side_a.height} and {c.b} has "
                                       f"{side_b.height} standing cells on arm {c.arm}, none on the same (item, repeat)"}
    x_a, x_b = pl.col("x_a"), pl.col("x_b")
    counts = pairs.select(
        (x_a & x_b).sum().alias("n11"), (x_a & ~x_b).sum().alias("b10"), (~x_a & x_b).sum().alias("b01"),
        pl.col("item").n_unique().alias("n_items"),
    ).row(0, named=True)
    n11, b10, b01, n_items = (int(counts[k]) for k in ("n11", "b10", "b01", "n_items"))
    cluster_se: float | None = None
    if design.clustering == "item" and n_items < n:
        # CR0 clustered by item, as harness.stats.paired.cluster_robust_se: se^2 = sum_j (S_j - k_j d)^2 / n^2
        # with d = D/n, D = b10 - b01. Expanded, n^4 se^2 = n^2 sum S_j^2 - 2 n D sum S_j k_j + D^2 sum k_j^2:
        # three integer sums, so the result is exact and does not depend on the order groups come out in.
        per_item = pairs.group_by("item").agg((x_a.cast(_I) - x_b.cast(_I)).sum().alias("s"), pl.len().alias("k"))
        ss, sk, kk = (int(v) for v in per_item.select(
            (pl.col("s") * pl.col("s")).sum().alias("ss"), (pl.col("s") * pl.col("k")).sum().alias("sk"),
            (pl.col("k") * pl.col("k")).sum().alias("kk"),
        ).row(0))
        big_d = b10 - b01
        cluster_se = math.sqrt(n * n * ss - 2 * n * big_d * sk + big_d * big_d * kk) / (n * n)
    try:
        r = paired_from_counts(n11, b10, b01, n - n11 - b10 - b01, margin=c.margin, alpha=design.alpha,
                               method="tango", cluster_se=cluster_se, n_items=n_items)
    except ValueError as exc:
        return {**row, "n": n, "n_items": n_items, "n11": n11, "b10": b10, "b01": b01,
                "n00": n - n11 - b10 - b01, "note": f"not computed: {exc}"}
    notes = [r.note] if r.note else []
    if row["unpaired"]:
        notes.append(f"{row['unpaired']} standing cells without a partner on the same (item, repeat) left out")
    fields = ("n", "n_items", "n11", "b10", "b01", "n00", "p_a", "p_b", "diff", "se", "se_method", "design_effect",
              "ci_low", "ci_high", "ci_method", "p", "wald_ci_low", "wald_ci_high", "wald_p", "wald_p_lower",
              "wald_p_upper", "tango_p", "tango_p_lower", "tango_p_upper", "mcnemar_p", "method", "verdict")
    return {**row, **{k: getattr(r, k) for k in fields}, "note": "; ".join(notes) or None}


def _design_effect(cells: pl.DataFrame, design: Design) -> float:
    """One system's pass-rate design effect clustered by item (1 without repeats or clustering)."""
    if design.clustering != "item" or cells.get_column("item").n_unique() == cells.height:
        return 1.0
    per_item = cells.group_by("item").agg(pl.col("passed").cast(_I).sum().alias("s"), pl.len().alias("k"))
    return binomial_design_effect([(int(s), int(k)) for s, k in per_item.select("s", "k").iter_rows()])


def _independent_row(cells: pl.DataFrame, c: Comparison, design: Design) -> dict[str, Any]:
    both = cells.filter(pl.col("system").is_in([c.a, c.b]))
    sums = {s: (int(k), int(n)) for s, k, n in
            both.group_by("system").agg(pl.col("passed").sum(), pl.len()).iter_rows()}
    (pass_a, n_a), (pass_b, n_b) = sums.get(c.a, (0, 0)), sums.get(c.b, (0, 0))
    row: dict[str, Any] = {"n_a": n_a, "n_b": n_b, "n": n_a + n_b, "n_items": both.get_column("item").n_unique()}
    if n_a == 0 or n_b == 0:
        empty = " and ".join(s for s, k in ((c.a, n_a), (c.b, n_b)) if k == 0)
        return {**row, "note": f"no standing cells of {empty} on arm {c.arm}"}
    deff_a = _design_effect(both.filter(pl.col("system") == c.a), design)
    deff_b = _design_effect(both.filter(pl.col("system") == c.b), design)
    try:
        r = independent_tost(pass_a, n_a, pass_b, n_b, c.margin, design.alpha,
                             design_effect_a=deff_a, design_effect_b=deff_b)
    except ValueError as exc:
        return {**row, "note": f"not computed: {exc}"}
    clustered = deff_a > 1.0 or deff_b > 1.0
    return {**row, "p_a": pass_a / n_a, "p_b": pass_b / n_b, "diff": r.diff, "se": r.se,
            "se_method": "independent, clustered by item" if clustered else "independent",
            "design_effect_a": r.design_effect_a, "design_effect_b": r.design_effect_b,
            "ci_low": r.ci_low, "ci_high": r.ci_high, "ci_method": "miettinen-nurminen score", "p": r.p,
            "wald_ci_low": r.wald_ci_low, "wald_ci_high": r.wald_ci_high, "wald_p": r.wald_p,
            "wald_p_lower": r.wald_p_lower, "wald_p_upper": r.wald_p_upper, "method": "miettinen-nurminen",
            "verdict": r.verdict,
            "note": "independent-samples Miettinen-Nurminen score TOST (the registered test); pairing and "
                    "McNemar do not apply" + ("; each system's variance inflated by its design effect "
                                              "(repeats clustered by item)" if clustered else "")}


def _comparisons(by_stage: dict[str, pl.DataFrame], design: Design, stage_ids: list[str],
                 exhausted: pl.DataFrame) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    for stage_id in stage_ids:
        shape = _stage_shape(design, stage_id)
        for c in design.comparisons:
            base = {"stage": stage_id, "a": c.a, "b": c.b, "arm": c.arm, "margin": c.margin,
                    "alpha": design.alpha, "test": design.test}
            why = _missing(shape, c)
            if why is not None:
                rows.append({**base, "note": why})
                continue
            cells = by_stage[stage_id].filter(pl.col("arm") == c.arm)
            compute = paired_row if design.test == "paired_tost" else _independent_row
            gone = exhausted.filter((pl.col("stage") == stage_id) & (pl.col("arm") == c.arm))
            dropped, why = _dropped(gone, c.a, c.b, paired=design.test == "paired_tost")
            rows.append(_with_note({**base, **compute(cells, c, design), "dropped_exhausted": dropped}, why))
    return frame_of(rows, COMPARISON_SCHEMA)


# --------------------------------------------------------------------------
# Break-even


def _cascades(by_stage: dict[str, pl.DataFrame], design: Design, stage_ids: list[str],
              exhausted: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows: list[dict[str, Any]] = []
    grids: list[pl.DataFrame] = []
    for stage_id in stage_ids:
        shape = _stage_shape(design, stage_id)
        for arm in shape.arms:
            cells = by_stage[stage_id].filter(pl.col("arm") == arm)
            design_order = _systems_order(design, shape)
            means = dict(cells.group_by("system").agg(pl.col("cost_usd").mean()).iter_rows())
            ran = [s for s in design_order if s in means]
            # cheapest first; a system with no known cost last; ties keep design order (a stable sort)
            ran.sort(key=lambda s: (means[s] is None, means[s] if means[s] is not None else 0.0))
            for i, cheap in enumerate(ran):
                for strong in ran[i + 1:]:
                    row, grid = _cascade(cells, stage_id, arm, cheap, strong)
                    gone = exhausted.filter((pl.col("stage") == stage_id) & (pl.col("arm") == arm))
                    row = _with_note(row, _dropped(gone, cheap, strong, paired=True)[1])
                    rows.append(row)
                    if grid is not None:
                        grids.append(grid)
    sensitivity = pl.concat(grids, how="vertical") if grids else pl.DataFrame(schema=SENSITIVITY_SCHEMA)
    return frame_of(rows, BREAKEVEN_SCHEMA), sensitivity


def _cascade(cells: pl.DataFrame, stage_id: str, arm: str, cheap: str,
             strong: str) -> tuple[dict[str, Any], pl.DataFrame | None]:
    keys = list(_PAIR_KEYS)
    both = cells.filter(pl.col("system").is_in([cheap, strong]))
    paired_keys = (both.filter(pl.col("system") == cheap).select(keys)
                   .join(both.filter(pl.col("system") == strong).select(keys), on=keys, how="inner"))
    paired = both.join(paired_keys, on=keys, how="semi")
    base: dict[str, Any] = {"stage": stage_id, "arm": arm, "cheap": cheap, "strong": strong, "gate": "oracle",
                            "unpaired": both.height - paired.height}
    if paired.height == 0:
        return {**base, "n_pairs": 0, "note": f"not composed: no (item, repeat) has standing cells of both "
                                              f"{cheap} and {strong}"}, None
    try:
        result = break_even(paired, cheap=cheap, strong=strong, arm=arm, stage=stage_id)
        grid = sensitivity_grid(paired, cheap=cheap, strong=strong, arm=arm, stage=stage_id)
    except ValueError as exc:
        return {**base, "note": f"not composed: {exc}"}, None
    row = {**base, **result.to_dict()}
    if base["unpaired"]:
        row["note"] = f"{result.note}; {base['unpaired']} standing cells without a partner left out"
    grid = grid.select(pl.lit(stage_id).alias("stage"), pl.lit(arm).alias("arm"), pl.lit(cheap).alias("cheap"),
                       pl.lit(strong).alias("strong"), pl.all()).cast(pl.Schema(SENSITIVITY_SCHEMA))
    return row, grid


# --------------------------------------------------------------------------
# Power


def _power(design: Design, stage_ids: list[str]) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    paired = design.test == "paired_tost"
    for stage_id in stage_ids:
        shape = _stage_shape(design, stage_id)
        for c in design.comparisons:
            row: dict[str, Any] = {
                "stage": stage_id, "a": c.a, "b": c.b, "arm": c.arm, "test": design.test, "margin": c.margin,
                "alpha": design.alpha, "power": design.power, "expected_a": c.expected_a,
                "expected_b": c.expected_b, "correlation": c.correlation, "items": shape.items,
                "repeats": shape.repeats}
            why = _missing(shape, c)
            if why is not None:
                rows.append({**row, "note": why})
                continue
            # repeats of an item are clustered, not new items, unless the design registers no clustering
            n = shape.items if design.clustering == "item" else shape.items * shape.repeats
            common: dict[str, Any] = {"alpha": design.alpha, "p_a": c.expected_a, "p_b": c.expected_b,
                                      "correlation": c.correlation, "paired": paired}
            try:
                needed = items_needed(margin=c.margin, power=design.power, **common)
                mdm = minimum_detectable_margin(n, power=design.power, **common)
                at_normal = tost_power(n, margin=c.margin, **common)
                exact = mdm is not None and n <= EXACT_MAX_ITEMS
                at_n = exact_tost_power(n, margin=c.margin, **common) if exact else at_normal
            except ValueError as exc:
                rows.append({**row, "items_registered": n, "note": f"not computed: {exc}"})
                continue
            rows.append({**row, "items_registered": n,
                         "power_at_n": None if mdm is None else at_n,  # None: an impossible correlation
                         "power_at_n_normal": None if mdm is None else at_normal,
                         "power_method": None if mdm is None else ("exact" if exact else "normal"),
                         "items_needed": needed.n, "items_needed_normal": needed.n_normal,
                         "items_needed_closed_form": needed.n_closed_form,
                         "reaches": None if needed.n is None else n >= needed.n,
                         "minimum_detectable_margin": mdm, "note": needed.reason})
    return frame_of(rows, POWER_SCHEMA)


# --------------------------------------------------------------------------
# The pure part


def analyze_frame(attempts: pl.DataFrame, design: Design, *, stages: Sequence[str] | None = None,
                  exhausted: pl.DataFrame | None = None) -> FrameTables:
    """Every computed table from a scored-attempts frame and the registered design (no I/O).

    Args:
        attempts: the report's scored attempts (`harness.audit.frame.ATTEMPT_COLUMNS`), one row per
            standing cell (stage, system, arm, item, repeat).
        design: the registered design (comparisons, alpha, test, clustering, power).
        stages: the stages to report (rows appear for each even without attempts); default: the
            stages in `attempts`. Shown in design order.
        exhausted: the exhausted cells (`EXHAUSTED_COLUMNS`), never in `attempts`: each comparison
            says how many pairs (cells) they took out (`dropped_exhausted`) and why (`note`).

    Raises:
        ValueError: a frame that is not a scored-attempts frame, holds a cell twice, or a stage the
            design does not run.
    """
    validate_attempts(attempts)
    duplicated = attempts.height - attempts.select(_CELL_KEYS).n_unique()
    if duplicated:
        raise ValueError(f"{duplicated} rows share a (stage, system, arm, item, repeat) cell: "
                         "a scored-attempts frame has one row per standing cell")
    present = attempts.get_column("stage").unique().to_list()
    stage_ids = stage_order(design, list(stages) if stages is not None else present)
    empty = attempts.clear()
    by_stage = {s: attempts.filter(pl.col("stage") == s) if s in present else empty for s in stage_ids}
    gone = pl.DataFrame(schema=EXHAUSTED_COLUMNS) if exhausted is None else exhausted
    breakeven, sensitivity = _cascades(by_stage, design, stage_ids, gone)
    return FrameTables(
        q=q_table(attempts, alpha=design.alpha),
        comparisons=_comparisons(by_stage, design, stage_ids, gone),
        breakeven=breakeven,
        sensitivity=sensitivity,
        power=_power(design, stage_ids),
    )
