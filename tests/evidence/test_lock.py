"""The invocation lock: one proctor invocation at a time, never a stale lock after a crash."""

from __future__ import annotations

import gc
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import Refusal
from harness.evidence.lock import InvocationLock
from tests.support.paths import REPO

_TRY_ACQUIRE = """
import sys
from harness.errors import Refusal
from harness.evidence.lock import InvocationLock
lock = InvocationLock(sys.argv[1])
try:
    lock.acquire()
except Refusal as r:
    print(r.code, r.path, sep="\\n")
else:
    print("acquired")
    lock.release()
"""

_HOLD = """
import sys, time
from harness.evidence.lock import InvocationLock
lock = InvocationLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _try_in_other_process(path: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _TRY_ACQUIRE, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(),
        check=True,
    )
    return out.stdout.splitlines()


def test_acquire_and_release(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    lock = InvocationLock(path)
    assert lock.path == str(path)
    lock.acquire()
    assert path.read_text() == f"{os.getpid()}\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    lock.release()
    lock.release()  # a second release is harmless
    lock.acquire()  # and the same object can take it again
    lock.release()


def test_second_acquire_in_same_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    with InvocationLock(path):
        with pytest.raises(Refusal) as info:
            InvocationLock(path).acquire()
        assert info.value.code == "invocation_locked"
        assert info.value.path == str(path)
        assert str(os.getpid()) in info.value.message
    with InvocationLock(path):
        pass


def test_second_acquire_in_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    with InvocationLock(path):
        assert _try_in_other_process(path) == ["invocation_locked", str(path)]
    assert _try_in_other_process(path) == ["acquired"]


def test_context_manager_releases(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    with InvocationLock(path) as lock:
        assert isinstance(lock, InvocationLock)
    assert _try_in_other_process(path) == ["acquired"]


def test_context_manager_releases_on_exception(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    with pytest.raises(RuntimeError), InvocationLock(path):
        raise RuntimeError("boom")
    with InvocationLock(path):
        pass


def test_refused_acquire_does_not_leak_or_truncate(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    gc.collect()  # a file an earlier test left for the collector is not closed in the middle of the count
    fds_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    with InvocationLock(path):
        for _ in range(20):
            with pytest.raises(Refusal):
                InvocationLock(path).acquire()
        if fds_before is not None:
            assert len(os.listdir("/proc/self/fd")) == fds_before + 1
        assert path.read_text() == f"{os.getpid()}\n"


@pytest.mark.timeout(60)
def test_lock_is_released_when_holder_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "invocation.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Refusal) as info:
            InvocationLock(path).acquire()
        assert info.value.code == "invocation_locked"
        assert str(holder.pid) in info.value.message
        os.kill(holder.pid, signal.SIGKILL)
        assert holder.wait(timeout=30) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    # The kernel dropped the lock with the process: no stale lock.
    with InvocationLock(path):
        assert path.read_text() == f"{os.getpid()}\n"


def test_lock_holder_names_the_holding_process_without_taking_the_lock(tmp_path: Path) -> None:
    from harness.evidence.lock import lock_holder

    path = tmp_path / "held.lock"
    assert lock_holder(path) is None
    code = (
        "import sys, time\n"
        "from harness.evidence.lock import InvocationLock\n"
        f"lock = InvocationLock({str(path)!r}); lock.acquire()\n"
        "print('held', flush=True); time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert lock_holder(path) == child.pid
        assert lock_holder(path) == child.pid  # looking twice never took it
    finally:
        child.kill()
        child.wait()
    assert lock_holder(path) is None
