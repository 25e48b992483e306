"""The analysis figures (`harness.analysis.figures`): real PNG and SVG, byte-identical for equal input."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest

from harness.analysis.figures import SVG_HASH_SALT, forest_plot, savings_plot
from harness.analysis.frame_tables import (
    BREAKEVEN_SCHEMA,
    COMPARISON_SCHEMA,
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
