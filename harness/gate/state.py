"""The state folder outside the workspace: pin, sealed and hidden copies, journal, receipts.

Default `<workspace parent>/.runner-state/<name>-<hash of realpath>/`; the root
`<workspace parent>/.runner-state` is replaced by `--state-dir` or
`PROCTOR_STATE_DIR` when given. Mode 0700. The worker cannot rewrite its own
evidence inside the workspace.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, TreeRefusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.evidence.clock import Clock, utc_iso
from harness.evidence.fsutil import atomic_write, ensure_private_dir
from harness.evidence.git import git_dir_of, run_git
from harness.evidence.jsonio import Loaded, canonical_bytes, read_json, sha256_hex
from harness.evidence.lock import InvocationLock

__all__ = ["NESTED_ENV", "StateDir", "journal_clock", "refuse_nested", "stamp", "workspace_root"]

NESTED_ENV = "PROCTOR_CHILD"


def workspace_root(workspace: str | os.PathLike[str]) -> str:
    """The workspace's real path; refuses anything but the top of a git work tree.

    Read as data (`harness.evidence.git.git_dir_of`): the workspace's `.git/config`
    is the worker's to write, so no git command runs in the workspace's repository.
    """
    path = os.path.realpath(os.fspath(workspace))
    if not os.path.isdir(path):
        raise TreeRefusal(Code.WORKSPACE_MISSING, "no such folder", path)
    try:
        version = run_git(["--version"], git_dir=None, timeout_s=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GateRefusal(Code.GIT_UNAVAILABLE, f"cannot run git: {exc}", path) from None
    if version.returncode != 0:
        raise GateRefusal(Code.GIT_UNAVAILABLE, "git --version failed", path)
    if git_dir_of(path) is None:
        raise GateRefusal(Code.WORKSPACE_IS_NOT_REPO_ROOT, "the workspace must be the top of a git work tree", path)
    return path


def refuse_nested(action: str) -> None:
    """A worker must not drive the proctor that watches it."""
    if os.environ.get(NESTED_ENV) == "1":
        raise GateRefusal(Code.NESTED_CALL_REFUSED, f"{action} from inside a worker ({NESTED_ENV}=1) is refused")


@dataclass(frozen=True)
class StateDir:
    """Paths inside one workspace's state folder, and its journal."""

    root: str
    workspace: str

    @classmethod
    def locate(cls, workspace: str, state_dir: str | None = None) -> StateDir:
        """Where the state of `workspace` (a real path) lives; never inside the workspace."""
        base = state_dir or os.environ.get("PROCTOR_STATE_DIR") or os.path.join(
            os.path.dirname(workspace), ".runner-state"
        )
        digest = hashlib.sha256(os.fsencode(workspace)).hexdigest()[:16]
        root = os.path.join(os.path.realpath(base), f"{os.path.basename(workspace)}-{digest}")
        if root == workspace or root.startswith(workspace + os.sep):
            raise GateRefusal(Code.STATE_DIR_INSIDE_WORKSPACE, "the state folder must lie outside the workspace", root)
        return cls(root=root, workspace=workspace)

    # --- paths -------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def pin_path(self) -> str:
        return self.path("pin.json")

    @property
    def journal_path(self) -> str:
        return self.path("journal.jsonl")

    def exists(self) -> bool:
        return os.path.exists(self.pin_path)

    def create(self) -> None:
        for sub in ("", "sealed", "hidden", "receipts", "dispatches", "verify"):
            ensure_private_dir(self.path(sub) if sub else self.root)

    def lock(self) -> InvocationLock:
        """The invocation lock of this workspace's state."""
        return InvocationLock(self.path("invocation.lock"))

    # --- records -----------------------------------------------------------
    def journal(self, task_id: str) -> ChainedLog:
        return ChainedLog(self.journal_path, self.journal_seed(task_id))

    def journal_seed(self, task_id: str) -> str:
        return f"proctor-journal:{task_id}:{os.path.basename(self.root)}"

    def pin(self) -> dict[str, Any]:
        """The pin written at init; refuses `not_initialized` when there is none."""
        return self.pin_loaded().value  # type: ignore[no-any-return]

    def pin_loaded(self) -> Loaded:
        """The pin with the sha256 of its bytes."""
        if not self.exists():
            raise GateRefusal(Code.NOT_INITIALIZED, "run `proctor init` for this workspace first", self.pin_path)
        return read_json(self.pin_path)

    def events(self, pin: dict[str, Any]) -> list[dict[str, Any]]:
        """Every journal record, verified; a broken journal is refused."""
        return read_log(self.journal_path, self.journal_seed(pin["task_id"]))

    def write_record(self, relative: str, record: dict[str, Any]) -> str:
        """Write a canonical JSON record atomically; returns its sha256."""
        data = canonical_bytes(record)
        atomic_write(self.path(relative), data)
        return sha256_hex(data)


def journal_clock(events: list[dict[str, Any]]) -> Clock:
    """A clock that never goes earlier than the journal's last time."""
    floor = max((float(e.get("t", 0.0)) for e in events[-1:]), default=0.0)
    return Clock(floor=floor)


def stamp(clock: Clock) -> dict[str, Any]:
    """The time fields every journal event carries."""
    t = clock.now()
    return {"t": t, "at": utc_iso(t)}
