"""Run a child in its own process group with a deadline, and find what outlives it.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.workers.limits import Limits, confined

__all__ = ["ProcessResult", "WorkerOutcome", "become_subreaper", "descendants", "run_group"]

_PR_SET_CHILD_SUBREAPER = 36
_GRACE_S = 2.0
_START_S = 60.0
"""How long the reaper may take to start the child (an interpreter's start-up, on a loaded machine)."""
_REAPER = r"""
import ctypes, os, signal, sys, time
fd, parent, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
tracking = libc.prctl(36, 1, 0, 0, 0) == 0
libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)
if os.getppid() != parent:
    os._exit(70)
os.set_inheritable(fd, False)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.close(r)
        for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(w, str(exc.errno or 0).encode())
    os._exit(127)
os.close(w)
err = os.read(r, 64)
os.close(r)
if err:
    os.waitpid(pid, 0)
    os.write(fd, b"E " + err + b"\n")
    os._exit(0)
os.write(fd, b"S %d %d\n" % (pid, tracking))
cpu = 0.0
while True:
    try:
        done, status, usage = os.wait4(-1, 0)
    except ChildProcessError:
        while True:
            time.sleep(3600)
    cpu += usage.ru_utime + usage.ru_stime
    if done == pid:
        os.write(fd, b"X %d %r\n" % (status, cpu))
"""
"""The attempt's own reaper (`run_group`): a subreaper between the runner and the command, so that every
process the command leaves (double-forked, setsid) is re-parented to it, not to the runner, and the sweep
kills the attempt's processes only, never a concurrent attempt's (docs/gated-path.md, "Process groups").
It reports on `fd`: `S pid tracking` once the command runs (or `E errno`), `X waitstatus cpu_s` when it ends."""


@dataclass(frozen=True)
class ProcessResult:
    """How a child run ended and what it left behind."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    started: float
    ended: float
    cpu_s: float
    detached_pids: tuple[int, ...] = field(default=())
    tracking: bool = True

    @property
    def duration_s(self) -> float:
        return self.ended - self.started

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 6),
            "cpu_s": round(self.cpu_s, 6),
            "detached_pids": list(self.detached_pids),
            "process_tracking": self.tracking,
        }


class WorkerOutcome:
    """What a gated command returns about a worker it ran: `succeeded`, and its JSON with the process fields."""

    process: ProcessResult

    @property
    def succeeded(self) -> bool:
        """The worker exited 0 within its time."""
        return self.process.exit_code == 0 and not self.process.timed_out

    def outcome_json(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`{"ok": succeeded, **fields, **process fields}`: the command's `--json` object."""
        return {"ok": self.succeeded, **fields, **self.process.to_json()}


_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (once); False where unsupported."""
    global _subreaper
    if _subreaper is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return _subreaper


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) for every live process in /proc."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if fields and fields[0] != b"Z":  # zombies are dead already
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(root: int, table: Mapping[int, tuple[int, int]] | None = None) -> set[int]:
    """Every live process below `root` in the parent tree."""
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _reap(pids: set[int], within_s: float = 2.0) -> None:
    """Collect the exit status of killed processes that were re-parented to us."""
    deadline = time.monotonic() + within_s
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child: init or its own parent reaps it
                done = pid
            if done:
                waiting.discard(pid)
        if waiting:
            time.sleep(0.01)


def _kill(pids: set[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _finish_sandbox(reaper: int, child: int) -> None:
    """Wait for (then kill) the sandbox inits left by an ended bwrap: the reaper's descendants in another pid namespace."""
    own = _pid_namespace("self")
    inits = {p for p in descendants(reaper) - {child} if _pid_namespace(p) not in (own, None)}
    if not inits:
        return
    _gone(inits, within_s=_GRACE_S)
    _kill({p for p in inits if p in _proc_table()})
    _gone(inits, within_s=_GRACE_S)


def _stop_sandbox(child: int, ended: Callable[[float], bool]) -> None:
    """At the deadline: SIGTERM the command's processes in the namespace, then SIGKILL its init."""
    table = _proc_table()
    inits = {pid for pid, (ppid, _) in table.items() if ppid == child}
    _kill(descendants(child, table) - inits, signal.SIGTERM)
    if ended(_GRACE_S):
        return
    _kill(inits | {pid for pid, (ppid, _) in _proc_table().items() if ppid == child})
    ended(_GRACE_S)


def _gone(pids: set[int], within_s: float) -> bool:
    """Wait until none of `pids` is alive (the attempt's reaper collects them); False at `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        table = _proc_table()
        if not any(p in table for p in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def run_group(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout_s: float,
    output_path: str,
    on_start: Callable[[int], None] | None = None,
    preexec: Callable[[], None] | None = None,
    sandboxed: bool = False,
    limits: Limits | None = None,
    pass_fds: Sequence[int] = (),
) -> ProcessResult:
    """Run `argv` in a new session under its own reaper (`_REAPER`), output to `output_path`, kill it at the deadline.

    Every process of the run (the reaper's descendants, its group) still alive when the child has ended is
    killed and returned in `detached_pids`; other runs' processes, concurrent in this process, are not
    touched. `on_start` gets the child's pid. `sandboxed`: `argv` is a bwrap command
    (its pid namespace is stopped at the deadline, see the module docstring).
    `limits`: pids, memory and file size, by cgroup or rlimit (`harness.workers.limits`).
    `pass_fds`: descriptors the child inherits (the verifier's report channel).
    """
    if limits is not None:
        with confined(limits) as box:
            def both() -> None:
                box.preexec()
                if preexec is not None:
                    preexec()

            return _run_group(argv, cwd=cwd, env=env, timeout_s=timeout_s, output_path=output_path,
                              on_start=on_start, preexec=both, sandboxed=sandboxed, pass_fds=pass_fds)  # fmt: skip
    return _run_group(argv, cwd=cwd, env=env, timeout_s=timeout_s, output_path=output_path,
                      on_start=on_start, preexec=preexec, sandboxed=sandboxed, pass_fds=pass_fds)  # fmt: skip


class _Channel:
    """The reaper's report lines, read with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def line(self, timeout_s: float) -> str | None:
        """The next line, or None at `timeout_s` or when the reaper has gone."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 3600.0))
            if ready:
                data = os.read(self.fd, 4096)
                self.eof = not data
                self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("ascii", "replace")


def _children(pid: int) -> set[int]:
    """The children of `pid`, zombies too."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            fields = data[data.rfind(b")") + 2 :].split()
            if len(fields) > 1 and int(fields[1]) == pid:
                found.add(int(name))
    return found


def _members(reaper: int) -> set[int]:
    """The live processes of the reaper's process group (the command's, unless they left it), but the reaper."""
    return {pid for pid, (_, pgid) in _proc_table().items() if pgid == reaper} - {reaper}


def _group(reaper: int) -> set[int]:
    """The attempt's live processes: the reaper's descendants and its process group, but for the reaper."""
    table = _proc_table()
    return ({pid for pid, (_, pgid) in table.items() if pgid == reaper} | descendants(reaper, table)) - {reaper}


def _run_group(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout_s: float,
    output_path: str,
    on_start: Callable[[int], None] | None,
    preexec: Callable[[], None] | None,
    sandboxed: bool,
    pass_fds: Sequence[int],
) -> ProcessResult:
    become_subreaper()  # the fallback: the orphans of a reaper that was killed come to this process
    read, write = os.pipe()
    channel = _Channel(read)
    try:
        with open(output_path, "wb") as out:
            started = time.time()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _REAPER, str(write), str(os.getpid()), *argv],
                    cwd=cwd,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=preexec,
                    pass_fds=(*pass_fds, write),
                )
            finally:
                os.close(write)
            try:
                first = (channel.line(_START_S) or "").split()
                if first[:1] != ["S"]:
                    errno = int(first[1]) if first[:1] == ["E"] and first[1:2] and first[1].isdigit() else 0
                    raise OSError(errno, os.strerror(errno) if errno else "the worker could not be started", argv[0])
                child, tracking = int(first[1]), first[2] == "1"
                if on_start is not None:
                    on_start(child)
                return _watch(proc, channel, child, tracking, started, timeout_s, sandboxed)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
    finally:
        os.close(read)


def _watch(proc: subprocess.Popen[bytes], channel: _Channel, child: int, tracking: bool, started: float,
           timeout_s: float, sandboxed: bool) -> ProcessResult:
    """Wait for the child under its deadline, then kill everything of the attempt still alive but its reaper."""
    end: list[str] = []

    def ended(within_s: float) -> bool:
        if not end:
            line = channel.line(within_s)
            if line is not None and line.startswith("X "):
                end.extend(line.split()[1:])
        return bool(end)

    timed_out = False
    if not ended(timeout_s):
        timed_out = True
        if sandboxed:
            _stop_sandbox(child, ended)
        if not end:  # the command's process group (what escaped it is found and flagged by the sweep below)
            _kill(_members(proc.pid), signal.SIGTERM)  # the reaper ignores SIGTERM
            if not ended(_GRACE_S):
                _kill(_members(proc.pid))
                ended(_GRACE_S)
    finished = time.time()
    if sandboxed:
        _finish_sandbox(proc.pid, child)
    left: set[int] = set()
    for _ in range(5):  # a process forking while it is killed: sweep again until none is left
        alive = _group(proc.pid)
        if not alive:
            break
        left |= alive
        _kill(alive)
        _gone(alive, within_s=_GRACE_S)  # the reaper collects them
    left.discard(child)
    orphans = _children(proc.pid)  # any the reaper has not collected yet (zombies) come to this process
    proc.kill()  # only now: a killed reaper's orphans would come to this process
    proc.wait()
    _reap(left | orphans)
    code = os.waitstatus_to_exitcode(int(end[0])) if end else -signal.SIGKILL
    return ProcessResult(
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        timed_out=timed_out,
        started=started,
        ended=finished,
        cpu_s=float(end[1]) if end else 0.0,
        detached_pids=tuple(sorted(left)),
        tracking=tracking,
    )
