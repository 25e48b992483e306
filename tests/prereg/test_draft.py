"""`harness.prereg.draft.draft_prereg`: a preregistration folder written from parameters (new_study.ipynb).

A draft is checked as `prereg check` checks it and freezes, plans and round-trips; every bad parameter is
refused naming it, and on any refusal nothing is written (no folder, no leftover temporary folder).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from harness import check_prereg, draft_prereg
from harness.errors import Code, Refusal
from harness.prereg.draft import RUN_DEFAULTS
from harness.prereg.freeze import freeze
from harness.prereg.plan import plan_study
from tests.support.paths import REPO


def params(**changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "study": "draft-test", "title": "A drafted study", "question": "Is b within 0.2 of a?", "seed": 7,
        "suite": "humaneval", "draw": 30,
        "systems": {"a": {"model": "sim-flash", "cap_usd": 2.0}, "b": {"model": "sim-k3", "cap_usd": 2.0,
                                                                         "setting": "default"}},
        "arms": {"direct": "Solve it.\n\n{prompt}"},
        "stages": [{"id": "A", "systems": ["a", "b"], "arms": ["direct"], "items": 10},
                   {"id": "B", "systems": ["a", "b"], "arms": ["direct"], "items": 30, "repeats": 1}],
        "comparisons": [{"a": "a", "b": "b", "arm": "direct", "margin": 0.2, "expected_a": 0.7,
                         "expected_b": 0.75, "correlation": 0.5}],
        "budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": 4.0, "ceiling_margin_usd": 0.2},
        "root": REPO,
    }
    out.update(changes)
    return out


def nothing_written(parent: Path) -> bool:
    return not parent.exists() or list(parent.iterdir()) == []


def test_a_draft_is_checked_frozen_and_planned(tmp_path: Path) -> None:
    folder = tmp_path / "prereg" / "draft-test"
    got = draft_prereg(folder, **params())
    assert got.files == ("design.toml", "PREREG.md", "systems.json")
    assert sorted(p.name for p in folder.iterdir()) == ["PREREG.md", "design.toml", "systems.json"]
    assert [p.name for p in folder.parent.iterdir()] == ["draft-test"]  # no temporary folder left
    design = tomllib.loads((folder / "design.toml").read_text())
    # systems come from the catalog: provider and pricing key as it names them
    assert [(s["slot"], s["provider"], s["model"], s["pricing_key"]) for s in design["systems"]] == [
        ("a", "sim", "sim-flash", "sim-flash"), ("b", "sim", "sim-k3", "sim-k3")]
    assert design["stages"][0]["repeats"] == 1 and design["run"] == dict(RUN_DEFAULTS)
    assert design["budgets"]["spend_before_usd"] == 0.0
    assert design["arms"][0]["template"] == "Solve it.\n\n{prompt}"
    assert json.loads((folder / "systems.json").read_text())["systems"][1] == {
        "slot": "b", "provider": "sim", "model": "sim-k3", "setting": "default"}
    assert "Is b within 0.2 of a?" in (folder / "PREREG.md").read_text()
    report = check_prereg(folder)
    assert report["frozen"]["state"] == "unfrozen" and report["cells_total"] == 80
    assert [c["margin"] for c in report["power"]] == [0.2]
    assert got.design.sha256 == report["design_sha256"]
    assert not (folder / "FROZEN.json").exists()  # freezing is a separate step
    freeze(folder)
    assert check_prereg(folder)["frozen"]["state"] == "frozen"
    plan = plan_study(folder, "@stages")
    assert plan is not None


def test_text_with_quotes_newlines_and_unicode_round_trips(tmp_path: Path) -> None:
    template = 'Say "hi" \\ tab\there \u00e9\u2713 \x7f\n{prompt}'
    draft_prereg(tmp_path / "p", **params(title='Q "x" \u00e9', arms={"direct": template}))
    design = tomllib.loads((tmp_path / "p" / "design.toml").read_text())
    assert design["arms"][0]["template"] == template and design["study"]["title"] == 'Q "x" \u00e9'


def test_an_empty_folder_is_used_and_a_non_empty_one_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    draft_prereg(tmp_path / "empty", **params())
    assert (tmp_path / "empty" / "design.toml").is_file()
    before = (tmp_path / "empty" / "design.toml").read_bytes()
    with pytest.raises(Refusal) as got:
        draft_prereg(tmp_path / "empty", **params(title="another"))
    assert got.value.code == Code.DRAFT_FOLDER_EXISTS
    assert (tmp_path / "empty" / "design.toml").read_bytes() == before  # a registration is never written over
    (tmp_path / "file").write_text("x")
    with pytest.raises(Refusal) as got:
        draft_prereg(tmp_path / "file", **params())
    assert got.value.code == Code.DRAFT_FOLDER_EXISTS


@pytest.mark.parametrize(("changes", "code", "field"), [
    ({"systems": {}}, Code.DRAFT_INVALID, "systems"),
    ({"systems": {"a": {"model": "sim-flash"}}}, Code.DRAFT_INVALID, "systems.a"),
    ({"systems": {"a": {"model": "sim-flash", "cap_usd": 1, "price": 2}}}, Code.DRAFT_INVALID, "systems.a"),
    ({"arms": {"direct": ""}}, Code.DRAFT_INVALID, "arms.direct"),
    ({"stages": "A"}, Code.DRAFT_INVALID, "stages"),
    ({"stages": [{"id": "A", "systems": ["a"], "arms": ["direct"]}]}, Code.DRAFT_INVALID, "stages[0]"),
    ({"comparisons": [{"a": "a", "b": "b", "arm": "direct"}]}, Code.DRAFT_INVALID, "comparisons[0]"),
    ({"budgets": {"overall_cap_usd": 1.0}}, Code.DRAFT_INVALID, "budgets"),
    ({"run": {"lanes": 2}}, Code.DRAFT_INVALID, "run"),
    ({"seed": "7"}, Code.DRAFT_INVALID, "seed"),
    ({"draw": True}, Code.DRAFT_INVALID, "draw"),
    ({"question": " "}, Code.DRAFT_INVALID, "question"),
    ({"budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": float("nan"), "ceiling_margin_usd": 0.2}},
     Code.DRAFT_INVALID, "budgets.overall_cap_usd"),
])
def test_bad_parameters_are_refused_naming_the_field_and_nothing_is_written(
    tmp_path: Path, changes: dict[str, Any], code: Code, field: str
) -> None:
    with pytest.raises(Refusal) as got:
        draft_prereg(tmp_path / "prereg" / "x", **params(**changes))
    assert got.value.code == code and got.value.details["field"] == field, got.value
    assert nothing_written(tmp_path / "prereg")


@pytest.mark.parametrize(("changes", "code"), [
    ({"suite": "nosuch"}, Code.DRAFT_UNKNOWN_SUITE),
    ({"suite": "../evals/humaneval"}, Code.DRAFT_UNKNOWN_SUITE),
    ({"systems": {"a": {"model": "sim-nosuch", "cap_usd": 1.0}}}, Code.UNKNOWN_MODEL),
    ({"study": "bad id"}, Code.DESIGN_INVALID),
    ({"stages": [{"id": "A", "systems": ["a", "b"], "arms": ["direct"], "items": 31}]}, Code.DESIGN_INVALID),
    ({"comparisons": [{"a": "a", "b": "a", "arm": "direct", "margin": 0.2, "expected_a": 0.7, "expected_b": 0.7,
                       "correlation": 0.5}]}, Code.DESIGN_INVALID),
    ({"test": "t_test"}, Code.DESIGN_INVALID),
    ({"draw": 500}, Code.DRAW_EXCEEDS_PACKET),
])
def test_what_the_suite_catalog_or_design_refuses_is_refused_before_anything_is_written(
    tmp_path: Path, changes: dict[str, Any], code: Code
) -> None:
    with pytest.raises(Refusal) as got:
        draft_prereg(tmp_path / "prereg" / "x", **params(**changes))
    assert got.value.code == code, got.value
    assert nothing_written(tmp_path / "prereg")


def test_a_catalog_and_pricing_of_the_study_are_copied_in_and_resolve_its_systems(tmp_path: Path) -> None:
    local = REPO / "prereg" / "local-gemma"
    catalog = tomllib.loads((local / "catalog.toml").read_text())
    model = catalog["model"][0]["id"]
    folder = tmp_path / "p"
    draft_prereg(folder, **params(systems={"a": {"model": model, "cap_usd": 1.0},
                                           "b": {"model": model, "cap_usd": 1.0, "setting": "other"}}),
                 catalog=local / "catalog.toml", pricing=local / "pricing.yaml")
    assert (folder / "catalog.toml").read_bytes() == (local / "catalog.toml").read_bytes()
    assert check_prereg(folder)["resolved"]["catalog"] == str(folder / "catalog.toml")
