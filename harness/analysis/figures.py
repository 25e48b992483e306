"""The analysis figures: the comparisons' forest plot and the cheap-first savings plot (PNG and SVG).

matplotlib is imported inside each function (the CLI must start fast), with the
Agg backend, and figures are built as `matplotlib.figure.Figure` objects (never
through pyplot's global figure list). The bytes are deterministic for equal
input: the SVG hash salt is fixed (it names clip paths), and the metadata that
would change between runs or installs is left out (PNG `Software`; SVG `Date`
and `Creator`). Each file is written whole (`atomic_write`).

    forest_plot    one row per comparison ("stage: a vs b (arm), verdict"): the
                   1 - 2 alpha interval of d = p_a - p_b and its point estimate, with
                   vertical lines at -margin, 0 and +margin; a comparison that could not
                   be made is a row that says so
    savings_plot   predicted savings q - (b + v)/s against the cheap pass rate q for each
                   cascade, the break-even line (savings 0; each cascade crosses it at
                   q* = (b + v)/s, marked), the observed point (q, predicted savings)
                   labelled, and the composed (measured) savings 1 - cost ratio

Both draw a labelled empty figure when the frame has no rows.
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

__all__ = ["SVG_HASH_SALT", "forest_plot", "savings_plot"]

PathArg = str | os.PathLike[str]

SVG_HASH_SALT: Final = "proctor-analysis"
"""`svg.hashsalt`: fixed, so the SVG's generated ids are the same on every run."""

_FOREST_COLUMNS: Final = ("stage", "a", "b", "arm", "margin", "diff", "ci_low", "ci_high", "verdict")
_SAVINGS_COLUMNS: Final = ("stage", "arm", "cheap", "strong", "q", "break_even_q", "cost_ratio")
_COLORS: Final = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@contextmanager
def _figure(width: float, height: float) -> Iterator[Figure]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    with matplotlib.rc_context({
        "svg.hashsalt": SVG_HASH_SALT,
        "svg.fonttype": "path",  # glyphs as paths: no font lookup on the reader's machine
        "font.family": "DejaVu Sans",  # ships with matplotlib
        "savefig.dpi": 150,
        "figure.dpi": 100,
    }):
        yield Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, stem: PathArg) -> list[str]:
    base = os.path.abspath(os.fspath(stem))
    paths = []
    path = os.path.dirname(base)
    try:
        os.makedirs(path, exist_ok=True)
        for fmt, metadata in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
            buffer = io.BytesIO()
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
        ax.set_title("Paired comparisons: the 1 - 2 alpha interval of p_a - p_b against the margin")
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


def savings_plot(breakeven: pl.DataFrame, stem: PathArg) -> list[str]:
    """Predicted savings q - (b + v)/s against q for each cascade, with the break-even line.

    Args:
        breakeven: `StudyAnalysis.breakeven` (stage, arm, cheap, strong, q, break_even_q,
            predicted_savings, cost_ratio); rows without a break-even (no strong cost, not
            composed) are counted in a footnote.
        stem: the output path without suffix; `<stem>.png` and `<stem>.svg` are written.

    Returns:
        The two paths (PNG, SVG).

    Raises:
        ValueError: a frame with rows that lacks a column the figure draws.
        Refusal: `file_unwritable` when the folder cannot be made or a file cannot be written.
    """
    _require(breakeven, _SAVINGS_COLUMNS, "a break-even table")
    rows = list(breakeven.iter_rows(named=True))
    drawn = [r for r in rows if r.get("break_even_q") is not None and r.get("q") is not None]
    with _figure(8.0, 5.0) as fig:
        ax = fig.add_subplot()
        ax.set_title("Cheap-first routing: predicted savings against the cheap pass rate")
        ax.set_xlabel("q, the cheap system's pass rate")
        ax.set_ylabel("predicted savings q - (b + v)/s (fraction of the strong cost)")
        ax.set_xlim(0.0, 1.0)
        ax.axhline(0.0, color="0.2", linewidth=1.0, label="break-even (savings 0)")
        if not drawn:
            _empty(ax, "no cascades" if not rows else "no cascade has a break-even (see the table)")
            return _save(fig, stem)
        for k, row in enumerate(drawn):
            color = _COLORS[k % len(_COLORS)]
            star, q = float(row["break_even_q"]), float(row["q"])
            name = f"{row['stage']}: {row['cheap']} -> {row['strong']} ({row['arm']})"
            ax.plot([0.0, 1.0], [-star, 1.0 - star], color=color, linewidth=1.2, label=name)
            if 0.0 <= star <= 1.0:
                ax.axvline(star, color=color, linestyle=":", linewidth=0.9)
            ax.plot([q], [q - star], marker="o", color=color, markersize=7)
            ax.annotate(f"{name}\nq={q:.3f}, q*={star:.3f}", (q, q - star), textcoords="offset points",
                        xytext=(6, 6 + 10 * (k % 3)), fontsize=7, color=color)
            ratio = row.get("cost_ratio")
            if ratio is not None:
                ax.plot([q], [1.0 - float(ratio)], marker="o", markerfacecolor="none", color=color, markersize=7)
        ax.plot([], [], marker="o", color="0.3", linestyle="none", label="observed q (predicted savings)")
        ax.plot([], [], marker="o", markerfacecolor="none", color="0.3", linestyle="none",
                label="composed savings, 1 - cost ratio")
        skipped = len(rows) - len(drawn)
        if skipped:
            fig.text(0.01, 0.005, f"{skipped} cascade(s) without a break-even are in the table only",
                     fontsize=7, color="0.4")
        ax.legend(loc="upper left", fontsize=7)
        return _save(fig, stem)
