"""`harness.notebooks.stage`: the name an interrupted copy is kept under, and `anchor_executed`'s refusals.

The runs themselves (papermill, signals, anchors) are in tests/e2e/test_notebooks.py,
test_notebook_signals.py and test_notebook_commands.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import Refusal
from harness.notebooks.stage import anchor_executed, interrupted_name
from tests.support.paths import REPO


def test_an_interrupted_copy_takes_the_first_free_number(tmp_path: Path) -> None:
    out = tmp_path / "run_study.ipynb"
    assert interrupted_name(out) == str(tmp_path / "run_study.interrupted-1.ipynb")
    (tmp_path / "run_study.interrupted-1.ipynb").write_text("{}")
    assert interrupted_name(out) == str(tmp_path / "run_study.interrupted-2.ipynb")


def test_anchor_executed_refuses_a_notebook_papermill_did_not_execute(tmp_path: Path) -> None:
    plain = tmp_path / "plain.ipynb"
    plain.write_bytes((REPO / "notebooks" / "run_study.ipynb").read_bytes())
    with pytest.raises(Refusal) as caught:
        anchor_executed(plain, cwd=tmp_path)
    assert caught.value.code == "notebook_not_executed" and caught.value.path == str(plain)


def test_anchor_executed_refuses_a_copy_naming_no_stage_folder_and_keeps_its_name(tmp_path: Path) -> None:
    doc = json.loads((REPO / "notebooks" / "run_study.ipynb").read_text())
    doc["metadata"]["papermill"] = {"parameters": {"prereg": "prereg/demo", "stage": "A",
                                                   "results": str(tmp_path / "nowhere")}}
    copy = tmp_path / "run_study.ipynb"  # no end times: it would count as cut short
    copy.write_text(json.dumps(doc))
    with pytest.raises(Refusal) as caught:
        anchor_executed(copy, cwd=REPO)
    assert caught.value.code == "notebook_not_executed" and "no stage folder" in caught.value.message
    assert copy.exists() and not list(tmp_path.glob("*.interrupted-*"))
