"""The anchor command: commit a snapshot of a stage's results to a git clone and push it, never forcing.

The manual: docs/running.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Refusal
from harness.evidence.lock import InvocationLock

__all__ = ["Pushed", "clone_path", "push_snapshot", "push_stage", "read_pushed", "resolve_remote", "take_snapshot"]

_GIT_IDENTITY: Final = ("-c", "user.name=proctor anchor", "-c", "user.email=anchor@proctor.invalid")


def clone_path(stage_folder: str) -> str:
    """The anchor clone kept beside the study's results (outside every stage folder)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(stage_folder))), ".anchor-clone")


def take_snapshot(stage_folder: str, snapshot: str) -> list[str]:
    """Copy the stage folder's regular files (never links, never the lock) into `snapshot`."""
    if os.path.lexists(snapshot):
        shutil.rmtree(snapshot)
    copied = []
    for here, dirs, files in os.walk(stage_folder):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(here, d)))
        rel = os.path.relpath(here, stage_folder)
        os.makedirs(os.path.join(snapshot, rel), exist_ok=True)
        for name in sorted(files):
            source = os.path.join(here, name)
            if name.endswith(".lock") or os.path.islink(source) or not os.path.isfile(source):
                continue
            shutil.copyfile(source, os.path.join(snapshot, rel, name))
            copied.append(os.path.normpath(os.path.join(rel, name)))
    return copied


def _git(args: list[str], cwd: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def push_snapshot(snapshot: str, remote: str, target: str, *, label: str, clone: str, timeout_s: float) -> dict[str, Any]:
    """Commit `snapshot` as `<target>/` in a clone of `remote` and push it without force.

    Returns the outcome as data (`ok`, `commit`, `error`); never raises for a
    git failure, so a failed anchor is logged, not fatal.
    """
    try:
        with InvocationLock(clone + ".lock"):
            if not os.path.isdir(os.path.join(clone, ".git")):
                done = _git(["clone", "--quiet", remote, clone], os.path.dirname(clone), timeout_s)
                if done.returncode != 0:
                    return {"ok": False, "error": f"git clone failed: {done.stderr.strip()[-500:]}"}
            dest = os.path.join(clone, target)
            if os.path.lexists(dest):
                shutil.rmtree(dest)
            shutil.copytree(snapshot, dest)
            steps = (
                ["add", "-A", "--", target],
                ["commit", "--quiet", "--allow-empty", "-m", f"proctor anchor: {target} ({label})"],
                ["push", "--quiet", "origin", "HEAD"],
            )
            for step in steps:
                done = _git(step, clone, timeout_s)
                if done.returncode != 0:
                    return {"ok": False, "error": f"git {step[0]} failed: {done.stderr.strip()[-500:]}"}
            head = _git(["rev-parse", "HEAD"], clone, timeout_s).stdout.strip()
            return {"ok": True, "commit": head, "remote": remote, "target": target}
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"git timed out after {timeout_s:g}s"}
    except Refusal as refusal:
        return {"ok": False, "error": f"{refusal.code}: {refusal.message}"}
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def resolve_remote(remote: str, design_path: str) -> str:
    """The registered `run.anchor_remote` as git is given it: a relative path is taken from the design's folder."""
    if os.path.isabs(remote) or "://" in remote:
        return remote
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(design_path)), remote))


def push_stage(folder: str, target: str, remote: str, *, label: str, timeout_s: float) -> dict[str, Any]:
    """Snapshot the stage folder and push it to `remote` as `target/` now (the caller holds the stage's lock).

    Returns `push_snapshot`'s outcome; never raises for a git or file-system failure.
    """
    clone = clone_path(folder)
    try:
        snapshot = tempfile.mkdtemp(prefix=f"{os.path.basename(clone)}.snapshot-", dir=os.path.dirname(clone))
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        take_snapshot(folder, snapshot)
        return push_snapshot(snapshot, remote, target, label=label, clone=clone, timeout_s=timeout_s)
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)


@dataclass(frozen=True)
class Pushed:
    """What the remote holds now: its latest commit, every commit before it, and the files under a prefix."""

    remote: str
    commit: str
    commits: frozenset[str]
    files: Mapping[str, bytes]
    """Path in the commit's tree (POSIX) -> the file's bytes, for every file under the prefix read."""

    def snapshot(self, target: str) -> dict[str, bytes]:
        """The files of one pushed target (`<study>/<stage>`), by path relative to it; empty when never pushed."""
        head = target.rstrip("/") + "/"
        return {path[len(head):]: data for path, data in self.files.items() if path.startswith(head)}

    def targets(self, prefix: str) -> set[str]:
        """The names directly under `prefix/` that hold files (the stages pushed for a study)."""
        head = prefix.rstrip("/") + "/"
        return {path[len(head):].split("/", 1)[0] for path in self.files if path.startswith(head)
                and "/" in path[len(head):]}


class _GitFailed(Exception):
    """A git command that exited non-zero (its stderr's tail is the message)."""


def _git_bytes(args: list[str], cwd: str, timeout_s: float, data: bytes | None = None) -> bytes:
    done = subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise _GitFailed(f"git {args[0]} failed: {done.stderr.decode('utf-8', 'replace').strip()[-500:]}")
    return done.stdout


def _cat_blobs(repo: str, shas: list[str], timeout_s: float) -> list[bytes]:
    out = _git_bytes(["cat-file", "--batch"], repo, timeout_s, "".join(f"{s}\n" for s in shas).encode())
    blobs, pos = [], 0
    for sha in shas:
        end = out.index(b"\n", pos)
        head = out[pos:end].split(b" ")
        if len(head) != 3 or head[0].decode() != sha or head[1] != b"blob":
            raise _GitFailed(f"git cat-file: unexpected answer {out[pos:end][:200]!r}")
        size = int(head[2])
        blobs.append(out[end + 1:end + 1 + size])
        pos = end + 1 + size + 1
    return blobs


def _history(repo: str, timeout_s: float) -> list[str]:
    """Every commit from HEAD (else from the only branch) back, newest first; [] when there is none."""
    try:
        return _git_bytes(["rev-list", "HEAD"], repo, timeout_s).decode().split()
    except _GitFailed:
        names = _git_bytes(["for-each-ref", "--format=%(refname)", "refs/heads"], repo, timeout_s).decode().split()
        if len(names) != 1:
            return []
        return _git_bytes(["rev-list", names[0]], repo, timeout_s).decode().split()


def _read_tip(remote: str, repo: str, prefix: str, timeout_s: float) -> Pushed | str:
    history = _history(repo, timeout_s)
    if not history:
        return f"the remote {remote} holds no commit on HEAD or on a single branch"
    commit = history[0]
    listing = _git_bytes(["ls-tree", "-r", "-z", "--full-tree", commit, "--", prefix.rstrip("/") + "/"],
                         repo, timeout_s)
    paths, shas = [], []
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        _mode, kind, sha = meta.decode().split(" ")
        if kind == "blob":
            paths.append(path.decode("utf-8", "surrogateescape"))
            shas.append(sha)
    blobs = _cat_blobs(repo, shas, timeout_s) if shas else []
    return Pushed(remote, commit, frozenset(history), dict(zip(paths, blobs, strict=True)))


def read_pushed(remote: str, prefix: str, *, timeout_s: float) -> Pushed | str:
    """Read the remote's latest commit (its HEAD, else its only branch) and every file in it under `prefix/`.

    A remote that is a local repository is read in place with read-only git commands;
    any other is fetched into a scratch repository first. Never writes to the remote.
    Returns the error as text when the remote cannot be read or holds no commit (never
    raises for a git failure).
    """
    try:
        if os.path.isdir(remote):
            found = _git_bytes(["rev-parse", "--absolute-git-dir"], remote, timeout_s).decode().strip()
            real = os.path.realpath(remote)
            if os.path.realpath(found) not in (real, os.path.join(real, ".git")):
                return f"the remote {remote} is not a git repository"
            return _read_tip(remote, found, prefix, timeout_s)
        with tempfile.TemporaryDirectory(prefix="proctor-witness-") as repo:
            _git_bytes(["init", "--quiet", "--bare", repo], repo, timeout_s)
            _git_bytes(["fetch", "--quiet", "--no-tags", remote, "+HEAD:refs/heads/witness"], repo, timeout_s)
            return _read_tip(remote, repo, prefix, timeout_s)
    except _GitFailed as exc:
        return f"cannot read the remote {remote}: {exc}"
    except subprocess.TimeoutExpired:
        return f"reading the remote {remote} timed out after {timeout_s:g}s"
    except (OSError, ValueError) as exc:
        return f"cannot read the remote {remote}: {type(exc).__name__}: {exc}"
