"""harness.evidence.git: proctor's git reads a hostile `.git` as data and never runs what it names.

Each attack (tests/support/hostile_git.py) is first shown to work under plain
git (its marker appears), then every git command proctor runs is run against
the same repository and the marker must stay absent.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.evidence.checkout import checkout_of
from harness.evidence.git import (
    GIT_OPTIONS,
    git_dir_snapshot,
    git_env,
    head_blobs,
    run_git,
    snapshot_changes,
)
from harness.gate.state import workspace_root
from tests.support.hostile_git import KEYS, plant, set_off
from tests.support.tasks import git_repo


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "ws"
    (repo / "pkg").mkdir(parents=True)
    (repo / "a.py").write_text("print('a')\n")
    (repo / "pkg" / "b.py").write_text("print('b')\n")
    return git_repo(repo)


def _committed(repo: Path) -> dict[bytes, bytes]:
    return {b"a.py": b"print('a')\n", b"pkg/b.py": b"print('b')\n"}


@pytest.mark.parametrize("key", KEYS)
def test_each_plant_runs_its_command_under_plain_git(tmp_path: Path, key: str) -> None:
    repo = _repo(tmp_path)
    markers = tmp_path / "markers"
    argv = plant(repo, key, markers)
    set_off(repo, argv)
    assert (markers / key).exists(), f"the {key} plant did not fire under plain git: the attack tests would be empty"


@pytest.mark.parametrize("key", KEYS)
def test_proctors_git_runs_nothing_a_hostile_git_folder_names(tmp_path: Path, key: str) -> None:
    repo = _repo(tmp_path)
    markers = tmp_path / "markers"
    plant(repo, key, markers)
    assert workspace_root(repo) == os.path.realpath(repo)
    blobs = head_blobs(str(repo), [b"a.py", b"pkg/b.py", b"missing.py"])
    assert run_git(["--version"], git_dir=None).returncode == 0
    assert list(markers.iterdir()) == []
    expected = _committed(repo)
    if key == "promisor":
        del expected[b"a.py"]  # its object was deleted: missing, never fetched
    assert blobs == expected


@pytest.mark.parametrize("key", ["fsmonitor", "hooks", "promisor", "pager", "diff_external", "ssh_command"])
def test_git_options_override_what_a_repository_config_sets(tmp_path: Path, key: str) -> None:
    """Defence in depth: even a git run that reads the repository's config gets GIT_OPTIONS on top."""
    repo = _repo(tmp_path)
    markers = tmp_path / "markers"
    argv = plant(repo, key, markers)
    options = [word for option in GIT_OPTIONS for word in ("-c", option)]
    set_off(repo, ["git", "--no-pager", *options, *argv[1:]], env=git_env())
    assert list(markers.iterdir()) == []


def test_run_git_runs_only_the_built_ins_proctor_uses(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    markers = tmp_path / "markers"
    plant(repo, "alias", markers)
    for args in (["evidence"], ["log"], ["fetch"], ["-c", "x=y", "status"], []):
        with pytest.raises(ValueError, match="proctor runs no git"):
            run_git(args, git_dir=str(repo / ".git"))
    assert list(markers.iterdir()) == []


def test_head_blobs_ignores_the_callers_git_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    (tmp_path / "other").mkdir()
    other = git_repo(tmp_path / "other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(other / ".git" / "objects"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.fsmonitor'='/bin/false'")
    assert head_blobs(str(repo), [b"a.py"]) == {b"a.py": b"print('a')\n"}


def test_head_blobs_follows_packed_refs_and_a_linked_worktree(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    subprocess.run(["git", "-C", str(repo), "pack-refs", "--all"], check=True)
    linked = tmp_path / "linked"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", str(linked)], check=True, capture_output=True)
    assert head_blobs(str(repo), [b"pkg/b.py"]) == {b"pkg/b.py": b"print('b')\n"}
    assert head_blobs(str(linked), [b"a.py"]) == {b"a.py": b"print('a')\n"}
    assert workspace_root(linked) == os.path.realpath(linked)


def test_a_folder_without_its_own_git_folder_is_no_workspace(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert head_blobs(str(repo / "pkg"), [b"b.py"]) == {}
    (repo / "pkg" / ".git").write_text("not a gitdir line\n")
    assert head_blobs(str(repo / "pkg"), [b"b.py"]) == {}


@pytest.mark.parametrize(
    "change",
    ["config", "new_hook", "chmod", "same_size_same_mtime", "replace_with_link", "remove_object"],
)
def test_the_snapshot_sees_every_change_to_the_git_folder(tmp_path: Path, change: str) -> None:
    repo = _repo(tmp_path)
    git = repo / ".git"
    before = git_dir_snapshot(str(repo))
    assert snapshot_changes(before, git_dir_snapshot(str(repo))) == []
    config = git / "config"
    if change == "config":
        with config.open("a") as fh:
            fh.write("[core]\n\tfsmonitor = /bin/true\n")
        expect = str(config)
    elif change == "new_hook":
        (git / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
        expect = str(git / "hooks" / "post-checkout")
    elif change == "chmod":
        (git / "HEAD").chmod(0o777)
        expect = str(git / "HEAD")
    elif change == "same_size_same_mtime":
        st = os.stat(config)
        text = config.read_bytes()
        config.write_bytes(text.replace(b"bare", b"BARE"))  # same size
        os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back; ctime cannot be
        expect = str(config)
    elif change == "replace_with_link":
        (git / "description").unlink()
        (git / "description").symlink_to("/etc/passwd")
        expect = str(git / "description")
    else:
        loose = sorted(p for p in (git / "objects").glob("??/*"))[0]
        loose.chmod(0o644)
        loose.unlink()
        expect = str(loose)
    assert expect in snapshot_changes(before, git_dir_snapshot(str(repo)))


@pytest.mark.parametrize("key", ["fsmonitor", "hooks", "promisor", "pager", "diff_external", "alias", "ssh_command"])
def test_the_provenance_checks_git_runs_nothing_planted_either(tmp_path: Path, key: str) -> None:
    """`checkout_of` runs `rev-parse` and `status` on a checkout through `run_git` too (not filters:
    that checkout is the operator's own project, docs/sandbox.md)."""
    repo = _repo(tmp_path)
    markers = tmp_path / "markers"
    plant(repo, key, markers)
    commit, _ = checkout_of(repo / "pkg")
    assert len(commit) == 40
    assert list(markers.iterdir()) == []
