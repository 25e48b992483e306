"""`run_group` with several runs at once in one process: each run's sweep kills its own processes only.

Real processes throughout: workers that fork, setsid and double-fork, killed for real.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.workers.process import ProcessResult, run_group


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] != b"Z"


def _zombie_children() -> set[int]:
    """This process's children that have ended and not been collected."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                data = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = data[data.rfind(b")") + 2 :].split()
            if fields[0] == b"Z" and int(fields[1]) == os.getpid():
                found.add(int(name))
    return found


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _pids(path: Path, count: int, within_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists():
            found = [int(x) for x in path.read_text().split()]
            if len(found) >= count:
                return found
        time.sleep(0.02)
    raise AssertionError(f"{path} never held {count} pids")


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


ESCAPER = """\
    import os, sys, time
    pids = sys.argv[1]
    def note(pid):
        with open(pids, "a") as fh:
            fh.write(f"{pid}\\n")
    if os.fork() == 0:  # a daemon: out of the session, re-parented when its parent exits
        os.setsid()
        if os.fork() == 0:
            note(os.getpid())
            time.sleep(120)
        os._exit(0)
    child = os.fork()
    if child == 0:  # a plain child, in the worker's group
        time.sleep(120)
        os._exit(0)
    note(child)
    os.wait()  # the daemon's parent
    while not os.path.exists(sys.argv[2]):  # until told to end (never, for a run killed at its deadline)
        time.sleep(0.01)
"""

SURVIVOR = """\
    import os, sys, time
    go, pids = sys.argv[1], sys.argv[2]
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    with open(pids, "w") as fh:
        fh.write(f"{os.getpid()} {child}\\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(f"/proc/{child}/stat", "rb") as fh:
        state = fh.read().rsplit(b")", 1)[1].split()[0]
    sys.exit(0 if os.path.exists(go) and state != b"Z" else 3)
"""


def _in_thread(argv: list[str], tmp_path: Path, name: str, timeout_s: float) -> tuple[threading.Thread, list[ProcessResult]]:
    out: list[ProcessResult] = []
    thread = threading.Thread(target=lambda: out.append(run_group(
        argv, cwd=str(tmp_path), env=dict(os.environ), timeout_s=timeout_s, output_path=str(tmp_path / f"{name}.out"))))
    thread.start()
    return thread, out


@pytest.mark.parametrize("deadline", [False, True], ids=["ends", "deadline"])
def test_two_concurrent_runs_sweep_only_their_own_processes(tmp_path: Path, deadline: bool) -> None:
    """A starts first and leaves a daemon and a child; B starts while A runs, with a child of its own; A then
    ends (or is killed at its deadline): A's sweep kills all of A and nothing of B, which ends by itself."""
    a_go, a_pids, b_go, b_pids = (tmp_path / n for n in ("a.go", "a.pids", "b.go", "b.pids"))
    zombies = _zombie_children()
    a_thread, a_out = _in_thread([*_script(tmp_path, "a", ESCAPER), str(a_pids), str(a_go)], tmp_path, "a",
                                 8 if deadline else 120)
    a_left = _pids(a_pids, 2)
    b_thread, b_out = _in_thread([*_script(tmp_path, "b", SURVIVOR), str(b_go), str(b_pids)], tmp_path, "b", 120)
    b_worker, b_child = _pids(b_pids, 2)  # B is under way, with a child of its own, started after A
    assert a_thread.is_alive(), "A ended before B started: the machine is too slow for this test's deadline"
    if not deadline:
        a_go.write_text("")
    a_thread.join(60)
    (a,) = a_out
    assert a.timed_out is deadline
    if not deadline:
        assert a.exit_code == 0
        assert set(a_left) <= set(a.detached_pids)  # found, killed and reported
    assert all(_gone(p) for p in a_left), "a process of the first run outlived it"
    assert b_worker not in a.detached_pids and b_child not in a.detached_pids
    assert _alive(b_worker) and _alive(b_child), "the first run's sweep killed the second run's processes"

    b_go.write_text("")
    b_thread.join(60)
    (b,) = b_out
    assert b.exit_code == 0 and b.signal is None and not b.timed_out, (tmp_path / "b.out").read_text()
    assert b.detached_pids == (b_child,)  # its own leftover, swept at its own end
    assert _gone(b_child)
    assert _zombie_children() <= zombies  # every process of both runs collected, none left to this process


def test_a_command_that_cannot_start_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        run_group([str(tmp_path / "no-such-worker")], cwd=str(tmp_path), env=dict(os.environ), timeout_s=10,
                  output_path=str(tmp_path / "out"))
    assert info.value.filename == str(tmp_path / "no-such-worker")


def test_exit_status_signal_and_pid_are_the_commands(tmp_path: Path) -> None:
    seen: list[int] = []
    argv = [sys.executable, "-c", "import os, sys; print(os.getpid()); sys.stdout.flush(); os.kill(os.getpid(), 15)"]
    result = run_group(argv, cwd=str(tmp_path), env=dict(os.environ), timeout_s=30,
                       output_path=str(tmp_path / "out"), on_start=seen.append)
    assert result.signal == 15 and result.exit_code is None and not result.timed_out
    assert seen == [int((tmp_path / "out").read_text())]  # `on_start` names the command, not its reaper
    assert result.tracking is True
    code = run_group([sys.executable, "-c", "raise SystemExit(7)"], cwd=str(tmp_path), env=dict(os.environ),
                     timeout_s=30, output_path=str(tmp_path / "out2"))
    assert code.exit_code == 7 and code.signal is None
