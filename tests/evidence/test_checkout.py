"""The checkout's commit and dirtiness, in a real git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.evidence.checkout import UNKNOWN, checkout_of, package_checkout


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_the_commit_and_whether_tracked_files_outside_results_changed(tmp_path: Path) -> None:
    assert checkout_of(tmp_path) == (UNKNOWN, None)  # not a checkout
    _git(tmp_path, "init", "-q")
    assert checkout_of(tmp_path) == (UNKNOWN, None)  # no commit yet
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "log.jsonl").write_text("{}\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert checkout_of(tmp_path / "results") == (head, False)
    (tmp_path / "results" / "log.jsonl").write_text("{}\n{}\n")  # a run appending to committed results
    (tmp_path / "new.txt").write_text("untracked\n")
    assert checkout_of(tmp_path) == (head, False)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert checkout_of(tmp_path) == (head, True)


def test_the_package_checkout_is_this_repository() -> None:
    commit, dirty = package_checkout()
    assert commit == UNKNOWN or (len(commit) == 40 and dirty in (True, False))
