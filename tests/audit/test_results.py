"""A results folder as one study (`harness.audit.results`): discovery at three depths, the
preregistration found by its freeze's sha256, and the refusals for folders that are not one study."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.audit.results import find_prereg, find_stages, open_study, stage_folders
from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.prereg.frozen import check_frozen
from harness.run.setup import stage_plan_bytes
from tests.support.study import prereg


def _stage(results: Path, prereg_dir: Path, stage: str = "A", *, study: str = "rt") -> Path:
    """A stage folder holding the frozen preregistration's plan (its study renamed when asked)."""
    frozen = check_frozen(prereg_dir)
    raw = stage_plan_bytes(frozen.path, frozen.design, "A")
    if study != "rt":
        lines = [json.loads(line) for line in raw.splitlines()]
        raw = b"".join(canonical_bytes({**obj, "study": study}) + b"\n" for obj in lines)
    folder = results / study / stage
    folder.mkdir(parents=True)
    (folder / "plan.jsonl").write_bytes(raw)
    return folder


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository root holding `prereg/rt` (frozen)."""
    prereg(tmp_path, items=3)
    return tmp_path


def test_results_study_and_stage_folders_name_the_same_study(repo: Path) -> None:
    results = repo / "results"
    a = _stage(results, repo / "prereg" / "rt", "A")
    b = _stage(results, repo / "prereg" / "rt", "B")
    frozen_sha = sha256_hex(read_bytes(repo / "prereg" / "rt" / "FROZEN.json"))
    for path, stages in ((results, [a, b]), (results / "rt", [a, b]), (a, [a])):
        found = open_study(path, root=repo)
        assert found.study == "rt" and found.folder == str(results / "rt")
        assert [s.folder for s in found.stages] == [str(s) for s in stages]
        assert found.prereg == str(repo / "prereg" / "rt") and found.frozen_sha256 == frozen_sha
    assert [s.stage for s in find_stages(results)] == ["A", "A"]  # the plan header names its stage


def test_stage_folders_skip_links_and_dot_folders(repo: Path) -> None:
    results = repo / "results"
    a = _stage(results, repo / "prereg" / "rt", "A")
    shutil.copytree(a, results / "rt" / ".hidden")
    (results / "rt" / "linked").symlink_to(a, target_is_directory=True)
    assert stage_folders(results) == [str(a)]
    assert stage_folders(repo / "nowhere") == []


def test_two_studies_are_mixed(repo: Path) -> None:
    results = repo / "results"
    _stage(results, repo / "prereg" / "rt", study="rt")
    _stage(results, repo / "prereg" / "rt", study="other")
    with pytest.raises(Refusal) as caught:
        open_study(results, root=repo)
    assert caught.value.code == "results_mixed" and "rt" in caught.value.message
    assert caught.value.path == str(results)


def test_plans_naming_two_freezes_are_mixed(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    results = repo / "results"
    _stage(results, repo / "prereg" / "rt", "A")
    other = prereg(tmp_path_factory.mktemp("other"), items=4)  # the same study id, another freeze
    _stage(results, other, "B")
    with pytest.raises(Refusal) as caught:
        open_study(results / "rt", root=repo)
    assert caught.value.code == "results_mixed" and "freezes" in caught.value.message


def test_no_stage_and_no_preregistration_are_refused(repo: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (empty, tmp_path / "missing"):
        with pytest.raises(Refusal) as caught:
            find_stages(path)
        assert caught.value.code == "results_not_found" and caught.value.path == str(path)
    with pytest.raises(Refusal) as caught:
        find_prereg("0" * 64, repo)
    assert caught.value.code == "prereg_not_found" and "rt" in caught.value.message
    _stage(repo / "results", repo / "prereg" / "rt")
    (repo / "prereg" / "rt" / "FROZEN.json").write_text("{}")  # the recorded freeze is gone
    with pytest.raises(Refusal) as caught:
        open_study(repo / "results", root=repo)
    assert caught.value.code == "prereg_not_found"
    given = open_study(repo / "results", prereg=repo / "prereg" / "rt", root=repo)  # named: taken as given
    assert given.prereg == str(repo / "prereg" / "rt")
