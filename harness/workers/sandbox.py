"""The sandbox a worker or a verifier runs in: what it is, how an argv is wrapped, how it is recorded.

The manual: docs/sandbox.md.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code, WorkerRefusal
from harness.workers.limits import Limits, limits_record

__all__ = [
    "BWRAP_ENV",
    "IN_SANDBOX",
    "KINDS",
    "PROXY_SOCKET_ENV",
    "SANDBOX_ENV",
    "Sandbox",
    "View",
    "Wrapped",
    "find_program",
    "guarantee_of",
    "named_paths",
    "resolve_sandbox",
    "sandbox_env",
]

KINDS: Final = ("bwrap", "none")
SANDBOX_ENV: Final = "PROCTOR_SANDBOX"
"""The default kind when `--sandbox` is not given."""
BWRAP_ENV: Final = "PROCTOR_BWRAP"
"""The bwrap binary to use (default: `bwrap` on PATH)."""
PROXY_SOCKET_ENV: Final = "PROCTOR_PROXY_SOCKET"
"""Set for a sandboxed worker that needs a model: the metering proxy's Unix socket inside the sandbox."""
IN_SANDBOX: Final = "/run/proctor"
"""Where the files a run is given appear inside the sandbox."""

_NAMESPACES: Final = (
    ("--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--new-session"),
    # Hosts where bwrap may not make a user namespace (a setuid bwrap, userns disabled): the rest still holds.
    ("--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--new-session"),
)
_SYSTEM: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_ETC_SECRETS: Final = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
    "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd",
)  # fmt: skip
_LOCALE: Final = r"(?:C|POSIX|[A-Za-z]{2,3}(?:_[A-Za-z]{2,3})?)(?:\.[A-Za-z0-9-]{1,20})?(?:@[A-Za-z0-9]{1,20})?"
_ENV_KEPT: Final[dict[str, re.Pattern[str]]] = {
    "PATH": re.compile(r"[^\0]*"),
    "TERM": re.compile(r"[A-Za-z0-9._+-]{1,64}"),
    "TZ": re.compile(r":?[A-Za-z0-9/_+.:-]{1,64}"),
    "LANGUAGE": re.compile(rf"{_LOCALE}(?::{_LOCALE}){{0,15}}"),
    **{name: re.compile(_LOCALE) for name in (
        "LANG", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES",
        "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION",
    )},
}  # fmt: skip
"""The variables of the caller's environment a sandboxed command keeps, each only when its value
has the form (a locale name such as C.UTF-8 or en_US.UTF-8@euro): an allow-list, so a secret kept
in an LC_* variable reaches neither a worker nor a verifier (docs/sandbox.md)."""
_PROBE_TIMEOUT_S: Final = 30.0


def guarantee_of(kinds: Iterable[str]) -> str:
    """``sandboxed`` when every run named ran under bwrap, ``weaker`` when any ran without."""
    return "weaker" if any(k != "bwrap" for k in kinds) else "sandboxed"


@dataclass(frozen=True)
class View:
    """What one sandboxed run may see besides the system.

    Attributes:
        cwd: where the command starts (inside `writable`).
        writable: folders bound read-write at their own paths.
        readable: paths bound read-only at their own paths (missing ones, and "/", are skipped).
        placed: (source, destination) files or folders bound read-only at another
            path (under `IN_SANDBOX`); `placed_writable` the same, read-write.
        withheld: paths never visible, even beneath a `readable` path (beneath the system or
            Python folders, which are always there, they are masked: an empty folder, or
            /dev/null).
        read_only: paths beneath a `writable` folder bound read-only over it (a workspace's
            `.git`: the worker may read its history, never its config or hooks).
    """

    cwd: str
    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    placed: tuple[tuple[str, str], ...] = ()
    placed_writable: tuple[tuple[str, str], ...] = ()
    withheld: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wrapped:
    """A command ready to run, and the record of how it is confined."""

    argv: list[str]
    record: dict[str, Any]
    limits: Limits | None = None
    """The limits `run_group` applies (pids, memory, file size); None: only the sized /tmp."""

    @property
    def sandboxed(self) -> bool:
        return bool(self.record["kind"] == "bwrap")


@dataclass(frozen=True)
class Sandbox:
    """A resolved sandbox kind: for bwrap, the binary, its version and the namespace options that work here."""

    kind: str
    binary: str | None = None
    version: str | None = None
    namespaces: tuple[str, ...] = ()
    source: str = "default"
    """How the kind was chosen: "flag", "env" (PROCTOR_SANDBOX) or "default"."""
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "binary": self.binary,
            "source": self.source,
            "guarantee": guarantee_of([self.kind]),
        }

    def wrap(
        self, argv: Sequence[str], view: View, env: Mapping[str, str], limits: Limits | None = None
    ) -> Wrapped:
        """`argv` confined to `view` (unchanged for kind none), with its record.

        `env` is the environment the command will get; only its names are recorded.
        `limits` (pids, memory, file size) are applied by `run_group`; the sandbox's
        /tmp is sized to `limits.tmp_bytes` (the default when None). The record's
        `limits` says what bound each (docs/sandbox.md, "Resource limits").
        """
        tmp_bytes = (limits or Limits()).tmp_bytes
        if self.kind == "none":
            record: dict[str, Any] = {
                **self.to_json(), "options": [], "env": sorted(env),
                "why": "--sandbox none: the command ran as the proctor's user, with its network and files",
            }  # fmt: skip
            if limits is not None:
                record["limits"] = limits_record(limits, tmp_by=None)
            return Wrapped(list(argv), record, limits)
        assert self.binary is not None
        options = [*self.namespaces, *_base_options(tmp_bytes)]
        options += _view_options(view)
        options += ["--remount-ro", "/", "--chdir", view.cwd]
        record = {
            **self.to_json(), "options": list(options), "env": sorted(env),
            "withheld": sorted(view.withheld), "notes": list(self.notes),
        }  # fmt: skip
        tmp_by = "bwrap --size --tmpfs /tmp"
        record["limits"] = (
            limits_record(limits, tmp_by=tmp_by) if limits is not None
            else {"tmp_bytes": tmp_bytes, "by": {"tmp_bytes": tmp_by}}
        )
        return Wrapped([self.binary, *options, "--", *argv], record, limits)


def _covered(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@functools.lru_cache(maxsize=1)
def _python_roots() -> tuple[str, ...]:
    """The Python prefixes and the `harness` package folder, outside the system folders."""
    found: list[str] = []
    candidates = [sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix,
                  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # fmt: skip
    for path in candidates:
        for form in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.isdir(form) and not _covered(form, _SYSTEM) and form not in found:
                found.append(form)
    return tuple(p for p in found if not _covered(p, [q for q in found if q != p]))


@functools.lru_cache(maxsize=1)
def _system_options() -> tuple[str, ...]:
    """The read-only system: the folders in `_SYSTEM` (links as links), /etc's secrets masked."""
    options: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            options += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            options += ["--ro-bind", path, path]
    for path in _ETC_SECRETS:
        if os.path.islink(path) or not os.path.lexists(path):
            continue
        if os.path.isdir(path):
            options += ["--tmpfs", path, "--remount-ro", path]
        else:
            options += ["--ro-bind", "/dev/null", path]
    return tuple(options)


@functools.lru_cache(maxsize=4)
def _base_options(tmp_bytes: int = Limits.tmp_bytes) -> tuple[str, ...]:
    """Every sandbox's base, in mount order: the system, /proc, /dev, a private /tmp, then Python.

    Python and `harness` are bound after the tmpfs on /tmp, so a checkout or a venv that
    lies under /tmp stays visible (bwrap applies its options in order).
    """
    python = [word for path in _python_roots() for word in ("--ro-bind", path, path)]
    tmp = ("--size", str(tmp_bytes), "--tmpfs", "/tmp")  # a sized tmpfs: RAM, bounded
    return (*_system_options(), "--proc", "/proc", "--dev", "/dev", *tmp, *python)


def _expose(path: str, withheld: Sequence[str], options: list[str]) -> None:
    """Bind `path` read-only, leaving out every withheld path beneath it (they are not there at all)."""
    if any(_covered(path, [w]) for w in withheld):
        return
    inside = [w for w in withheld if _covered(w, [path])]
    if not inside or not os.path.isdir(path) or os.path.islink(path):
        options += ["--ro-bind", path, path]
        return
    options += ["--dir", path]
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return
    for name in names:
        child = os.path.join(path, name)
        if os.path.islink(child):
            options += ["--symlink", os.readlink(child), child]
        else:
            _expose(child, inside, options)


def _view_options(view: View) -> list[str]:
    options: list[str] = []
    withheld = [os.path.realpath(w) for w in view.withheld]
    writable = [os.path.realpath(w) for w in view.writable]
    for path in writable:
        options += ["--bind", path, path]
    for raw in view.read_only:
        for path in dict.fromkeys((os.path.abspath(raw), os.path.realpath(raw))):
            if os.path.lexists(path) and not os.path.islink(path) and _covered(path, writable):
                options += ["--ro-bind", path, path]
    system = [*_SYSTEM, *_python_roots()]
    for path in withheld:  # beneath the system or Python itself (unusual): masked, as /etc's secrets
        if _covered(path, system) and os.path.lexists(path):
            options += ["--tmpfs", path, "--remount-ro", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
    for raw in view.readable:
        named, path = os.path.abspath(raw), os.path.realpath(raw)
        if path == "/" or not os.path.lexists(path) or _covered(path, [*writable, *system]):
            continue  # naming "/" exposes nothing: the allow-list is the point
        if any(_covered(p, [w]) for p in (named, path) for w in withheld):
            continue
        _expose(path, withheld, options)
        if named != path and not _covered(named, [*writable, *system]) and not any(_covered(w, [path]) for w in withheld):
            options += ["--ro-bind", path, named]  # the name it was given resolves inside too
    for source, dest in view.placed:
        options += ["--ro-bind", source, dest]
    for source, dest in view.placed_writable:
        options += ["--bind", source, dest]
    return options


def find_program(argv0: str, cwd: str, env: Mapping[str, str]) -> str | None:
    """Where `argv0` is found as exec would find it (relative to `cwd`, or on `env`'s PATH), or None.

    A sandboxed command is started by bwrap, so a missing program would
    otherwise be bwrap's exit 1 rather than a spawn failure.
    """
    if "/" in argv0:
        path = os.path.join(cwd, argv0)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def named_paths(argv: Sequence[str], program: str | None = None) -> tuple[str, ...]:
    """The absolute paths an argv names that exist, and its program: what a sandboxed command may read."""
    named = [a for a in argv if a.startswith("/") and os.path.lexists(a)]
    if program is not None:
        named.append(os.path.abspath(program))
    return tuple(dict.fromkeys(named))


def sandbox_env(environ: Mapping[str, str], given: Mapping[str, str], *, sandboxed: bool) -> dict[str, str]:
    """The environment of a command: for bwrap, the locale, PATH, TERM and TZ of `environ` (`_ENV_KEPT`), HOME and
    TMPDIR at the private /tmp, and `given`; without a sandbox, all of `environ` but PROCTOR_*, and `given`."""
    if not sandboxed:
        env = {k: v for k, v in environ.items() if not k.startswith("PROCTOR_")}
    else:
        env = {k: v for k, v in environ.items() if k in _ENV_KEPT and _ENV_KEPT[k].fullmatch(v)}
        env.update(HOME="/tmp", TMPDIR="/tmp")
        env.setdefault("PATH", os.defpath)
    env.update(given)
    return env


def _find_binary() -> tuple[str, str]:
    """(path, how it was found) of bwrap, or `sandbox_unavailable` saying why not."""
    hint = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or pass --sandbox none " \
           "to run without a sandbox (recorded as a weaker guarantee)"  # fmt: skip
    named = os.environ.get(BWRAP_ENV)
    if named:
        if not os.path.exists(named):
            raise WorkerRefusal(Code.SANDBOX_UNAVAILABLE, f"{BWRAP_ENV} names {named}, which does not exist; {hint}", named)
        if not os.access(named, os.X_OK) or os.path.isdir(named):
            raise WorkerRefusal(Code.SANDBOX_UNAVAILABLE, f"{BWRAP_ENV} names {named}, which is not executable; {hint}", named)
        return os.path.abspath(named), "env"
    found = shutil.which("bwrap")
    if found is None:
        raise WorkerRefusal(Code.SANDBOX_UNAVAILABLE, f"bwrap is not installed here (not found on PATH); {hint}",
                      path_searched=os.environ.get("PATH", ""))  # fmt: skip
    return found, "path"


@functools.lru_cache(maxsize=8)
def _probe(binary: str) -> tuple[str | None, tuple[str, ...], tuple[str, ...], str]:
    """(version, namespace options that work, notes, why it failed) for `binary`."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, (), (), f"cannot run {binary} --version: {exc}"
    words = done.stdout.split()
    version = words[-1] if done.returncode == 0 and words else None
    target = shutil.which("true") or sys.executable
    check = [target] if target != sys.executable else [target, "-S", "-c", "pass"]
    errors: list[str] = []
    for index, namespaces in enumerate(_NAMESPACES):
        argv = [binary, *namespaces, *_base_options(), "--remount-ro", "/", "--", *check]
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False,
                                 stdin=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            continue
        if run.returncode == 0:
            notes = () if index == 0 else (
                f"no user namespace of its own here ({errors[0]}); the other namespaces and --cap-drop ALL hold",
            )
            return version, namespaces, notes, ""
        errors.append(" ".join(run.stderr.split())[:300] or f"exit {run.returncode}")
    return version, (), (), "; ".join(dict.fromkeys(errors))


def resolve_sandbox(kind: str | None = None) -> Sandbox:
    """The sandbox to use: `kind`, else `PROCTOR_SANDBOX`, else bwrap; refuses one that cannot run here."""
    source = "flag" if kind is not None else "env" if os.environ.get(SANDBOX_ENV) else "default"
    chosen = kind if kind is not None else os.environ.get(SANDBOX_ENV) or "bwrap"
    if chosen not in KINDS:
        raise WorkerRefusal(Code.SANDBOX_INVALID, f"sandbox {chosen!r} is not one of {', '.join(KINDS)}"
                      + (f" (from {SANDBOX_ENV})" if source == "env" else ""))  # fmt: skip
    if chosen == "none":
        return Sandbox("none", source=source)
    binary, _how = _find_binary()
    version, namespaces, notes, why = _probe(binary)
    if not namespaces:
        raise WorkerRefusal(
            Code.SANDBOX_UNAVAILABLE,
            f"bwrap ({binary}) cannot make a sandbox here: {why}; pass --sandbox none to run without one "
            "(recorded as a weaker guarantee)",
            binary,
        )
    return Sandbox("bwrap", binary, version, namespaces, source, notes)
