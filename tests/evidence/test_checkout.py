"""The checkout's commit and dirtiness, in a real git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.evidence.checkout import UNKNOWN, checkout_of, package_checkout
from harness.records import provenance
from harness.records.provenance import current_provenance, provenance_soon


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


def test_provenance_found_on_a_thread_is_the_provenance_found_now() -> None:
    soon = provenance_soon()
    assert soon() == current_provenance()
    assert soon() == current_provenance()  # the answer is kept: a second call does not wait again


def test_provenance_found_on_a_thread_raises_what_the_thread_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> tuple[str, bool | None]:
        raise OSError("no git here")

    monkeypatch.setattr(provenance, "package_checkout", broken)
    soon = provenance_soon()
    with pytest.raises(OSError, match="no git here"):
        soon()
