"""Workers that exhaust resources, through the real CLI: each is held to its limit and the evidence stays intact.

Issue 14, class 7 (docs/sandbox.md, "Resource limits"; docs/gated-path.md). Each
case builds a real git workspace from the wordfreq task, runs `proctor init` and
a first failing `proctor verify`, then dispatches a worker script written here to
exhaust one resource: processes, the sandbox's /tmp, memory, the output, the tree
(a sparse file, 100,000 files). The run is bounded by the proctor's own limits (a
generous pytest timeout guards only); the journal records how the dispatch ended
and verifies as a chain.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.workers.limits import mechanisms
from tests.support.cli import CliResult, run_proctor
from tests.support.tasks import TaskSetup

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 3
MakeTask = Callable[..., TaskSetup]


def prepared(task_setup: MakeTask, timeout_s: float = 60) -> tuple[TaskSetup, Path]:
    """An initialized wordfreq workspace with a failing receipt r0001."""
    ts = task_setup("wordfreq")
    ts.edit_task(lambda doc: doc["budget"].update(timeout_s=timeout_s))
    init = run_proctor("init", *ts.words())
    assert init.code == EXIT_OK, init.out
    first = run_proctor("verify", *ts.words())
    assert first.code == EXIT_FAILED and first.out["receipt_id"] == "r0001", first.out
    return ts, Path(init.out["state_dir"])


def worker(tmp_path: Path, body: str) -> list[str]:
    """A worker script written to cheat: `body` runs with `report(**fields)` printing one REPORT line."""
    script = tmp_path / "hostile.py"
    script.write_text(
        "import json, os, sys\n"
        "def report(**fields):\n"
        "    print('REPORT ' + json.dumps(fields), flush=True)\n" + body
    )
    return [sys.executable, str(script)]


def dispatch(ts: TaskSetup, argv: list[str], sandbox: str = "bwrap", **limits: str) -> CliResult:
    env = {f"PROCTOR_LIMIT_{k.upper()}": v for k, v in limits.items()}
    return run_proctor("dispatch", *ts.words(), "--sandbox", sandbox, "--command", "--", *argv, env=env, timeout=280)


def journal(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()]


def report_in(state: Path) -> dict[str, Any]:
    """The worker's REPORT line, from the one dispatch's kept output."""
    (output,) = (state / "dispatches").glob("*/output.log")
    found = [line[7:] for line in output.read_bytes().decode("utf-8", "replace").splitlines() if line.startswith("REPORT ")]
    assert len(found) == 1, found
    return dict(json.loads(found[0]))


def assert_ended(state: Path) -> dict[str, Any]:
    """The journal verifies as a chain and holds exactly one dispatch_end after the dispatch_start; returns it."""
    check = run_proctor("ledger", "verify", str(state / "journal.jsonl"))
    assert check.code == EXIT_OK and check.out["ok"] is True, check.out
    events = journal(state)
    kinds = [e["event"] for e in events]
    assert kinds.count("dispatch_start") == 1 and kinds.count("dispatch_end") == 1, kinds
    assert kinds.index("dispatch_end") > kinds.index("dispatch_start")
    return next(e for e in events if e["event"] == "dispatch_end")


def limits_of(state: Path) -> dict[str, Any]:
    start = next(e for e in journal(state) if e["event"] == "dispatch_start")
    return dict(start["sandbox"]["limits"])


FORK_BOMB = """
import signal
n = 0
error = None
while n < 5000:  # a guard for a host without the limit; the limit stops it far sooner
    try:
        pid = os.fork()
    except OSError as exc:
        error = exc.errno
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    n += 1
report(forked=n, errno=error)
"""


def test_a_fork_bomb_is_held_to_the_pids_limit(task_setup: MakeTask, tmp_path: Path) -> None:
    if "not enforced" in mechanisms()["pids"]:
        pytest.skip(f"no pids limit can be enforced on this host: {mechanisms()['pids']}")
    ts, state = prepared(task_setup)
    res = dispatch(ts, worker(tmp_path, FORK_BOMB), pids="64")
    assert res.code == EXIT_OK, res.out
    found = report_in(state)
    assert found["errno"] == 11 and found["forked"] < 64, found  # EAGAIN: the cgroup's pids.max
    limits = limits_of(state)
    assert limits["pids"] == 64 and limits["by"]["pids"].startswith("cgroup"), limits
    assert assert_ended(state)["exit_code"] == 0
    assert run_proctor("status", "--workspace", str(ts.workspace)).code == EXIT_OK


TMP_FILLER = """
import errno
written, error = 0, None
chunk = b"x" * (1 << 20)
try:
    with open("/tmp/fill", "wb") as fh:
        while written < (256 << 20):
            fh.write(chunk)
            fh.flush()
            written += len(chunk)
except OSError as exc:
    error = exc.errno
report(written=written, errno=error)
"""


def test_a_tmp_filler_is_stopped_at_the_sized_tmp(task_setup: MakeTask, tmp_path: Path) -> None:
    ts, state = prepared(task_setup)
    res = dispatch(ts, worker(tmp_path, TMP_FILLER), tmp_mb="16")
    assert res.code == EXIT_OK, res.out
    found = report_in(state)
    assert found["errno"] == 28 and found["written"] <= 16 << 20, found  # ENOSPC
    limits = limits_of(state)
    assert limits["tmp_bytes"] == 16 << 20 and limits["by"]["tmp_bytes"] == "bwrap --size --tmpfs /tmp", limits
    assert assert_ended(state)["exit_code"] == 0


MEMORY_HOG = """
held, got = [], 0
try:
    while got < (2 << 30):
        held.append(bytearray(64 << 20))  # touched: pages really used
        got += 64 << 20
        print("held", got, flush=True)
    report(held=got)
except MemoryError:
    report(held=got, error="MemoryError")
"""


def test_a_memory_hog_is_held_to_the_memory_limit(task_setup: MakeTask, tmp_path: Path) -> None:
    ts, state = prepared(task_setup)
    res = dispatch(ts, worker(tmp_path, MEMORY_HOG), memory_mb="256")
    assert res.code in (EXIT_OK, EXIT_FAILED), res.out  # exit 1: the worker was killed
    output = next((state / "dispatches").glob("*/output.log")).read_text()
    held = [int(line.split()[1]) for line in output.splitlines() if line.startswith("held ")]
    assert max(held, default=0) <= 256 << 20, output[-500:]
    assert "held=2147483648" not in output and '"held": 2147483648' not in output
    end = assert_ended(state)
    assert end["exit_code"] != 0 or "MemoryError" in output, end  # killed by the cgroup, or refused by the rlimit
    assert limits_of(state)["memory_bytes"] == 256 << 20


FLOOD_AND_FORGE = """
state = sys.argv[1]
chunk = b"y" * (1 << 20)
for _ in range(80):  # 80 MiB of output: past every reader's 64 MiB limit
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.flush()
with open(os.path.join(state, "receipts", "r0001.json"), "r+b") as fh:  # forge the failing receipt
    data = fh.read().replace(b'"passed":false', b'"passed":true')
    fh.seek(0)
    fh.truncate()
    fh.write(data)
"""


def test_a_flood_of_output_does_not_skip_the_state_check(task_setup: MakeTask, tmp_path: Path) -> None:
    ts, state = prepared(task_setup)
    res = dispatch(ts, [*worker(tmp_path, FLOOD_AND_FORGE), str(state)], "none")
    assert res.code == EXIT_REFUSED and res.out["refusal"] == "state_tampered", res.out
    assert str(state / "receipts" / "r0001.json") in res.out["paths"]
    end = assert_ended(state)
    assert end["output_truncated_from"] == 80 << 20 and end["output_bytes"] == 8 << 20, end
    kinds = [e["event"] for e in journal(state)]
    assert kinds.index("dispatch_end") < kinds.index("state_tampered"), kinds
    accept = run_proctor("accept", *ts.words())
    assert accept.code == EXIT_REFUSED and accept.out["refusal"] == "state_tampered", accept.out


def test_a_flood_of_output_in_the_sandbox_still_journals_the_end(task_setup: MakeTask, tmp_path: Path) -> None:
    ts, state = prepared(task_setup)
    res = dispatch(ts, worker(tmp_path, "for _ in range(80):\n    sys.stdout.buffer.write(b'z' * (1 << 20))\n"))
    assert res.code == EXIT_OK, res.out
    end = assert_ended(state)
    assert end["output_truncated_from"] == 80 << 20 and end["output_bytes"] == 8 << 20, end
    assert (state / "dispatches" / end["dispatch_id"] / "output.log").stat().st_size == 8 << 20


SPARSE = """
name = sys.argv[1]
try:
    with open(name, "wb") as fh:
        fh.truncate(4 << 30)  # 4 GiB of holes
    report(made=True)
except OSError as exc:
    report(made=False, errno=exc.errno)
"""


def test_a_sparse_file_is_refused_by_name_not_read(task_setup: MakeTask, tmp_path: Path) -> None:
    ts, state = prepared(task_setup)
    # In the sandbox the worker cannot make it: RLIMIT_FSIZE.
    res = dispatch(ts, [*worker(tmp_path, SPARSE), "holes.bin"])
    assert res.code == EXIT_OK, res.out
    assert report_in(state) == {"made": False, "errno": 27}  # EFBIG
    assert not (ts.workspace / "holes.bin").exists() or (ts.workspace / "holes.bin").stat().st_size <= 1 << 30
    (ts.workspace / "holes.bin").unlink(missing_ok=True)
    # A larger file-size limit lets it through; the tree scan then refuses it by name, and the end is journaled.
    res = dispatch(ts, [*worker(tmp_path, SPARSE), "holes.bin"], file_mb=str(8 << 10))
    sparse = ts.workspace / "holes.bin"
    assert sparse.stat().st_size == 4 << 30
    assert res.code == EXIT_REFUSED and res.out["refusal"] == "tree_file_too_large", res.out
    assert res.out["path"] == str(sparse)
    ends = [e for e in journal(state) if e["event"] == "dispatch_end"]
    assert len(ends) == 2 and "tree_after" not in ends[1] and str(sparse) in ends[1]["end_error"], ends
    check = run_proctor("ledger", "verify", str(state / "journal.jsonl"))
    assert check.code == EXIT_OK, check.out
    verify = run_proctor("verify", *ts.words())
    assert verify.code == EXIT_REFUSED and verify.out["refusal"] == "tree_file_too_large", verify.out
    assert verify.out["path"] == str(sparse)


MANY_FILES = """
os.makedirs("many", exist_ok=True)
for i in range(100_000):
    with open(f"many/f{i:06d}", "wb") as fh:
        fh.write(b"%d" % i)
report(made=100_000)
"""


def test_100000_files_are_signed_and_the_end_journaled(task_setup: MakeTask, tmp_path: Path) -> None:
    ts, state = prepared(task_setup, timeout_s=200)
    res = dispatch(ts, worker(tmp_path, MANY_FILES))
    assert res.code == EXIT_OK and res.out["exit_code"] == 0, res.out
    assert report_in(state) == {"made": 100_000}
    end = assert_ended(state)
    assert end["tree_after"] == res.out["tree_after"]["digest"] and end.get("end_error") is None
    assert res.out["tree_after"]["entries"] > 100_000
    status = run_proctor("status", "--workspace", str(ts.workspace))
    assert status.code == EXIT_OK, status.out
