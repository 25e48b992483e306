"""Portable evidence: the scan for absolute machine paths, roles instead of folders, relative display."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.evidence.portable import machine_names, machine_paths, portable_value, shown_path
from tests.support.paths import REPO


def test_the_scan_names_each_file_holding_a_machine_path_and_nothing_else(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "study"
    (folder / "A").mkdir(parents=True)
    (folder / "A" / "host.jsonl").write_text('{"disk":{"path":"."}}\n{"disk":{"path":"' + str(folder / "A") + '"}}\n')
    (folder / "A" / "receipt.json").write_text('{"binary":"/usr/bin/bwrap","options":["--tmpfs","/tmp","--chdir",'
                                               '"/tmp","--ro-bind","/root/.pyenv/versions/3.11.7"]}')
    (folder / "A" / "wire.jsonl").write_text('{"url":"http://127.0.0.1:8080/v1/chat","path":"results/study/A"}\n')
    (folder / "analysis.html").write_text(f"<td>{REPO}/prereg/demo</td><td>{sys.prefix}</td><td>results/study</td>")
    (folder / "A" / "run_study.ipynb").write_text('"preregistration /srv/other/checkout/prereg/x", "<repo>/harness"')
    (folder / "skipped").mkdir()
    (folder / "skipped" / "x.txt").write_text(str(folder))
    leaks = {leak.file: leak for leak in machine_paths(folder, skip=["skipped"])}
    assert sorted(leaks) == ["A/host.jsonl", "A/receipt.json", "A/run_study.ipynb", "analysis.html"]
    assert leaks["A/run_study.ipynb"].path == "/srv/other/checkout/prereg/x"  # a checkout elsewhere
    assert leaks["A/run_study.ipynb"].count == 1  # a folder named by its role is no machine path
    assert (leaks["A/host.jsonl"].line, leaks["A/host.jsonl"].path) == (2, str(folder / "A"))
    assert leaks["A/receipt.json"].path == "/root/.pyenv/versions/3.11.7"  # a user folder, on any machine
    assert leaks["analysis.html"].count == 2 and leaks["analysis.html"].path == f"{REPO}/prereg/demo"
    assert machine_paths(folder / "A" / "missing") == ()


def test_a_record_names_machine_folders_by_role() -> None:
    names = machine_names()
    record = {"options": ["--ro-bind", sys.prefix, sys.prefix, "--ro-bind", f"{REPO}/harness", f"{REPO}/harness",
                          "--tmpfs", "/tmp", "/usr"], "kind": "bwrap", "n": 3}
    got = portable_value(record, names)
    assert got["options"][5] == "<repo>/harness" and got["options"][6:] == ["--tmpfs", "/tmp", "/usr"]
    assert got["options"][1] in ("<python>", "<repo>/.venv") and got["kind"] == "bwrap" and got["n"] == 3
    assert not any(str(REPO) in o for o in got["options"])


def test_paths_are_shown_relative_to_a_base(tmp_path: Path) -> None:
    assert shown_path(tmp_path / "results" / "s" / "A", tmp_path) == "results/s/A"
    assert shown_path(tmp_path, tmp_path) == "."
    assert shown_path("/elsewhere/deep/prereg/x", tmp_path) == "prereg/x"  # outside: its last two parts only


def test_portable_text_names_machine_folders_inside_a_program_output() -> None:
    from harness.evidence.portable import portable_text

    names = {"/root": "<home>", "/root/.pyenv/versions/3.11.7": "<python-base>", "/tmp/proctor-attempt-x": "<attempt>"}
    text = ('File "/root/.pyenv/versions/3.11.7/lib/re/__init__.py", line 185\n'
            "/tmp/proctor-attempt-x/task/workspace/a.py:3: AssertionError\n/rootless/x /root")
    assert portable_text(text, names) == (
        'File "<python-base>/lib/re/__init__.py", line 185\n'
        "<attempt>/task/workspace/a.py:3: AssertionError\n/rootless/x <home>")
