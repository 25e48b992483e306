"""A group-commit writer killed with SIGKILL while its flushes are in flight: each log verifies (or
has a torn tail that `repair` fixes), every line a waiter was told is durable is there, and no line
of the later log names a line of the earlier one that is missing (the flush order)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log, verify_log
from tests.support.paths import REPO

ROUNDS = 14
THREADS = 6

_CHILD = textwrap.dedent(
    """
    import hashlib, random, sys, threading
    from harness.evidence.group import GroupWriter
    from harness.evidence.jsonio import canonical_bytes
    folder, round_no = sys.argv[1], int(sys.argv[2])
    writer = GroupWriter()
    first = writer.log(folder + "/first.jsonl", "first")
    second = writer.log(folder + "/second.jsonl", "second")
    out = threading.Lock()

    def work(k):
        rng = random.Random(round_no * 100 + k)
        i = 0
        while True:
            a = first.stage({"round": round_no, "t": k, "i": i, "pad": "x" * rng.randint(0, 60_000)})
            ref = hashlib.sha256(canonical_bytes(a)).hexdigest()
            second.stage({"round": round_no, "t": k, "i": i, "first": ref})
            writer.wait()
            with out:
                sys.stdout.write(f"{round_no} {k} {i}\\n")
                sys.stdout.flush()
            i += 1

    for k in range(int(sys.argv[3])):
        threading.Thread(target=work, args=(k,), daemon=True).start()
    threading.Event().wait()
    """
)


def _intact(path: Path, seed: str) -> int:
    """Verify the log, repairing a torn tail (the only problem a kill may leave); its lines."""
    if not path.exists():
        return 0
    status = verify_log(path, seed)
    if status.problem is not None:
        assert status.problem.kind == "torn_tail", status.problem
        report = ChainedLog(path, seed).repair()
        assert report["repaired"]
        status = verify_log(path, seed)
    assert status.ok, status
    return status.lines


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_during_group_flushes_keeps_every_durable_line_and_the_flush_order(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(20261202)
    told: set[tuple[int, int, int]] = set()
    started = time.monotonic()
    lines = 0
    for round_no in range(ROUNDS):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(round_no), str(THREADS)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None
        first_told = child.stdout.readline()  # flushes are under way
        if not first_told.endswith(b"\n"):
            child.kill()
            raise AssertionError(child.communicate(timeout=30))
        time.sleep(rng.uniform(0.0, 0.15))
        child.send_signal(signal.SIGKILL)
        rest, err = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGKILL, (child.returncode, err)
        for row in (first_told + rest).split(b"\n")[:-1]:  # a line cut by the kill has no newline
            r, k, i = map(int, row.split())
            told.add((r, k, i))

        lines = _intact(tmp_path / "first.jsonl", "first")
        _intact(tmp_path / "second.jsonl", "second")
        first = [r for r in read_log(tmp_path / "first.jsonl", "first") if "t" in r]
        second = [r for r in read_log(tmp_path / "second.jsonl", "second") if "t" in r]
        shas = {hashlib.sha256(raw).hexdigest()
                for raw in (tmp_path / "first.jsonl").read_bytes().splitlines()}
        assert all(r["first"] in shas for r in second), "a line of the second log names a missing first line"
        keys_first = {(r["round"], r["t"], r["i"]) for r in first}
        keys_second = {(r["round"], r["t"], r["i"]) for r in second}
        assert told <= keys_first and told <= keys_second, sorted(told - keys_first - keys_second)[:5]
        for k in range(THREADS):  # each thread's lines in order, none twice
            mine = [r["i"] for r in first if r["round"] == round_no and r["t"] == k]
            assert mine == list(range(len(mine)))
    print(f"\n{ROUNDS} kills: {lines} lines in the first log, {len(told)} told durable, "
          f"{time.monotonic() - started:.1f} s")
    assert len(told) >= ROUNDS
