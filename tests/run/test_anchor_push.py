"""The anchor command: snapshots of a stage's results pushed to a git remote, never forced."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.evidence.chain import ChainedLog
from harness.run.anchor_push import push_snapshot, take_snapshot


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _stage(tmp_path: Path) -> Path:
    stage = tmp_path / "results" / "demo" / "A"
    stage.mkdir(parents=True)
    ChainedLog(stage / "run.jsonl", "seed").append({"event": "start"})
    (stage / "plan.jsonl").write_text("{}\n")
    (stage / ".invocation.lock").write_text("123\n")
    (stage / "receipts").mkdir()
    (stage / "receipts" / "r1.json").write_text("{}")
    (stage / "link").symlink_to("/etc/passwd")
    return stage


def test_snapshots_are_committed_and_pushed(tmp_path: Path) -> None:
    remote = tmp_path / "anchors.git"
    _git("init", "--quiet", "--bare", str(remote), cwd=tmp_path)
    stage = _stage(tmp_path)
    snapshot = tmp_path / "snap"
    copied = take_snapshot(str(stage), str(snapshot))
    assert sorted(copied) == ["plan.jsonl", "receipts/r1.json", "run.jsonl"]  # no lock, no link
    clone = tmp_path / "clone"
    first = push_snapshot(str(snapshot), str(remote), "demo/A", label="periodic", clone=str(clone), timeout_s=60)
    assert first["ok"], first
    ChainedLog(stage / "run.jsonl", "seed").append({"event": "end"})
    take_snapshot(str(stage), str(snapshot))
    second = push_snapshot(str(snapshot), str(remote), "demo/A", label="end", clone=str(clone), timeout_s=60)
    assert second["ok"], second
    log = _git("--git-dir", str(remote), "log", "--format=%s", cwd=tmp_path).splitlines()
    assert log == ["proctor anchor: demo/A (end)", "proctor anchor: demo/A (periodic)"]
    pushed = _git("--git-dir", str(remote), "show", "HEAD:demo/A/run.jsonl", cwd=tmp_path)
    assert pushed.encode() + b"\n" == (stage / "run.jsonl").read_bytes()


def test_a_diverged_remote_is_never_forced(tmp_path: Path) -> None:
    remote = tmp_path / "anchors.git"
    _git("init", "--quiet", "--bare", str(remote), cwd=tmp_path)
    stage = _stage(tmp_path)
    snapshot = tmp_path / "snap"
    take_snapshot(str(stage), str(snapshot))
    clone = tmp_path / "clone"
    assert push_snapshot(str(snapshot), str(remote), "demo/A", label="one", clone=str(clone), timeout_s=60)["ok"]
    other = tmp_path / "other"
    _git("clone", "--quiet", str(remote), str(other), cwd=tmp_path)
    (other / "note.txt").write_text("someone else's anchor\n")
    _git("add", "note.txt", cwd=other)
    _git("-c", "user.name=o", "-c", "user.email=o@o.invalid", "commit", "--quiet", "-m", "theirs", cwd=other)
    _git("push", "--quiet", "origin", "HEAD", cwd=other)
    before = _git("--git-dir", str(remote), "rev-parse", "HEAD", cwd=tmp_path)
    outcome = push_snapshot(str(snapshot), str(remote), "demo/A", label="two", clone=str(clone), timeout_s=60)
    assert not outcome["ok"]
    assert "push failed" in outcome["error"]
    assert _git("--git-dir", str(remote), "rev-parse", "HEAD", cwd=tmp_path) == before  # nothing overwritten


def test_an_unreachable_remote_is_an_outcome_not_an_exception(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    outcome = push_snapshot(
        str(snapshot), str(tmp_path / "missing.git"), "demo/A", label="x", clone=str(tmp_path / "clone"), timeout_s=30
    )
    assert outcome == {"ok": False, "error": outcome["error"]}
    assert "clone failed" in outcome["error"]
