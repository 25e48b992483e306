"""Run a child in its own process group with a deadline, and find what outlives it.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.workers.limits import Limits, confined

__all__ = ["ProcessResult", "WorkerOutcome", "become_subreaper", "descendants", "run_group"]

_PR_SET_CHILD_SUBREAPER = 36
_GRACE_S = 2.0


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


def _finish_sandbox(before: set[int], proc_pid: int) -> None:
    """Wait for (then kill) the sandbox inits left by an ended bwrap: our new descendants in another pid namespace."""
    own = _pid_namespace("self")
    table = _proc_table()
    inits = {p for p in descendants(os.getpid(), table) - before - {proc_pid} if _pid_namespace(p) not in (own, None)}
    if not inits:
        return
    _reap(inits, within_s=_GRACE_S)
    alive = {p for p in inits if p in _proc_table()}
    _kill(alive)
    _reap(alive)


def _stop_sandbox(proc: subprocess.Popen[bytes]) -> None:
    """At the deadline: SIGTERM the command's processes in the namespace, then SIGKILL its init."""
    table = _proc_table()
    inits = {pid for pid, (ppid, _) in table.items() if ppid == proc.pid}
    _kill(descendants(proc.pid, table) - inits, signal.SIGTERM)
    try:
        proc.wait(timeout=_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    _kill(inits | {pid for pid, (ppid, _) in _proc_table().items() if ppid == proc.pid})
    try:
        proc.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


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
    """Run `argv` in a new session, output to `output_path`, kill the group at the deadline.

    Every descendant still alive when the child has ended is killed and
    returned in `detached_pids`. `sandboxed`: `argv` is a bwrap command
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
    tracking = become_subreaper()
    before_children = descendants(os.getpid())
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(output_path, "wb") as out:
        started = time.time()
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=tuple(pass_fds),
        )
        if on_start is not None:
            on_start(proc.pid)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            if sandboxed:
                _stop_sandbox(proc)
            _killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        ended = time.time()
    if sandboxed:
        _finish_sandbox(before_children, proc.pid)
    table = _proc_table()
    left = {pid for pid, (_, pgid) in table.items() if pgid == proc.pid}
    left |= descendants(os.getpid(), table) - before_children - {proc.pid}
    _killpg(proc.pid, signal.SIGKILL)
    _kill(left)
    _reap(left)
    usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    code = proc.returncode
    return ProcessResult(
        exit_code=code if code is not None and code >= 0 else None,
        signal=-code if code is not None and code < 0 else None,
        timed_out=timed_out,
        started=started,
        ended=ended,
        cpu_s=cpu,
        detached_pids=tuple(sorted(left)),
        tracking=tracking,
    )
