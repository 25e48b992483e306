"""The analysis figures: the comparisons' forest plot and the cheap-first savings plot (PNG and SVG).

The manual: docs/analysis.md.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from harness.errors import Code, LogRefusal
from harness.evidence.fsutil import atomic_write

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SVG_HASH_SALT", "forest_plot", "kind_figure", "kind_plot", "savings_figure", "savings_plot", "sensitivity_figure",
           "sensitivity_plot"]

PathArg = str | os.PathLike[str]

SVG_HASH_SALT: Final = "proctor-analysis"
"""`svg.hashsalt`: fixed, so the SVG's generated ids are the same on every run."""

_FOREST_COLUMNS: Final = ("stage", "a", "b", "arm", "margin", "diff", "ci_low", "ci_high", "verdict")
_SAVINGS_COLUMNS: Final = ("stage", "arm", "cheap", "strong", "q", "break_even_q", "cost_ratio")
_STYLES: Final = ("-", "--", "-.")
_COLORS: Final = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@contextmanager
def _rc() -> Iterator[None]:
    """Every figure is built and saved under these settings (a figure built here may be saved later)."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context({
        "svg.hashsalt": SVG_HASH_SALT,
        "svg.fonttype": "path",  # glyphs as paths: no font lookup on the reader's machine
        "font.family": "DejaVu Sans",  # ships with matplotlib
        "savefig.dpi": 150,
        "figure.dpi": 100,
    }):
        yield


@contextmanager
def _figure(width: float, height: float) -> Iterator[Figure]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    with _rc():
        yield Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, stem: PathArg) -> list[str]:
    base = os.path.abspath(os.fspath(stem))
    paths = []
    path = os.path.dirname(base)
    try:
        os.makedirs(path, exist_ok=True)
        for fmt, metadata in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
            buffer = io.BytesIO()
            with _rc():
                fig.savefig(buffer, format=fmt, metadata=metadata)
            path = f"{base}.{fmt}"
            atomic_write(path, buffer.getvalue(), mode=0o644)
            paths.append(path)
    except OSError as exc:
        raise LogRefusal(Code.FILE_UNWRITABLE, exc.strerror or str(exc), path) from None
    return paths


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_yticks([])


def _require(frame: pl.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if frame.height and missing:
        raise ValueError(f"not {what}: missing columns {', '.join(missing)}")


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def forest_plot(comparisons: pl.DataFrame, stem: PathArg) -> list[str]:
    """Each comparison's 1 - 2 alpha interval of the difference against its +-margin.

    Args:
        comparisons: `StudyAnalysis.comparisons` (stage, a, b, arm, margin, diff, ci_low,
            ci_high, verdict; `note` when a comparison could not be made).
        stem: the output path without suffix; `<stem>.png` and `<stem>.svg` are written.

    Returns:
        The two paths (PNG, SVG).

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
        Refusal: `file_unwritable` when the folder cannot be made or a file cannot be written.
    """
    _require(comparisons, _FOREST_COLUMNS, "a comparisons table")
    rows = list(comparisons.iter_rows(named=True))
    with _figure(8.0, max(2.6, 0.55 * len(rows) + 1.6)) as fig:
        ax = fig.add_subplot()
        ax.set_title("Comparisons: the registered test's 1 - 2 alpha interval of p_a - p_b against the margin")
        ax.set_xlabel("difference in pass rate, a - b")
        if not rows:
            _empty(ax, "no comparisons")
            ax.set_xlim(-1.0, 1.0)
            ax.axvline(0.0, color="0.2", linewidth=0.8)
            return _save(fig, stem)
        labels = []
        for i, row in enumerate(rows):
            y = len(rows) - 1 - i
            name = f"{row['stage']}: {row['a']} vs {row['b']} ({row['arm']})"
            low, high, diff = _number(row.get("ci_low")), _number(row.get("ci_high")), _number(row.get("diff"))
            if low is None or high is None or diff is None:
                labels.append(f"{name}\nnot compared")
                ax.text(0.0, y, "  not compared (see the table's note)", va="center", color="0.4", fontsize=8)
                continue
            labels.append(f"{name}\n{row.get('verdict')}")
            color = "#2ca02c" if row.get("verdict") == "equivalent" else "#d62728"
            ax.hlines(y, low, high, color=color, linewidth=2.5)
            ax.plot([diff], [y], marker="o", color=color, markersize=6)
        margins = sorted({float(m) for m in comparisons.get_column("margin").drop_nulls().to_list()})
        if len(margins) == 1:
            ax.axvline(-margins[0], color="0.45", linestyle="--", linewidth=1.0, label=f"margin +-{margins[0]:g}")
            ax.axvline(margins[0], color="0.45", linestyle="--", linewidth=1.0)
        else:  # each row's own margin, as a tick across its row
            for i, row in enumerate(rows):
                if row.get("margin") is not None:
                    m, y = float(row["margin"]), len(rows) - 1 - i
                    ax.vlines([-m, m], y - 0.4, y + 0.4, color="0.45", linestyle="--", linewidth=1.0,
                              label="the row's margin +-m" if i == 0 else "_nolegend_")
        ax.axvline(0.0, color="0.2", linewidth=0.8, label="no difference")
        ax.set_yticks(list(range(len(rows) - 1, -1, -1)), labels, fontsize=8)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        fig.legend(loc="outside lower center", ncols=3, fontsize=7)
        return _save(fig, stem)


def savings_figure(breakeven: pl.DataFrame) -> Figure:
    """The savings plot as a matplotlib Figure (`savings_plot` saves it; tests measure its labels).

    Each cascade is named once, in a legend below the axes with its q and q* (no label is
    placed beside a point, where labels of close points would overlap); the figure grows with
    the number of cascades so the legend never covers the plot.

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
    """
    _require(breakeven, _SAVINGS_COLUMNS, "a break-even table")
    rows = list(breakeven.iter_rows(named=True))
    drawn = [r for r in rows if r.get("break_even_q") is not None and r.get("q") is not None]
    entries = len(drawn) + 3
    with _figure(8.0, 4.6 + 0.2 * entries) as fig:
        ax = fig.add_subplot()
        ax.set_title("Cheap-first routing: predicted savings against the cheap pass rate")
        ax.set_xlabel("q, the cheap system's pass rate")
        ax.set_ylabel("predicted savings q - (b + v)/s\n(fraction of the strong cost)")
        ax.set_xlim(-0.02, 1.02)
        ax.axhline(0.0, color="0.2", linewidth=1.0, label="break-even (savings 0)")
        if not drawn:
            _empty(ax, "no cascades" if not rows else "no cascade has a break-even (see the table)")
            return fig
        for k, row in enumerate(drawn):
            color, style = _COLORS[k % len(_COLORS)], _STYLES[(k // len(_COLORS)) % len(_STYLES)]
            star, q = float(row["break_even_q"]), float(row["q"])
            name = (f"{row['stage']}: {row['cheap']} -> {row['strong']} ({row['arm']}): "
                    f"q={q:.3f}, q*={star:.3f}")
            ax.plot([0.0, 1.0], [-star, 1.0 - star], color=color, linestyle=style, linewidth=1.2, label=name)
            if 0.0 <= star <= 1.0:
                ax.axvline(star, color=color, linestyle=":", linewidth=0.9)
            ax.plot([q], [q - star], marker="o", color=color, markersize=7, clip_on=False)
            ratio = row.get("cost_ratio")
            if ratio is not None:
                ax.plot([q], [1.0 - float(ratio)], marker="o", markerfacecolor="none", color=color, markersize=7,
                        clip_on=False)
        ax.plot([], [], marker="o", color="0.3", linestyle="none", label="observed q (predicted savings)")
        ax.plot([], [], marker="o", markerfacecolor="none", color="0.3", linestyle="none",
                label="composed savings, 1 - cost ratio")
        skipped = len(rows) - len(drawn)
        if skipped:
            ax.plot([], [], linestyle="none",
                    label=f"{skipped} cascade(s) without a break-even are in the table only")
        fig.legend(loc="outside lower center", ncols=1, fontsize=7, frameon=False)
        return fig


def savings_plot(breakeven: pl.DataFrame, stem: PathArg) -> list[str]:
    """Predicted savings q - (b + v)/s against q for each cascade, with the break-even line.

    Args:
        breakeven: `StudyAnalysis.breakeven` (stage, arm, cheap, strong, q, break_even_q,
            predicted_savings, cost_ratio); rows without a break-even (no strong cost, not
            composed) are counted in the legend.
        stem: the output path without suffix; `<stem>.png` and `<stem>.svg` are written.

    Returns:
        The two paths (PNG, SVG).

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
        Refusal: `file_unwritable` when the folder cannot be made or a file cannot be written.
    """
    return _save(savings_figure(breakeven), stem)


_SENSITIVITY_COLUMNS: Final = ("stage", "arm", "cheap", "strong", "false_accept", "false_reject", "pass_rate",
                               "cost_ratio")


def sensitivity_figure(sensitivity: pl.DataFrame) -> Figure:
    """The noisy-gate grid as heat maps: per cascade, the pass rate and the cost ratio over the gate's errors.

    Rows: one cascade each (stage, arm, cheap -> strong); columns: the composed pass rate and the
    cost against the strong system alone; x the false-accept rate, y the false-reject rate; each
    cell carries its value. The full table is `tables/sensitivity.csv`.

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
    """
    import polars as pl

    _require(sensitivity, _SENSITIVITY_COLUMNS, "a sensitivity table")
    keys = ["stage", "arm", "cheap", "strong"]
    cascades = sensitivity.select(keys).unique(maintain_order=True).rows() if sensitivity.height else []
    with _figure(9.0, max(2.4, 2.7 * len(cascades) + 0.8)) as fig:
        if not cascades:
            ax = fig.add_subplot()
            ax.set_title("Sensitivity to a noisy gate")
            _empty(ax, "no cascade was composed")
            ax.set_xticks([])
            return fig
        axes = fig.subplots(len(cascades), 2, squeeze=False)
        fig.suptitle("Sensitivity to a noisy gate: the cascade's pass rate and its cost against the strong system "
                     "alone", fontsize=10)
        for r, (stage, arm, cheap, strong) in enumerate(cascades):
            grid = sensitivity.filter((pl.col("stage") == stage) & (pl.col("arm") == arm)
                                      & (pl.col("cheap") == cheap) & (pl.col("strong") == strong))
            fa = sorted(set(grid.get_column("false_accept").to_list()))
            fr = sorted(set(grid.get_column("false_reject").to_list()))
            for c, (column, what, cmap) in enumerate((("pass_rate", "pass rate", "viridis"),
                                                      ("cost_ratio", "cost / strong alone", "magma"))):
                values = [[None] * len(fa) for _ in fr]
                for row in grid.iter_rows(named=True):
                    values[fr.index(row["false_reject"])][fa.index(row["false_accept"])] = row[column]
                _heat(fig, axes[r][c], values, fa, fr, cmap, what)
                axes[r][c].set_title(f"{stage}: {cheap} -> {strong} ({arm}): {what}", fontsize=8)
        return fig


def _heat(fig: Figure, ax: Axes, values: list[list[Any]], fa: list[float], fr: list[float], cmap: str,
          what: str) -> None:
    import math

    grid = [[math.nan if v is None else float(v) for v in row] for row in values]
    finite = [v for row in grid for v in row if math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    image = ax.imshow(grid, cmap=cmap, origin="lower", aspect="auto", vmin=low, vmax=high if high > low else low + 1)
    ax.set_xticks(range(len(fa)), [f"{v:g}" for v in fa], fontsize=7)
    ax.set_yticks(range(len(fr)), [f"{v:g}" for v in fr], fontsize=7)
    ax.set_xlabel("false-accept rate", fontsize=7)
    ax.set_ylabel("false-reject rate", fontsize=7)
    middle = (low + high) / 2
    for y, row in enumerate(grid):
        for x, v in enumerate(row):
            text = "-" if not math.isfinite(v) else f"{v:.2f}"
            dark = math.isfinite(v) and (v < middle) == (cmap in ("viridis", "magma"))
            ax.text(x, y, text, ha="center", va="center", fontsize=6.5, color="white" if dark else "black")
    bar = fig.colorbar(image, ax=ax, shrink=0.9)
    bar.ax.tick_params(labelsize=6)
    bar.set_label(what, fontsize=7)


def sensitivity_plot(sensitivity: pl.DataFrame, stem: PathArg) -> list[str]:
    """`sensitivity_figure` saved as `<stem>.png` and `<stem>.svg`; returns the two paths.

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
        Refusal: `file_unwritable` when the folder cannot be made or a file cannot be written.
    """
    return _save(sensitivity_figure(sensitivity), stem)


_KIND_COLUMNS: Final = ("stage", "system", "arm", "feature", "value", "n", "pass_rate", "wilson_low", "wilson_high")


def kind_figure(features: pl.DataFrame, *, feature: str = "mutation_kind") -> Figure:
    """`kind_plot`'s figure, unsaved: one panel per stage, a group of bars per value of `feature`, one bar per
    system (per system and arm when the stage runs several arms), each with its Wilson interval."""
    _require(features, _KIND_COLUMNS, "a repo_features table")
    rows = [r for r in features.iter_rows(named=True) if r["feature"] == feature] if features.height else []
    stages = list(dict.fromkeys(r["stage"] for r in rows)) or [""]
    fig: Figure
    with _figure(9.0, 3.2 * len(stages) + 0.8) as fig:
        for number, stage in enumerate(stages, start=1):
            ax = fig.add_subplot(len(stages), 1, number)
            mine = [r for r in rows if r["stage"] == stage]
            ax.set_title(f"Pass rate by {feature.replace('_', ' ')}" + (f", stage {stage}" if stage else ""))
            if not mine:
                _empty(ax, f"no items with a {feature}")
                continue
            values = sorted(dict.fromkeys(r["value"] for r in mine))
            several_arms = len({r["arm"] for r in mine}) > 1
            bars = list(dict.fromkeys((r["system"], r["arm"]) for r in mine))
            width = 0.8 / len(bars)
            by = {(r["system"], r["arm"], r["value"]): r for r in mine}
            for k, (system, arm) in enumerate(bars):
                xs, ys, low, high = [], [], [], []
                for i, value in enumerate(values):
                    r = by.get((system, arm, value))
                    if r is None:
                        continue
                    xs.append(i - 0.4 + width * (k + 0.5))
                    ys.append(float(r["pass_rate"]))
                    low.append(float(r["pass_rate"]) - float(r["wilson_low"]))
                    high.append(float(r["wilson_high"]) - float(r["pass_rate"]))
                label = f"{system} / {arm}" if several_arms else str(system)
                ax.bar(xs, ys, width, yerr=[low, high], capsize=2, label=label, color=_COLORS[k % len(_COLORS)],
                       error_kw={"elinewidth": 0.8, "ecolor": "0.3"})
            counts = {v: max(int(r["n"]) for r in mine if r["value"] == v) for v in values}
            ax.set_xticks(range(len(values)), [f"{v}\n(n={counts[v]})" for v in values])
            ax.set_ylim(0.0, 1.05)
            ax.set_ylabel("hidden-test pass rate")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    return fig


def kind_plot(features: pl.DataFrame, stem: PathArg, *, feature: str = "mutation_kind") -> list[str]:
    """Pass rate by task feature (default the mutation kind) per system, with 95% Wilson intervals.

    Args:
        features: `RepoTables.features` (stage, system, arm, feature, value, n, pass_rate, wilson_low, wilson_high).
        stem: the output path without suffix; `<stem>.png` and `<stem>.svg` are written.
        feature: which feature's rows to draw.

    Returns:
        The two paths (PNG, SVG).

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
        Refusal: `file_unwritable` when the folder cannot be made or a file cannot be written.
    """
    return _save(kind_figure(features, feature=feature), stem)
