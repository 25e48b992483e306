"""A repo_task suite is checked whole before a freeze (`harness.evals.tasks.check_task_suite`, called by
`prereg check` and `freeze`): a changed snapshot, a snapshot that is not a plain sealed tree (a git repository,
clean, dirty or with untracked files, a bare one, unsealed caches), task file or hidden test, a hidden test inside the snapshot,
and a system whose catalog model has no worker are each refused by name before anything is frozen."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.errors import Code, Refusal
from harness.evals.tasks import build_tasks, check_task_suite
from harness.evidence.tree import tree_signature
from harness.prereg.check import check_prereg
from harness.prereg.freeze import freeze
from harness.providers.catalog import BUNDLED_CATALOG
from tests.support.paths import REPO, TASKS
from tests.support.repo_study import repo_prereg


def _suite(root: Path) -> Path:
    """A copy of the bundled tasks and their suite, laid out as in the repository (root/evals/...)."""
    shutil.copytree(TASKS, root / "evals" / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    build_tasks(root / "evals" / "tasks-suite", tasks_dir=root / "evals" / "tasks")
    return root / "evals" / "tasks-suite"


def _refused(suite: Path) -> Refusal:
    with pytest.raises(Refusal) as caught:
        check_task_suite(suite)
    return caught.value


def test_the_bundled_suite_checks_whole() -> None:
    assert check_task_suite(REPO / "evals" / "tasks-suite") == 4


@pytest.mark.parametrize("change", ["snapshot", "task", "hidden"])
def test_an_item_changed_after_the_suite_was_sealed_is_refused_naming_it(tmp_path: Path, change: str) -> None:
    suite = _suite(tmp_path)
    task = tmp_path / "evals" / "tasks" / "wordfreq"
    target = {"snapshot": task / "workspace" / "wordfreq" / "counter.py", "task": task / "task.json",
              "hidden": task / "hidden" / "test_hidden.py"}[change]
    target.write_text(target.read_text().replace("\n", "\n\n", 1))
    refusal = _refused(suite)
    assert refusal.code == Code.SUITE_ITEM_CHANGED and refusal.details["item"] == "wordfreq-case-fold"


def test_a_hidden_test_inside_the_snapshot_is_refused(tmp_path: Path) -> None:
    root = tmp_path
    shutil.copytree(TASKS, root / "evals" / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    task = root / "evals" / "tasks" / "wordfreq"
    shutil.copy(task / "hidden" / "test_hidden.py", task / "workspace" / "hidden_copy.py")
    doc = json.loads((task / "task.json").read_text())
    doc["verifier"]["hidden"] = [{"from": "workspace/hidden_copy.py", "to": "tests/test_hidden.py"}]
    (task / "task.json").write_text(json.dumps(doc))
    build_tasks(root / "evals" / "tasks-suite", tasks_dir=root / "evals" / "tasks")
    refusal = _refused(root / "evals" / "tasks-suite")
    assert refusal.code == Code.HIDDEN_INPUT_INSIDE_WORKSPACE and refusal.details["item"] == "wordfreq-case-fold"


def test_prereg_check_and_freeze_refuse_a_changed_suite_and_a_model_without_a_worker(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    (tmp_path / "evals" / "tasks" / "bizdays" / "workspace" / "bizdays" / "planted.py").write_text("x = 1\n")
    folder = repo_prereg(tmp_path / "a", suite=suite, frozen=False)
    for call in (check_prereg, freeze):
        with pytest.raises(Refusal) as caught:
            call(folder)
        assert caught.value.code == Code.SUITE_ITEM_CHANGED
    assert not (folder / "FROZEN.json").exists()
    # the bundled suite with a catalog whose models have no worker: refused before the freeze
    no_workers = re.sub(r"\[model\.worker\]\nargv = .*\nnetwork = .*\n", "", BUNDLED_CATALOG.read_text())
    assert "[model.worker]" not in no_workers
    with pytest.raises(Refusal) as caught:
        repo_prereg(tmp_path / "b", catalog=no_workers)
    assert caught.value.code == Code.MODEL_HAS_NO_WORKER and caught.value.details["system"] == "cheap"
    assert not (tmp_path / "b" / "prereg" / "rt" / "FROZEN.json").exists()


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                   check=True, capture_output=True)  # fmt: skip


def _unclean(snapshot: Path, how: str) -> None:
    """Make the item's snapshot something other than the plain sealed tree."""
    if how == "bare":
        shutil.rmtree(snapshot)
        snapshot.mkdir()
        _git(snapshot, "init", "-q", "--bare")
        return
    if how == "cache":
        (snapshot / "wordfreq" / "__pycache__").mkdir()
        (snapshot / "wordfreq" / "__pycache__" / "counter.cpython-312.pyc").write_bytes(b"\0planted")
        return
    if how == "stray-pyc":
        (snapshot / "wordfreq" / "counter.pyc").write_bytes(b"\0planted")
        return
    if how == "gitfile":
        (snapshot / ".git").write_text("gitdir: /elsewhere/.git\n")
        return
    _git(snapshot, "init", "-q")
    _git(snapshot, "add", "-A")
    _git(snapshot, "commit", "-q", "-m", "snapshot")
    if how == "repo-dirty":
        counter = snapshot / "wordfreq" / "counter.py"
        counter.write_text(counter.read_text() + "# dirty\n")
    elif how == "repo-untracked":
        (snapshot / "notes.txt").write_text("untracked\n")
    elif how == "nested-repo":
        shutil.move(str(snapshot / ".git"), str(snapshot / "wordfreq" / ".git"))


@pytest.mark.parametrize("how", ["repo-clean", "repo-dirty", "repo-untracked", "nested-repo", "gitfile", "bare",
                                 "cache", "stray-pyc"])  # fmt: skip
def test_a_snapshot_that_is_not_a_plain_sealed_tree_is_refused_by_name(tmp_path: Path, how: str) -> None:
    suite = _suite(tmp_path)
    _unclean(tmp_path / "evals" / "tasks" / "wordfreq" / "workspace", how)
    refusal = _refused(suite)
    assert refusal.code == Code.SUITE_SNAPSHOT_UNCLEAN, refusal
    assert refusal.details["item"] == "wordfreq-case-fold"
    assert ("bare git repository" if how == "bare" else "git repository" if "repo" in how or how == "gitfile"
            else "the seal does not cover") in refusal.message  # fmt: skip


def test_a_top_level_git_folder_escapes_the_seal_so_it_is_refused_before_the_tree_check(tmp_path: Path) -> None:
    # The tree signature leaves the top-level .git out: without this check a snapshot carrying its own
    # repository (history, config, hooks) would pass as the sealed tree.
    suite = _suite(tmp_path)
    snapshot = tmp_path / "evals" / "tasks" / "wordfreq" / "workspace"
    before = tree_signature(str(snapshot)).digest
    _unclean(snapshot, "repo-clean")
    assert tree_signature(str(snapshot)).digest == before
    assert _refused(suite).code == Code.SUITE_SNAPSHOT_UNCLEAN


def test_prereg_check_and_freeze_refuse_an_unclean_snapshot(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    _unclean(tmp_path / "evals" / "tasks" / "bizdays" / "workspace", "repo-untracked")
    folder = repo_prereg(tmp_path / "a", suite=suite, frozen=False)
    for call in (check_prereg, freeze):
        with pytest.raises(Refusal) as caught:
            call(folder)
        assert caught.value.code == Code.SUITE_SNAPSHOT_UNCLEAN
    assert not (folder / "FROZEN.json").exists()
