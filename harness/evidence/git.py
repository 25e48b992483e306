"""Every git command proctor runs: git as a reader of data, never a runner of a worker's code.

A workspace's `.git` is the worker's to write under `--sandbox none`, so its
config, hooks and object store are hostile input. `run_git` runs git with no
system, global or user config, no hooks, fsmonitor, pager, external diff,
prompts or protocols; `head_blobs` reads objects through a clean git folder
of proctor's own, so the workspace's `.git/config` is never read at all.

The manual: docs/sandbox.md (the threat model), docs/gated-path.md.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Final

__all__ = ["GIT_OPTIONS", "SUBCOMMANDS", "git_dir_of", "git_dir_snapshot", "git_env", "head_blobs", "run_git", "snapshot_changes"]

GIT_OPTIONS: Final = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "credential.helper=",
    "diff.external=",
    "protocol.allow=never",
    "uploadpack.packObjectsHook=",
    "fetch.recurseSubmodules=false",
    "submodule.recurse=false",
    "gc.auto=0",
    "maintenance.auto=false",
)
"""`-c` options given to every git command: each overrides a key a repository's config could set."""

_DROPPED: Final = re.compile(r"^(GIT_|SSH_ASKPASS$|PAGER$|LESS|EDITOR$|VISUAL$)")
_HEX: Final = re.compile(rb"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def git_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git command: the caller's without GIT_*, pagers or editors, and no config."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not _DROPPED.match(k)}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_SYSTEM=os.devnull,
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_LAZY_FETCH="1",  # git >= 2.45; older gits fetch nothing here anyway (no promisor in our config)
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_OPTIONAL_LOCKS="0",
        GIT_PROTOCOL_FROM_USER="0",
        GIT_ALLOW_PROTOCOL="",
        GIT_PAGER="cat",
        PAGER="cat",
        GIT_SSH_COMMAND="false",
        GIT_ASKPASS="false",
        GIT_EDITOR="false",
    )
    return env


SUBCOMMANDS: Final = frozenset({"--version", "cat-file", "init", "add", "commit", "rev-parse", "status"})
"""The git subcommands proctor runs, all built in: a built-in always wins over an alias of its name.

`rev-parse` and `status` run on the project's own checkout only (`harness.evidence.checkout`)."""


def run_git(
    args: Sequence[str],
    *,
    git_dir: str | None,
    work_tree: str | None = None,
    input: bytes | None = None,
    timeout_s: float = 60,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """`git --no-pager <GIT_OPTIONS> ARGS` on the repository `git_dir`, with `git_env()` plus `env`.

    The repository is named, never discovered from a folder: `git_dir` is a
    clean git folder of proctor's own (`head_blobs`), one it made itself (the
    demo) or the project's own checkout (provenance); None runs git on no
    repository (`--version`). A workspace's own
    `.git` is never passed here: its attributes could still name a filter.
    Raises ValueError for a subcommand not in `SUBCOMMANDS`, OSError when git
    cannot run and subprocess.TimeoutExpired after `timeout_s`.
    """
    if not args or args[0] not in SUBCOMMANDS:
        raise ValueError(f"proctor runs no git {args[0] if args else '(nothing)'!r}")
    full_env = {**git_env(), **(env or {}), "GIT_DIR": git_dir or os.devnull}
    if work_tree is not None:
        full_env["GIT_WORK_TREE"] = work_tree
    options = [word for option in GIT_OPTIONS for word in ("-c", option)]
    return subprocess.run(
        ["git", "--no-pager", *options, *args],
        cwd=work_tree or git_dir or "/",
        input=input,
        capture_output=True,
        timeout=timeout_s,
        env=full_env,
        check=False,
    )


def git_dir_of(workspace: str) -> str | None:
    """The git folder of a work tree's top `workspace`: `.git` itself, or where a `gitdir:` file points.

    Read as data (no git runs); None when `workspace/.git` is neither.
    """
    dot = os.path.join(workspace, ".git")
    if os.path.isdir(dot) and not os.path.islink(dot):
        return dot if os.path.isfile(os.path.join(dot, "HEAD")) else None
    if os.path.isfile(dot) and not os.path.islink(dot):
        with open(dot, "rb") as handle:
            text = handle.read(4096)
        if not text.startswith(b"gitdir: "):
            return None
        target = os.path.join(workspace, os.fsdecode(text[8:].strip()))
        return target if os.path.isfile(os.path.join(target, "HEAD")) else None
    return None


def _read_small(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(65536)
    except OSError:
        return None


def _common_dir(git_dir: str) -> str:
    common = _read_small(os.path.join(git_dir, "commondir"))
    if common is None:
        return git_dir
    return os.path.normpath(os.path.join(git_dir, os.fsdecode(common.strip())))


def _resolve_head(git_dir: str, common: str) -> bytes | None:
    """HEAD's object id, read as data: HEAD, loose refs and packed-refs (five hops at most)."""
    value = _read_small(os.path.join(git_dir, "HEAD"))
    for _ in range(5):
        if value is None:
            return None
        value = value.strip()
        if _HEX.match(value):
            return value
        if not value.startswith(b"ref: refs/"):
            return None
        name = value[5:].strip()
        if b".." in name.split(b"/") or b"\0" in name:
            return None
        found = None
        for base in dict.fromkeys((git_dir, common)):
            found = _read_small(os.path.join(base, os.fsdecode(name)))
            if found is not None:
                break
        if found is None:
            packed = _read_small(os.path.join(common, "packed-refs")) or b""
            for line in packed.splitlines():
                sha, _, ref = line.partition(b" ")
                if ref == name and _HEX.match(sha):
                    found = sha
                    break
        value = found
    return None


def head_blobs(workspace: str, paths: Sequence[bytes], timeout_s: float = 60) -> dict[bytes, bytes]:
    """The contents of `paths` at the workspace's HEAD, read without its config, hooks or remotes.

    HEAD is resolved from the ref files as data; `git cat-file --batch` runs
    in a fresh git folder of proctor's own whose only tie to the workspace is
    GIT_OBJECT_DIRECTORY, so no key of the workspace's config (a promisor
    remote, `extensions.partialClone`, fsmonitor, hooks, filters) is read and
    a missing object is just missing. Paths git cannot answer are left out.
    """
    wanted = [p for p in paths if b"\n" not in p]
    git_dir = git_dir_of(workspace)
    if not wanted or git_dir is None:
        return {}
    common = _common_dir(git_dir)
    head = _resolve_head(git_dir, common)
    objects = os.path.join(common, "objects")
    if head is None or not os.path.isdir(objects):
        return {}
    with tempfile.TemporaryDirectory(prefix="proctor-git-") as clean:
        for folder in ("objects", "refs"):
            os.mkdir(os.path.join(clean, folder))
        with open(os.path.join(clean, "HEAD"), "wb") as handle:
            handle.write(b"ref: refs/heads/none\n")
        config = b"[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
        if len(head) == 64:
            config = b"[core]\n\trepositoryformatversion = 1\n\tbare = true\n[extensions]\n\tobjectformat = sha256\n"
        with open(os.path.join(clean, "config"), "wb") as handle:
            handle.write(config)
        try:
            done = run_git(
                ["cat-file", "--batch"],
                git_dir=clean,
                input=b"".join(head + b":" + p + b"\n" for p in wanted),
                timeout_s=timeout_s,
                env={"GIT_OBJECT_DIRECTORY": objects},
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
    out, pos, found = done.stdout, 0, {}
    for path in wanted:
        end = out.find(b"\n", pos)
        if end < 0:
            break
        header = out[pos:end].split()
        pos = end + 1
        if len(header) != 3 or not header[2].isdigit():
            continue  # "<name> missing" or "ambiguous"
        size = int(header[2])
        if header[1] == b"blob":
            found[path] = out[pos : pos + size]
        pos += size + 1
    return found


def git_dir_snapshot(workspace: str) -> dict[str, tuple[int, ...] | str]:
    """Every entry of the workspace's `.git` (and where a `gitdir:` file points): path -> its lstat.

    Inode, mode, size and change time (which no user can set back) catch any
    write, rename, chmod or replacement without reading the object store;
    a link is recorded with its target. Compared at dispatch end (`git_dir_changed`).
    """
    found: dict[str, tuple[int, ...] | str] = {}
    roots = [os.path.join(workspace, ".git")]
    pointed = git_dir_of(workspace)
    if pointed is not None and os.path.realpath(pointed) != os.path.realpath(roots[0]):
        roots.append(pointed)
    for root in roots:
        _snapshot_into(root, found)
    return found


def _snapshot_into(path: str, found: dict[str, tuple[int, ...] | str]) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        found[path] = f"unreadable: {exc.strerror}"
        return
    found[path] = (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if stat.S_ISLNK(st.st_mode):
        try:
            found[path + " ->"] = os.readlink(path)
        except OSError as exc:
            found[path + " ->"] = f"unreadable: {exc.strerror}"
    elif stat.S_ISDIR(st.st_mode):
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            found[path + "/"] = f"unlistable: {exc.strerror}"
            return
        for name in names:
            _snapshot_into(os.path.join(path, name), found)


def snapshot_changes(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """The paths added, removed or changed between two `git_dir_snapshot`s, sorted."""
    return sorted({p.removesuffix(" ->").removesuffix("/") for p in {*before, *after} if before.get(p) != after.get(p)})
