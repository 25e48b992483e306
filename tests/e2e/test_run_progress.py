"""`proctor run`'s progress display in a real process against the simulator: under a pseudo-terminal and a pipe.

Under a pty (python's `pty` module, a 120x40 window) the display redraws its block in
place (carriage return, cursor up) and the final screen shows the total and each
system exactly once. On a pipe it writes plain lines only, far fewer than the attempts
made (it used to write one line per admission, attempt and final). --json is silent on stderr;
a second signal's exit draws the last progress before its stop line.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

from tests.support.paths import REPO
from tests.support.study import Sim, logs, prereg, run_argv, runner_env, system, wait_in_flight
from tests.support.terminal import screen

ITEMS = 40


def start(tmp_path: Path, sim: Sim) -> tuple[list[str], dict[str, str], Path]:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.5)])
    p = prereg(tmp_path, items=ITEMS)
    results = tmp_path / "results"
    argv = [w for w in run_argv(p, results) if w != "--json"]
    return argv, {**runner_env(url), "TERM": "xterm"}, results / "rt" / "A"


def attempts(folder: Path) -> int:
    return len(logs(folder)["attempts"])


def test_under_a_terminal_the_block_is_redrawn_in_place_and_the_final_screen_shows_each_system_once(
        tmp_path: Path, sim: Sim) -> None:
    argv, env, folder = start(tmp_path, sim)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave)
    os.close(slave)
    got = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal's last other end
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, bytes(got))
    text = got.decode()
    assert "Traceback" not in text
    made = attempts(folder)
    redraws = text.count("\r\x1b[3A")  # back to the block's first column and up over its 3 lines
    assert redraws >= 1, text
    assert text.count("\x1b[2K") == 3 * (redraws + 1)  # every draw clears and writes the whole block
    assert redraws + 1 < made, (redraws, made)
    shown = screen(text)
    assert len(shown) == 3, shown
    assert [line.split()[0] for line in shown] == ["rt/A", "good", "bad"]
    assert all(line.endswith("done") and f"items {ITEMS}/{ITEMS}" in line for line in shown[1:]), shown
    assert all(len(line) <= 119 for line in shown)
    assert b"\x1b" not in out  # the summary on stdout is plain text


def test_on_a_pipe_plain_lines_far_fewer_than_the_attempts(tmp_path: Path, sim: Sim) -> None:
    argv, env, folder = start(tmp_path, sim)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "\x1b" not in done.stderr and "\r" not in done.stderr
    lines = done.stderr.splitlines()
    made = attempts(folder)
    # the first block, a line per state change (2 systems, each to done, with the total), the final block;
    # and a block every 10 s of a slow machine
    assert len(lines) <= 3 + 2 * 2 + 3 + 3 * 6, lines
    assert 3 * len(lines) < made, (len(lines), made)
    final = lines[-3:]
    assert [line.split()[1] for line in final] == ["good", "bad", "total"]
    assert all(line.endswith("done") for line in final[:2]), final
    assert sum(line.split()[1] == "good" for line in lines) <= 2 + 6


def test_with_json_stderr_has_no_progress_and_stdout_one_object(tmp_path: Path, sim: Sim) -> None:
    argv, env, _ = start(tmp_path, sim)
    done = subprocess.run([*argv, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stderr == ""
    summary = json.loads(done.stdout)
    assert [s["items"] for s in summary["progress"]["systems"]] == [ITEMS, ITEMS]


def test_a_second_signal_draws_the_last_progress_before_its_stop_line(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0, latency=1.5), system("sim-glm", 0.0, latency=1.5)], latency_scale=1.0)
    p = prereg(tmp_path, items=8)
    folder = tmp_path / "results" / "rt" / "A"
    argv = [w for w in run_argv(p, tmp_path / "results") if w != "--json"]
    proc = subprocess.Popen(argv, cwd=REPO, env=runner_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not (folder / "attempts.jsonl").exists():  # one attempt saved
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    wait_in_flight(folder, proc, intents=5)  # the second round (4 lanes) under way, 1.5 s each: cut by the 2nd signal
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT, err
    lines = err.splitlines()
    assert "stopped at once by a second signal" in lines[-1], lines
    assert [line.split()[1] for line in lines[-4:-1]] == ["good", "bad", "total"], lines
    assert len(lines) <= 3 + 2 * 2 + 3 + 1, lines
