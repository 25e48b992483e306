"""A writer killed with SIGKILL at random moments never corrupts a chained log.

After each kill the log either verifies, or reports exactly one problem: a
torn tail at its last line. A repair quarantines exactly those bytes and the
chain continues; nothing written before a kill is ever lost.
"""

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
from harness.evidence.chain_read import verify_log
from harness.evidence.jsonio import canonical_bytes
from tests.support.paths import REPO

SEED = "crash-study/attempts.jsonl"
KILLS = 45

_CHILD = textwrap.dedent(
    """
    import os, random, resource, signal, sys, time
    from harness.errors import Refusal
    from harness.evidence.chain import ChainedLog
    path, seed, round_no, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if limit:  # a file size limit cuts a write short, as a full disk would
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    log = ChainedLog(path, seed)
    rng = random.Random(round_no)
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    i = 0
    while True:
        pad = "x" * rng.randint(100_000, 1_500_000)
        try:
            if i % 5 == 4:
                log.append_many([{"round": round_no, "i": i, "k": k, "pad": pad} for k in range(3)])
            else:
                log.append({"round": round_no, "i": i, "pad": pad})
        except Refusal as exc:  # over the limit, or after a torn write: wait to be killed
            assert exc.code in ("log_write_failed", "log_torn_tail"), exc
            time.sleep(0.001)
        i += 1
    """
)


def _tail(path: Path, size: int = 16 << 20) -> bytes:
    """The last `size` bytes (more than any record the child writes)."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read()


def _last_line(path: Path) -> bytes:
    data = _tail(path)
    assert data.endswith(b"\n")
    return data[:-1].rsplit(b"\n", 1)[-1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_at_random_moments_leaves_an_intact_or_torn_repairable_log(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(20240531)
    kept_len = 0
    kept_last = b""
    kept_last_len = 0
    lines_seen = 0
    torn_seen = 0
    limited_torn = 0
    started = time.monotonic()
    for round_no in range(KILLS):
        # Every third round the child also runs under a file size limit a little
        # above the log's size: SIGKILL alone rarely lands inside a write (JSON
        # work dominates an append), a cut-short write makes a torn tail for sure.
        limit = kept_len + rng.randint(1, 3_000_000) if round_no % 3 == 2 else 0
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), SEED, str(round_no), str(limit)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        ready = child.stdout.readline()
        assert ready == b"ready\n", child.stderr.read() if child.stderr else ready
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL, (
            child.returncode,
            child.stderr.read() if child.stderr else b"",
        )

        size = path.stat().st_size if path.exists() else 0
        assert size >= kept_len
        if kept_len:  # the line that ended the log before this round is still there, unchanged
            with path.open("rb") as f:
                f.seek(kept_len - kept_last_len - 1)
                assert f.read(kept_last_len + 1) == kept_last + b"\n"

        log = ChainedLog(path, SEED)
        status = log.status()  # verifies every line: the chain pins all earlier bytes to kept_last
        assert status.lines >= lines_seen
        if status.problem is not None:
            assert status.problem.kind == "torn_tail", status.problem
            assert status.problem.line == status.lines + 1
            torn = _tail(path).rsplit(b"\n", 1)[-1]
            assert torn and f"a torn tail of {len(torn)} bytes; run `proctor ledger repair FILE`" in (
                status.problem.message  # issue 13 item 10: the refusal names the command that repairs it
            )
            torn_seen += 1
            limited_torn += bool(limit)
            report = log.repair()
            assert report["repaired"] and report["torn_bytes"] == len(torn)
            assert report["torn_sha256"] == hashlib.sha256(torn).hexdigest()
            assert Path(report["quarantine"]).read_bytes() == torn
            assert report["line"] == status.lines + 1
            assert _last_line(path) == canonical_bytes(report["record"])
            assert report["record"]["event"] == "log_repair"
            log.append({"after_repair": round_no})
            after = verify_log(path, SEED)
            assert after.ok and after.lines == status.lines + 2, after
            lines_seen = after.lines
        else:
            log.append({"after_kill": round_no})
            lines_seen = status.lines + 1
        kept_last = _last_line(path)
        kept_last_len = len(kept_last)
        kept_len = path.stat().st_size
    print(
        f"\n{KILLS} kills: {lines_seen} lines, {torn_seen} torn tails repaired "
        f"({limited_torn} under a size limit), "
        f"{kept_len / 1e6:.1f} MB, {time.monotonic() - started:.1f} s"
    )
    assert lines_seen >= KILLS
    assert limited_torn >= 1, "no round produced a torn tail: the repair path went untested"
    assert verify_log(path, SEED).lines == lines_seen
