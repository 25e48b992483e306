"""The anchor command: commit a snapshot of a stage's results to a git clone and push it, never forcing.

A reviewer who holds the remote holds every anchored state of the logs: a
results folder rewritten later no longer matches what was pushed. The
snapshot is copied under the runner's lock (so no half-written line is
taken); the commit and the push run in the background with a timeout, under
an exclusive lock on the clone, and their outcome is logged by the caller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Final

from harness.errors import Refusal
from harness.evidence.lock import InvocationLock

__all__ = ["clone_path", "push_snapshot", "take_snapshot"]

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
