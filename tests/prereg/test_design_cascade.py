"""Cascade arms in design.toml (issue 17 item 5): declared, planned once per item under the first system, and
every bad declaration refused by name before the freeze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.prereg.design import load_design
from harness.prereg.freeze import freeze
from tests.support.design import write_prereg
from tests.support.repo_study import MUTANTS, repo_prereg

CASCADE = {"id": "cascade", "template": "{prompt}", "cascade": ["cheap", "strong"]}
SINGLE = {"id": "single", "template": "{prompt}"}


def _with_cascade(cascade: Any) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        doc["arms"].append({"id": "cascade", "template": "{prompt}", "cascade": cascade})
        doc["stages"][1]["arms"].append("cascade")
    return apply


def test_a_cascade_arm_reads_with_its_systems_in_order(tmp_path: Path) -> None:
    design = load_design(write_prereg(tmp_path, _with_cascade(["strong", "cheap"])) / "design.toml")
    arm = design.arm("cascade")
    assert arm.cascade == ("strong", "cheap")
    assert arm.entry("strong") and not arm.entry("cheap")
    assert design.arm("direct").cascade is None and design.arm("direct").entry("cheap")


@pytest.mark.parametrize(("cascade", "code"), [
    (["cheap", "middle"], "cascade_system_unknown"),
    (["cheap"], "cascade_too_short"),
    (["cheap", "cheap"], "cascade_too_short"),
    ([], "cascade_too_short"),
    ("cheap,strong", "design_invalid"),
    ([1, 2], "design_invalid"),
])
def test_a_bad_cascade_is_refused_by_name(tmp_path: Path, cascade: Any, code: str) -> None:
    with pytest.raises(Refusal) as caught:
        load_design(write_prereg(tmp_path, _with_cascade(cascade)) / "design.toml")
    assert caught.value.code == code, caught.value.message
    assert "arms[2].cascade" in caught.value.message


def test_a_stage_running_a_cascade_without_its_first_system_is_refused(tmp_path: Path) -> None:
    def apply(doc: dict[str, Any]) -> None:
        _with_cascade(["cheap", "strong"])(doc)
        doc["stages"][1]["systems"] = ["strong"]
        doc["analysis"]["comparisons"][0]["arm"] = "direct"
        doc["stages"][0]["systems"] = ["cheap", "strong"]
    with pytest.raises(Refusal) as caught:
        load_design(write_prereg(tmp_path, apply) / "design.toml")
    assert caught.value.code == "cascade_system_unknown" and "stage B" in caught.value.message


def test_a_comparison_on_a_cascade_arm_is_refused(tmp_path: Path) -> None:
    def apply(doc: dict[str, Any]) -> None:
        _with_cascade(["cheap", "strong"])(doc)
        doc["analysis"]["comparisons"][0]["arm"] = "cascade"
    with pytest.raises(Refusal) as caught:
        load_design(write_prereg(tmp_path, apply) / "design.toml")
    assert caught.value.code == "design_invalid" and "is a cascade" in caught.value.message


def test_a_cascade_on_a_completion_suite_is_refused_before_the_freeze(tmp_path: Path) -> None:
    folder = write_prereg(tmp_path, _with_cascade(["cheap", "strong"]))
    with pytest.raises(Refusal) as caught:
        freeze(folder)
    assert caught.value.code == "cascade_not_repo_task"
    assert not (folder / "FROZEN.json").exists()


def test_a_cascade_arm_is_planned_once_per_item_under_its_first_system(tmp_path: Path) -> None:
    from harness.prereg.plan import plan_study

    folder = repo_prereg(tmp_path, arms=[SINGLE, CASCADE], suite=MUTANTS, items=3)
    plan = plan_study(folder, "@stages")
    cells = [(c.system, c.arm) for c in plan.cells]
    assert sorted(cells) == sorted([("cheap", "single")] * 3 + [("strong", "single")] * 3 + [("cheap", "cascade")] * 3)


def test_targeted_repair_is_registered_on_a_cascade_arm_and_off_by_default(tmp_path: Path) -> None:
    def apply(doc: dict[str, Any]) -> None:
        _with_cascade(["cheap", "strong"])(doc)
        doc["arms"][-1]["targeted_repair"] = True

    design = load_design(write_prereg(tmp_path / "on", apply) / "design.toml")
    assert design.arm("cascade").targeted_repair is True and design.arm("direct").targeted_repair is False
    plain = load_design(write_prereg(tmp_path / "off", _with_cascade(["cheap", "strong"])) / "design.toml")
    assert plain.arm("cascade").targeted_repair is False


@pytest.mark.parametrize(("arm", "value"), [(0, True), (-1, "yes"), (-1, 1)])
def test_targeted_repair_off_a_cascade_or_not_a_boolean_is_refused(tmp_path: Path, arm: int, value: Any) -> None:
    def apply(doc: dict[str, Any]) -> None:
        _with_cascade(["cheap", "strong"])(doc)
        doc["arms"][arm]["targeted_repair"] = value

    with pytest.raises(Refusal) as caught:
        load_design(write_prereg(tmp_path, apply) / "design.toml")
    assert caught.value.code == "design_invalid" and "targeted_repair" in caught.value.message
