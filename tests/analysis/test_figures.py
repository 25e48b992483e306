"""The analysis figures (`harness.analysis.figures`): real PNG and SVG, byte-identical for equal input."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from harness.analysis.figures import (
    SVG_HASH_SALT,
    forest_plot,
    savings_figure,
    savings_plot,
    sensitivity_figure,
    sensitivity_plot,
)
from harness.analysis.frame_tables import (
    BREAKEVEN_SCHEMA,
    COMPARISON_SCHEMA,
    SENSITIVITY_SCHEMA,
    FrameTables,
    analyze_frame,
)
from tests.support.analysis import design, frame
from tests.support.paths import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tables() -> FrameTables:
    """Two stages: A compares x and y (three systems, so three cascades); B runs x alone."""
    rows = []
    for i in range(12):
        for r in range(2):
            rows += [{"system": "x", "item": f"i{i}", "repeat": r, "passed": (i + r) % 3 != 0, "cost_usd": 0.002},
                     {"system": "y", "item": f"i{i}", "repeat": r, "passed": i % 4 != 0, "cost_usd": 0.02},
                     {"system": "z", "item": f"i{i}", "repeat": r, "passed": i % 5 != 0, "cost_usd": 0.05}]
    rows += [{"stage": "B", "system": "x", "item": f"i{i}", "passed": True} for i in range(3)]
    return analyze_frame(frame(rows), design())


def check_files(paths: list[str], stem: Path) -> tuple[bytes, bytes]:
    assert paths == [f"{stem}.png", f"{stem}.svg"]
    png, svg = Path(paths[0]).read_bytes(), Path(paths[1]).read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 2000
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert b"<dc:date>" not in svg and b"Matplotlib v" not in svg and b"matplotlib.org" not in png
    return png, svg


def test_forest_plot_draws_every_comparison_and_is_byte_identical(tmp_path: Path) -> None:
    comparisons = tables().comparisons
    assert comparisons.height == 2
    first = check_files(forest_plot(comparisons, tmp_path / "one" / "forest"), tmp_path / "one" / "forest")
    second = check_files(forest_plot(comparisons, tmp_path / "two" / "forest"), tmp_path / "two" / "forest")
    assert first == second
    svg = first[1].decode()
    # matplotlib writes each text as a comment beside its glyph paths
    assert "A: x vs y (direct)" in svg and "not equivalent" in svg
    assert "B: x vs y (direct)" in svg and "not compared" in svg
    assert "margin +-0.2" in svg


def test_a_different_frame_gives_a_different_figure(tmp_path: Path) -> None:
    comparisons = tables().comparisons
    moved = comparisons.with_columns(pl.col("ci_high") + 0.05)
    a = forest_plot(comparisons, tmp_path / "a")
    b = forest_plot(moved, tmp_path / "b")
    assert Path(a[0]).read_bytes() != Path(b[0]).read_bytes()
    assert Path(a[1]).read_bytes() != Path(b[1]).read_bytes()


def test_savings_plot_marks_each_cascade_and_is_byte_identical(tmp_path: Path) -> None:
    breakeven = tables().breakeven
    assert breakeven.height == 3
    first = check_files(savings_plot(breakeven, tmp_path / "s1"), tmp_path / "s1")
    second = check_files(savings_plot(breakeven, tmp_path / "s2"), tmp_path / "s2")
    assert first == second
    svg = first[1].decode()
    for row in breakeven.iter_rows(named=True):
        assert f"A: {row['cheap']} -&gt; {row['strong']} (direct)" in svg
        assert f"q*={row['break_even_q']:.3f}" in svg
    assert "break-even (savings 0)" in svg


def text_boxes(fig: Any) -> list[tuple[str, Any]]:
    """Every visible, non-empty text of a drawn figure with its bounding box in display units (the renderer's)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    undrawn = set()  # tick labels of ticks outside the view limits exist but are never drawn
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            undrawn |= {id(label) for tick, label in zip(axis.get_majorticklocs(), axis.get_majorticklabels(),
                                                         strict=True) if not low - 1e-9 <= tick <= high + 1e-9}
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and id(t) not in undrawn]


def overlaps(boxes: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(a, b) for i, (a, x) in enumerate(boxes) for b, y in boxes[i + 1:]
            if x.x0 < y.x1 - 0.5 and y.x0 < x.x1 - 0.5 and x.y0 < y.y1 - 0.5 and y.y0 < x.y1 - 0.5]


def close_cascades(n: int) -> pl.DataFrame:
    """n cascades whose points nearly coincide: labels placed beside the points would pile up."""
    return pl.DataFrame([{"stage": "A", "arm": "direct", "cheap": f"cheap{i}", "strong": f"strong{i}",
                          "q": 0.1 + 0.002 * i, "break_even_q": 0.5 + 0.002 * i, "cost_ratio": 0.6}
                         for i in range(n)])


def test_savings_plot_labels_never_overlap(tmp_path: Path) -> None:
    """Issue 13 item 8: each cascade is named once, in a legend outside the axes; no two labels overlap."""
    for n in (1, 3, 9, 14):
        fig = savings_figure(close_cascades(n))
        boxes = text_boxes(fig)
        names = [t for t, _ in boxes if t.startswith("A: cheap")]
        assert len(names) == n and len(set(names)) == n
        assert overlaps(boxes) == [], n
        (ax,) = fig.axes
        legend = fig.legends[0].get_window_extent(fig.canvas.get_renderer())
        assert legend.y1 <= ax.get_window_extent().y0, "the legend covers the plot"
        page = fig.bbox
        assert all(page.x0 - 1 <= b.x0 and b.x1 <= page.x1 + 1 and page.y0 - 1 <= b.y0 and b.y1 <= page.y1 + 1
                   for _, b in boxes), "a label is cut off"
    check_files(savings_plot(close_cascades(9), tmp_path / "s"), tmp_path / "s")


def test_the_noisy_gate_grid_is_a_heat_map_per_cascade(tmp_path: Path) -> None:
    """Issue 13 item 8: the 25-row grid of each cascade is two heat maps (pass rate, cost), values in the cells."""
    grid = tables().sensitivity
    assert grid.height == 75  # three cascades of 5 x 5 error rates
    first = check_files(sensitivity_plot(grid, tmp_path / "h1"), tmp_path / "h1")
    assert first == check_files(sensitivity_plot(grid, tmp_path / "h2"), tmp_path / "h2")
    fig = sensitivity_figure(grid)
    assert len([ax for ax in fig.axes if ax.images]) == 6
    boxes = text_boxes(fig)
    assert overlaps(boxes) == []
    texts = [t for t, _ in boxes]
    for row in grid.head(3).iter_rows(named=True):
        assert f"{row['pass_rate']:.2f}" in texts and f"{row['cost_ratio']:.2f}" in texts
    assert "A: x -> y (direct): pass rate" in texts or any(t.endswith("pass rate") for t in texts)
    empty = check_files(sensitivity_plot(pl.DataFrame(schema=SENSITIVITY_SCHEMA), tmp_path / "e"), tmp_path / "e")
    assert "no cascade was composed" in empty[1].decode()
    with pytest.raises(ValueError, match=r"missing columns .*pass_rate"):
        sensitivity_plot(pl.DataFrame({"stage": ["A"]}), tmp_path / "bad")


def test_empty_frames_draw_a_labelled_empty_figure(tmp_path: Path) -> None:
    forest = check_files(forest_plot(pl.DataFrame(schema=COMPARISON_SCHEMA), tmp_path / "f"), tmp_path / "f")
    savings = check_files(savings_plot(pl.DataFrame(schema=BREAKEVEN_SCHEMA), tmp_path / "s"), tmp_path / "s")
    assert "no comparisons" in forest[1].decode()
    assert "no cascades" in savings[1].decode()
    not_composed = pl.DataFrame([{"stage": "A", "arm": "direct", "cheap": "x", "strong": "y", "gate": "oracle",
                                  "note": "not composed: unknown cost"}], schema=BREAKEVEN_SCHEMA)
    svg = check_files(savings_plot(not_composed, tmp_path / "n"), tmp_path / "n")[1].decode()
    assert "no cascade has a break-even" in svg


def test_frames_without_the_drawn_columns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing columns .*ci_low"):
        forest_plot(pl.DataFrame({"stage": ["A"], "a": ["x"]}), tmp_path / "f")
    with pytest.raises(ValueError, match=r"missing columns .*break_even_q"):
        savings_plot(pl.DataFrame({"stage": ["A"]}), tmp_path / "s")
    assert not list(tmp_path.iterdir())


def test_matplotlib_loads_lazily_and_settings_do_not_leak(tmp_path: Path) -> None:
    code = ("import sys, harness.analysis.figures, harness.analysis.study; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    import matplotlib

    before = matplotlib.rcParams["svg.hashsalt"]
    assert before != SVG_HASH_SALT
    forest_plot(tables().comparisons, tmp_path / "f")
    assert matplotlib.rcParams["svg.hashsalt"] == before
    assert matplotlib.get_backend().lower() == "agg"
