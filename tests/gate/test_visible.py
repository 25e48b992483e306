"""The visible-test gate (`harness.gate.visible`): the pinned verifier on a fresh copy, sealed files as pinned, no
hidden input; on real mutant tasks (evals/mutants), in the real sandbox."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.errors import Refusal
from harness.evals.mutants import mutant_item, write_task
from harness.evals.suite import load_suite
from harness.gate.initialize import init_workspace
from harness.gate.verify import verify
from harness.gate.visible import gate_visible
from tests.support.repo_study import MUTANTS

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the gate's sandbox needs bwrap")

DETECTED = "inflection-0.5.1-m04"  # the visible tests catch this mutation
UNSEEN = "inflection-0.5.1-m00"  # only the hidden tests catch this one


def _task(tmp_path: Path, item: str) -> tuple[str, str, str, Path]:
    mutant = mutant_item(load_suite(str(MUTANTS)), item)
    task = write_task(mutant, tmp_path / "task")
    ws, state = str(tmp_path / "task" / "workspace"), str(tmp_path / "state")
    init_workspace(ws, task, state)
    snap = mutant.record["snapshot"]
    original = Path(mutant.private_path(snap["tree"])) / snap["mutation"]["path"]
    return ws, task, state, original


def test_the_gate_fails_a_detected_mutation_and_passes_its_fix(tmp_path: Path) -> None:
    ws, task, state, original = _task(tmp_path, DETECTED)
    failed = gate_visible(ws, task, state)
    assert not failed.passed and failed.exit_code == 1 and not failed.timed_out
    assert b"failed" in failed.output and failed.evidence().endswith(failed.output.decode()[-100:])
    assert b"test_inflection.py" not in failed.output  # the hidden tests' file was never laid
    shutil.copyfile(original, Path(ws) / "inflection" / "__init__.py")
    fixed = gate_visible(ws, task, state)
    assert fixed.passed and fixed.exit_code == 0 and fixed.tree != failed.tree
    assert verify(ws, task, state).passed  # and the hidden tests agree


def test_the_gate_runs_the_sealed_visible_tests_whatever_the_worker_left(tmp_path: Path) -> None:
    ws, task, state, _ = _task(tmp_path, DETECTED)
    (Path(ws) / "test_inflection_visible.py").write_text("def test_nothing():\n    assert True\n")
    seen = gate_visible(ws, task, state)
    assert not seen.passed and b"1 passed" not in seen.output  # the pinned tests ran, not the worker's
    assert (Path(ws) / "test_inflection_visible.py").read_text().startswith("def test_nothing")  # workspace untouched


def test_the_gate_passes_what_only_the_hidden_tests_catch(tmp_path: Path) -> None:
    ws, task, state, _ = _task(tmp_path, UNSEEN)
    assert gate_visible(ws, task, state).passed  # a gate is weaker than the verdict: the cascade's false pass
    assert not verify(ws, task, state).passed


def test_the_gate_refuses_an_uninitialized_workspace(tmp_path: Path) -> None:
    mutant = mutant_item(load_suite(str(MUTANTS)), DETECTED)
    task = write_task(mutant, tmp_path / "task")
    with pytest.raises(Refusal) as caught:
        gate_visible(str(tmp_path / "task" / "workspace"), task, str(tmp_path / "state"))
    assert caught.value.code == "not_initialized"


def test_the_gate_reports_its_per_test_results_and_fingerprint_as_verify_reads_them(tmp_path: Path) -> None:
    # issue 17 item 9: a cascade's switch rule reads these; the ids are the sealed tests' only (no hidden one)
    ws, task, state, original = _task(tmp_path, "inflection-0.5.1-m09")
    failed = gate_visible(ws, task, state)
    assert not failed.passed and failed.tests_failing == ("test_inflection_visible.py::test_tableize",)
    assert failed.tests_expected is not None and failed.tests_expected >= 4
    again = gate_visible(ws, task, state)
    assert failed.fingerprint and again.fingerprint == failed.fingerprint  # the copy's folder is normalized away
    shutil.copyfile(original, Path(ws) / "inflection" / "__init__.py")
    fixed = gate_visible(ws, task, state)
    assert fixed.passed and fixed.fingerprint is None
    assert fixed.tests_failing == () and fixed.tests_expected == failed.tests_expected
