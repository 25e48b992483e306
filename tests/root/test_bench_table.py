"""The benchmark table's renderer (tests/support/bench.py): results files in, the docs table out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench import DOC, END, ORDER, START, Row, load, record, render, splice


def _row(name: str, **over: str) -> Row:
    base = {"name": name, "proctor": "1.0 s", "peer": "the peer", "peer_value": "2.0 s", "ratio": "0.50x",
            "command": ".venv/bin/python -m pytest tests/bench/bench_x.py -s"}
    return Row(**{**base, **over})


def test_recorded_rows_render_in_the_benches_order(tmp_path: Path) -> None:
    record("zeta_extra", [_row("extra")], folder=tmp_path)
    record(ORDER[1], [_row("second a"), _row("second b")], folder=tmp_path)
    record(ORDER[0], [_row("first", ratio="a | b")], folder=tmp_path)
    table = render(load(tmp_path), home="/nonexistent-home", repo="/nonexistent-repo")
    lines = table.splitlines()
    assert lines[0] == "| benchmark | proctor | peer, same run | ratio | command |"
    assert [line.split(" | ")[0] for line in lines[2:6]] == ["| first", "| second a", "| second b", "| extra"]
    assert "| a \\| b |" in lines[2]  # a pipe inside a cell is escaped
    assert "| the peer: 2.0 s |" in lines[3]
    assert f"Rendered from 3 results files ({ORDER[0]}, {ORDER[1]}, zeta_extra)" in table


def test_a_row_naming_a_machine_path_is_refused(tmp_path: Path) -> None:
    record("tree", [_row("t", command="/srv/checkout/.venv/bin/python bench")], folder=tmp_path)
    with pytest.raises(ValueError, match="names a path on this machine"):
        render(load(tmp_path), home="/home/someone", repo="/srv/checkout")


@pytest.mark.parametrize("doc", [
    {"bench": "tree", "when": "x", "cpus": 2, "load": 1.0, "rows": []},
    {"bench": "other", "when": "x", "cpus": 2, "load": 1.0, "rows": [_row("t").__dict__]},
    {"bench": "tree", "when": "x", "cpus": 2, "load": 1.0, "rows": [{**_row("t").__dict__, "extra": "x"}]},
    {"bench": "tree", "when": "x", "cpus": 2, "load": 1.0, "rows": [{**_row("t").__dict__, "ratio": ""}]},
    {"bench": "tree", "when": "x", "cpus": 2, "rows": [_row("t").__dict__]},
])
def test_a_malformed_results_file_is_refused_by_name(tmp_path: Path, doc: dict[str, object]) -> None:
    (tmp_path / "tree.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"tree\.json"):
        load(tmp_path)


def test_splice_replaces_only_the_text_between_the_markers() -> None:
    page = f"# t\n\nbefore\n{START}\nold table\n{END}\nafter\n"
    assert splice(page, "NEW") == f"# t\n\nbefore\n{START}\nNEW\n{END}\nafter\n"
    for broken in ("no markers", f"{END}\n{START}", f"{START}{START}{END}"):
        with pytest.raises(ValueError, match="marker"):
            splice(broken, "NEW")


def test_the_benchmarks_page_holds_the_markers() -> None:
    page = DOC.read_text(encoding="utf-8")
    assert f"{START}\nX\n{END}" in splice(page, "X")
