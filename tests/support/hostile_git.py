"""Hostile `.git` folders: each plant makes a git key run a command that leaves a marker file.

`plant(repo, key, markers)` writes one attack into a real repository (made by
`tests.support.tasks.git_repo`, holding at least one committed file) and
returns the plain git command that sets it off, so a test can show the plant
works under ordinary git before showing proctor's git never runs it. What each
key is: docs/sandbox.md (the threat model).
"""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

__all__ = ["KEYS", "marker_script", "plain_git_env", "plant", "set_off"]

KEYS = ("fsmonitor", "hooks", "promisor", "pager", "diff_external", "filter", "alias", "ssh_command")
HOOKS = ("pre-commit", "commit-msg", "post-commit", "post-checkout", "post-index-change", "reference-transaction")


def marker_script(markers: Path, name: str, *, pass_through: bool = True) -> Path:
    """An executable script that creates `markers/<name>` and succeeds (a filter or pager: passing stdin on)."""
    markers.mkdir(exist_ok=True)
    script = markers.parent / f"evil-{name}.sh"
    script.write_text(f"#!/bin/sh\ntouch '{markers / name}'\n{'cat' if pass_through else ''}\nexit 0\n")
    script.chmod(0o755)
    return script


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=plain_git_env())


def plain_git_env() -> dict[str, str]:
    """An ordinary user's environment for git: no GIT_* of the test run's own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def _first_file(repo: Path) -> str:
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files"], check=True, capture_output=True, text=True, env=plain_git_env()
    )
    return listed.stdout.split()[0]


def plant(repo: Path, key: str, markers: Path, path: str | None = None) -> list[str]:
    """Plant the attack `key` in `repo`'s .git; returns the git argv (run in `repo`) that sets it off.

    `path` (default: the first committed file) is the file a plant changes or whose object it deletes.
    """
    repo = repo.resolve()
    script = str(marker_script(markers, key, pass_through=key in ("pager", "filter")))
    path = path or _first_file(repo)
    if key == "fsmonitor":
        _git(repo, "config", "core.fsmonitor", script)
        (repo / path).write_bytes((repo / path).read_bytes())  # a stat change to ask the monitor about
        return ["git", "status", "--porcelain"]
    if key == "hooks":
        hooks = repo / ".git" / "hooks"
        elsewhere = repo / ".git" / "elsewhere-hooks"
        elsewhere.mkdir()
        for name in HOOKS:
            for folder in (hooks, elsewhere):
                (folder / name).write_text(f"#!/bin/sh\ntouch '{markers / key}'\n")
                (folder / name).chmod(0o755)
        _git(repo, "config", "core.hooksPath", str(elsewhere))
        return ["git", "-c", "user.name=u", "-c", "user.email=u@u.invalid", "commit", "-q", "--allow-empty", "-m", "x"]
    if key == "promisor":
        blob = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", f"HEAD:{path}"], check=True, capture_output=True, text=True,
            env=plain_git_env(),
        ).stdout.strip()
        (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # HEAD's object is missing: lazy fetch
        _git(repo, "config", "core.repositoryformatversion", "1")
        _git(repo, "config", "extensions.partialClone", "origin")
        _git(repo, "config", "remote.origin.url", str(repo))
        _git(repo, "config", "remote.origin.promisor", "true")
        _git(repo, "config", "remote.origin.uploadpack", f"{script}; git-upload-pack")
        return ["git", "-c", "core.fsmonitor=false", "cat-file", "-p", f"HEAD:{path}"]
    if key == "pager":
        _git(repo, "config", "core.pager", script)
        _git(repo, "config", "pager.cat-file", script)
        return ["git", "log", "-1"]  # paged only on a terminal: `set_off` gives it one
    if key == "diff_external":
        _git(repo, "config", "diff.external", script)
        (repo / path).write_bytes((repo / path).read_bytes() + b"\n# changed\n")
        return ["git", "diff"]
    if key == "filter":
        _git(repo, "config", "filter.evil.clean", script)
        _git(repo, "config", "filter.evil.smudge", script)
        _git(repo, "config", "filter.evil.required", "true")
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "attributes").write_text("* filter=evil\n")
        (repo / path).write_bytes((repo / path).read_bytes() + b"\n# changed\n")
        return ["git", "add", path]
    if key == "alias":
        _git(repo, "config", "alias.evidence", f"!{script}")
        _git(repo, "config", "alias.cat-file", f"!{script}")  # a built-in's name: never used by git
        return ["git", "evidence"]
    if key == "ssh_command":
        _git(repo, "config", "core.sshCommand", script)
        _git(repo, "config", "remote.origin.url", "ssh://git@example.invalid/x.git")
        return ["git", "ls-remote", "origin"]
    raise ValueError(key)


def set_off(repo: Path, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run `argv` in `repo` on a terminal (so a pager would start), its output discarded."""
    primary, secondary = pty.openpty()
    try:
        subprocess.run(
            argv,
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=secondary,
            env=plain_git_env() if env is None else env,
            timeout=60,
            check=False,
        )
    finally:
        os.close(secondary)
        os.close(primary)
