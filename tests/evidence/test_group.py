"""The group-commit writer: the bytes a `ChainedLog` writes, batching, the order of a flush, refusals
and the failure of every waiter on a write error."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.evidence import group
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log, verify_log
from harness.evidence.group import GroupWriter
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from tests.support.paths import REPO

SEED = "study-x/run.jsonl"
_TORN_WRITE = re.compile(r"\..+\.tmp-[0-9]+")  # harness.run.upkeep's pattern for a kill's leftover


def rows(n: int, who: str = "a") -> list[dict[str, Any]]:
    return [{"who": who, "i": i, "pad": "x" * (i % 9), "f": i / 7, "ok": i % 2 == 0, "n": None} for i in range(n)]


class Fsyncs:
    """An fsync that records the file it synced (and may sleep, as a slow disk, or fail)."""

    def __init__(self, delay_s: float = 0.0, fail: Callable[[str], bool] | None = None) -> None:
        self.paths: list[str] = []
        self.delay_s = delay_s
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if self.fail is not None and self.fail(path):
            raise OSError(errno.EIO, "Input/output error")
        with self.lock:  # in the order the fsyncs start
            self.paths.append(os.path.basename(path))
        os.fsync(fd)
        if self.delay_s:
            time.sleep(self.delay_s)


def test_the_bytes_are_a_chained_logs_and_the_returned_records_are_as_written(tmp_path: Path) -> None:
    records = rows(40)
    ChainedLog(tmp_path / "a.jsonl", SEED).append_many(records)
    with GroupWriter() as writer:
        log = writer.log(tmp_path / "b.jsonl", SEED)
        assert log.appended_line == b"" and log.appended_head is None
        written = [log.stage(r) for r in records]
        assert not (tmp_path / "b.jsonl").exists() or writer.durable < writer.staged
        writer.wait()
        last = (tmp_path / "b.jsonl").read_bytes().splitlines()[-1]
        assert log.appended == 40 and log.appended_head == sha256_hex(last) and log.appended_line == last
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    assert [canonical_bytes(w) for w in written] == (tmp_path / "b.jsonl").read_bytes().splitlines()
    assert verify_log(tmp_path / "b.jsonl", SEED).lines == 40


def test_it_continues_a_log_and_a_chained_log_continues_after_it(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    ChainedLog(path, SEED).append_many(rows(5))
    with GroupWriter() as writer:
        log = writer.log(path, SEED)
        log.stage_many(rows(5, "g"))
    ChainedLog(path, SEED).append({"after": True})
    assert [r.get("who") for r in read_log(path, SEED)] == ["a"] * 5 + ["g"] * 5 + [None]


def test_concurrent_appenders_share_fsyncs(tmp_path: Path) -> None:
    """4 x `_IN_FLIGHT` threads each wait for every row: at most `_IN_FLIGHT` fsyncs of the log are on
    the disk at once, and a flush takes everything staged while the earlier ones were, so the rows need far
    fewer fsyncs than rows (with no more threads than fsyncs in flight, each row could have its own)."""
    fsyncs = Fsyncs(delay_s=0.003)
    threads, each = 4 * group._IN_FLIGHT, 15
    with GroupWriter(fsync=fsyncs) as writer:
        log = writer.log(tmp_path / "log.jsonl", SEED)

        def work(who: str) -> None:
            for r in rows(each, who):
                log.stage(r)
                writer.wait()

        workers = [threading.Thread(target=work, args=(f"t{k}",)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    records = read_log(tmp_path / "log.jsonl", SEED)
    assert len(records) == threads * each
    for k in range(threads):
        assert [r["i"] for r in records if r["who"] == f"t{k}"] == list(range(each))
    assert len(fsyncs.paths) <= threads * each // 3, len(fsyncs.paths)
    assert writer.flushes == len(fsyncs.paths)


def test_an_event_loop_awaits_durability(tmp_path: Path) -> None:
    fsyncs = Fsyncs(delay_s=0.002)
    writer = GroupWriter(fsync=fsyncs)
    log = writer.log(tmp_path / "log.jsonl", SEED)
    seen: list[int] = []

    async def lane(k: int) -> None:
        for i in range(20):
            log.stage({"k": k, "i": i})
            ticket = log.ticket
            assert ticket <= writer.staged
            await writer.settle(ticket)
            assert writer.durable >= ticket
            seen.append(k)

    async def main() -> None:
        await asyncio.gather(*(lane(k) for k in range(16)))

    asyncio.run(main())
    writer.close()
    assert len(seen) == 320 and verify_log(tmp_path / "log.jsonl", SEED).lines == 320
    assert len(fsyncs.paths) < 160


def test_one_wake_up_of_an_event_loop_settles_every_waiter_of_a_flush(tmp_path: Path) -> None:
    """16 lanes of one loop wait for the same flush: the writer wakes the loop once (one self-pipe write),
    not once per waiter, and every waiter is settled."""
    release = threading.Event()

    def held_fsync(fd: int) -> None:
        release.wait(10)
        os.fsync(fd)

    writer = GroupWriter(fsync=held_fsync)
    log = writer.log(tmp_path / "log.jsonl", SEED)

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        calls: list[Any] = []
        original = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(callback)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        log.stage({"i": 0})
        waiters = [asyncio.ensure_future(writer.settle(log.ticket)) for _ in range(16)]
        await asyncio.sleep(0.05)  # every waiter registered while the fsync is held
        assert not any(w.done() for w in waiters)
        release.set()
        await asyncio.gather(*waiters)
        return calls

    calls = asyncio.run(main())
    writer.close()
    assert len(calls) == 1, calls
    assert verify_log(tmp_path / "log.jsonl", SEED).lines == 1


def test_a_flush_writes_files_then_logs_in_their_order_and_a_barrier_splits_it(tmp_path: Path) -> None:
    fsyncs = Fsyncs()
    writer = GroupWriter(fsync=fsyncs)
    first = writer.log(tmp_path / "first.jsonl", "s1")
    second = writer.log(tmp_path / "second.jsonl", "s2")
    (tmp_path / "receipts").mkdir()
    with writer._cond:  # the writer thread waits: everything below is one batch
        second.stage({"b": 1})
        ticket = writer.stage_file(tmp_path / "receipts" / "r.json", b'{"r":1}\n', mode=0o644)
        first.stage({"a": 1})
        second.stage({"b": 2}, barrier=True)
        first.stage({"a": 2})  # after the barrier: a later group, so after second's b:2
        assert not (tmp_path / "receipts" / "r.json").exists()  # renamed into place by the flush only
    writer.wait()
    writer.close()
    assert writer.durable >= ticket
    assert (tmp_path / "receipts" / "r.json").read_bytes() == b'{"r":1}\n'
    assert oct((tmp_path / "receipts" / "r.json").stat().st_mode & 0o777) == "0o644"
    assert fsyncs.paths == [f".r.json.g1.tmp-{os.getpid()}", "first.jsonl", "second.jsonl", "first.jsonl"]
    assert os.listdir(tmp_path / "receipts") == ["r.json"]
    assert [r["a"] for r in read_log(tmp_path / "first.jsonl", "s1")] == [1, 2]


def test_the_next_group_of_the_same_log_writes_while_the_last_fsync_is_in_flight(tmp_path: Path) -> None:
    """A group's last fsync is left in flight; the next group of the same log writes and syncs beside it,
    and its fsync covers both (two fsyncs in flight, as concurrent raw appenders get)."""
    release = threading.Event()
    started: list[int] = []

    def held_fsync(fd: int) -> None:
        started.append(fd)
        if len(started) == 1:
            release.wait(10)  # the first fsync stays in flight
        os.fsync(fd)

    writer = GroupWriter(fsync=held_fsync)
    log = writer.log(tmp_path / "log.jsonl", SEED)
    log.stage({"i": 0})
    first = log.ticket
    while not started:
        time.sleep(0.001)
    log.stage({"i": 1})
    writer.wait(log.ticket)  # durable by the second fsync, the first still held
    assert writer.durable >= first and len(started) == 2 and not release.is_set()
    release.set()
    writer.close()
    assert [r["i"] for r in read_log(tmp_path / "log.jsonl", SEED)] == [0, 1]


class HeldFsyncs:
    """An fsync per call that waits for its own release (then really syncs), recording the paths it started on."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates = [threading.Event() for _ in range(64)]
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self._lock:
            n = len(self.started)
            self.started.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        assert self.gates[n].wait(10)
        os.fsync(fd)

    def wait_started(self, n: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.started) < n:
            assert time.monotonic() < deadline
            time.sleep(0.001)


def test_up_to_in_flight_fsyncs_of_one_log_overlap_and_each_publishes_what_it_covers(tmp_path: Path) -> None:
    """Each group of one log leaves its fsync in flight, up to `_IN_FLIGHT` at once (the next group
    waits for the oldest); a later fsync, started after every earlier group's write, publishes
    them all, even while the earlier fsyncs are still held."""
    fsyncs = HeldFsyncs()
    writer = GroupWriter(fsync=fsyncs)
    log = writer.log(tmp_path / "log.jsonl", SEED)
    tickets = []
    for i in range(group._IN_FLIGHT + 1):
        log.stage({"i": i})
        tickets.append(log.ticket)
        if i < group._IN_FLIGHT:
            fsyncs.wait_started(i + 1)
    time.sleep(0.05)
    assert len(fsyncs.started) == group._IN_FLIGHT  # the last group waits for the oldest fsync
    assert writer.durable == 0  # every fsync held: nothing is durable yet
    fsyncs.gates[group._IN_FLIGHT - 1].set()  # the newest in flight returns first
    writer.wait(tickets[group._IN_FLIGHT - 1])  # it covers every group before it
    assert len(fsyncs.started) == group._IN_FLIGHT  # the oldest is still held: no further fsync yet
    for gate in fsyncs.gates:
        gate.set()
    writer.wait(tickets[-1])
    writer.close()
    assert [r["i"] for r in read_log(tmp_path / "log.jsonl", SEED)] == list(range(group._IN_FLIGHT + 1))


def test_a_group_writing_another_log_first_waits_for_the_fsyncs_in_flight(tmp_path: Path) -> None:
    """Its own fsync would not cover the other log's lines: it must not publish before theirs are done."""
    fsyncs = HeldFsyncs()
    writer = GroupWriter(fsync=fsyncs)
    first = writer.log(tmp_path / "first.jsonl", "s1")
    second = writer.log(tmp_path / "second.jsonl", "s2")
    first.stage({"a": 1})
    fsyncs.wait_started(1)
    second.stage({"b": 1})
    time.sleep(0.05)
    assert fsyncs.started == ["first.jsonl"] and writer.durable == 0
    fsyncs.gates[1].set()  # the second log's fsync may run at once when it starts: still behind the first
    time.sleep(0.05)
    assert fsyncs.started == ["first.jsonl"] and writer.durable == 0
    fsyncs.gates[0].set()
    writer.wait(second.ticket)
    assert fsyncs.started == ["first.jsonl", "second.jsonl"]
    writer.close()


def test_a_staged_files_temporary_name_is_one_the_runner_removes_after_a_kill(tmp_path: Path) -> None:
    writer = GroupWriter(fsync=lambda fd: time.sleep(0.2))
    writer.log(tmp_path / "log.jsonl", SEED).stage({"hold": 1})
    time.sleep(0.05)
    writer.stage_file(tmp_path / "r.json", b"{}\n")
    names = [n for n in os.listdir(tmp_path) if n.startswith(".r.json")]
    assert len(names) == 1 and _TORN_WRITE.fullmatch(names[0]), names
    writer.close()
    assert sorted(os.listdir(tmp_path)) == ["log.jsonl", "r.json"]


def test_a_leftover_temporary_file_of_the_same_name_is_replaced_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"keep")
    (tmp_path / f".a.json.g1.tmp-{os.getpid()}").write_bytes(b"stale")  # an earlier process with this pid
    (tmp_path / f".b.json.g2.tmp-{os.getpid()}").symlink_to(elsewhere)
    with GroupWriter() as writer:
        writer.stage_file(tmp_path / "a.json", b"{}\n")
        writer.stage_file(tmp_path / "b.json", b"[]\n")
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "elsewhere"]
    assert (tmp_path / "a.json").read_bytes() == b"{}\n" and (tmp_path / "b.json").read_bytes() == b"[]\n"
    assert elsewhere.read_bytes() == b"keep" and not (tmp_path / "b.json").is_symlink()


def test_a_write_error_fails_every_waiter_with_the_same_refusal(tmp_path: Path) -> None:
    fsyncs = Fsyncs(delay_s=0.01, fail=lambda path: path.endswith("bad.jsonl"))
    writer = GroupWriter(fsync=fsyncs)
    good = writer.log(tmp_path / "good.jsonl", "g")
    bad = writer.log(tmp_path / "bad.jsonl", "b")
    good.stage({"i": 0})
    writer.wait()
    errors: list[str] = []

    def waiter(k: int) -> None:
        try:
            (bad if k % 2 else good).stage({"k": k})
            writer.wait()
        except Refusal as exc:
            errors.append(str(exc.code))
        else:
            errors.append("durable")

    async def aw() -> str:
        try:  # refused at the stage when a bad flush already failed the writer, else at the settle
            good.stage({"async": 1})
            await writer.settle()
        except Refusal as exc:
            return str(exc.code)
        return "durable"

    workers = [threading.Thread(target=waiter, args=(k,)) for k in range(6)]
    for w in workers:
        w.start()
    got_async = asyncio.run(aw())
    for w in workers:
        w.join()
    assert got_async == "log_write_failed"
    assert errors.count("log_write_failed") >= 3 and set(errors) <= {"log_write_failed", "durable"}
    with pytest.raises(Refusal) as later:
        good.stage({"after": 1})
    assert later.value.code == "log_write_failed"
    with pytest.raises(Refusal) as closed:
        writer.close()
    assert closed.value.code == "log_write_failed"
    assert verify_log(tmp_path / "good.jsonl", "g").ok


_LIMITED = textwrap.dedent(
    """
    import resource, signal, sys
    from harness.errors import Refusal
    from harness.evidence.group import GroupWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (5000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    writer = GroupWriter()
    log = writer.log(sys.argv[1], "s")
    done = 0
    try:
        for i in range(200):
            log.stage({"i": i, "pad": "p" * 100})
            writer.wait()
            done += 1
    except Refusal as exc:
        print(exc.code, done, exc.message)
    """
)


def test_a_real_write_error_is_log_write_failed(tmp_path: Path) -> None:
    """A file size limit cuts a write short, as a full disk would: the waiter is refused, never told durable."""
    path = tmp_path / "log.jsonl"
    out = subprocess.run([sys.executable, "-c", _LIMITED, str(path)], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out[0] == "log_write_failed", out
    durable = int(out[1])
    assert 0 < durable < 200
    status = verify_log(path, "s")
    assert status.lines == durable and (status.ok or (status.problem is not None and status.problem.kind == "torn_tail"))


_OTHER = textwrap.dedent(
    """
    import sys
    from harness.evidence.chain import ChainedLog
    ChainedLog(sys.argv[1], sys.argv[2]).append({"other": "process"})
    """
)


def test_a_second_process_appending_between_flushes_is_refused_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    writer = GroupWriter()
    log = writer.log(path, SEED)
    log.stage({"i": 0})
    writer.wait()
    subprocess.run([sys.executable, "-c", _OTHER, str(path), SEED], env={**os.environ, "PYTHONPATH": str(REPO)},
                   check=True, timeout=60)
    log.stage({"i": 1})
    with pytest.raises(Refusal) as caught:
        writer.wait()
    assert caught.value.code == "log_changed" and caught.value.path == str(path)
    with pytest.raises(Refusal):
        writer.close()
    assert [r.get("i", r.get("other")) for r in read_log(path, SEED)] == [0, "process"]


def test_a_torn_tail_or_another_seed_is_refused_at_the_first_stage(tmp_path: Path) -> None:
    torn = tmp_path / "torn.jsonl"
    ChainedLog(torn, SEED).append({"i": 0})
    with torn.open("ab") as f:
        f.write(b'{"i":1')
    other = tmp_path / "other.jsonl"
    ChainedLog(other, "another seed").append({"i": 0})
    with GroupWriter() as writer:
        for path, code in ((torn, "log_torn_tail"), (other, "log_seed_mismatch")):
            with pytest.raises(Refusal) as caught:
                writer.log(path, SEED).stage({"i": 9})
            assert caught.value.code == code


def _deep_dict(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


@pytest.mark.parametrize("record", [{"x": float("nan")}, {"x": object()}, {"x": "\ud800"}, {1: "a", "1": "b"},
                                    {"deep": json.loads("[" * 70 + "]" * 70)}, {"prev": "x"},
                                    {"deep": _deep_dict(70)}, {"l": [1, ("t", {1: "a", "1": "b"})]}],
                         ids=["nan", "object", "surrogate", "colliding-keys", "too-deep", "reserved",
                              "too-deep-dicts", "colliding-keys-in-a-list"])
def test_a_record_that_would_not_read_back_is_refused_and_nothing_is_staged(tmp_path: Path, record: Any) -> None:
    path = tmp_path / "log.jsonl"
    with GroupWriter() as writer:
        log = writer.log(path, SEED)
        log.stage({"i": 0})
        with pytest.raises(Refusal) as caught:
            log.stage(record)
        assert caught.value.code in ("log_record_invalid", "log_record_reserved")
        log.stage({"m": {1: "int key"}})  # a key json writes as a string: read back to be sure, and kept
        log.stage({"i": 1})
    assert [r.get("i") for r in read_log(path, SEED)] == [0, None, 1]
    assert verify_log(path, SEED).ok


def test_the_stages_of_one_event_loop_iteration_are_one_flush(tmp_path: Path) -> None:
    """Lanes resumed in one iteration of a loop stage to three logs, the thread releasing the GIL between
    stages (as hashing a long line or a system call does): the writer is woken once, at the end of the
    iteration, and writes all of it in one flush (one fsync per log); a thread without a loop wakes it at
    once, and a blocking `wait` from the loop's own thread does not wait for the iteration's end."""
    fsyncs = Fsyncs()
    writer = GroupWriter(fsync=fsyncs)
    logs = [writer.log(tmp_path / f"{name}.jsonl", SEED) for name in ("wire", "attempts", "run")]

    async def lane(k: int) -> None:
        for log in logs:
            log.stage({"k": k})
            time.sleep(0.005)  # the GIL released: an eagerly woken writer would take what is staged so far
        await writer.settle()

    async def main() -> None:
        await asyncio.gather(*(lane(k) for k in range(4)))
        assert writer.flushes == 1 and sorted(fsyncs.paths) == ["attempts.jsonl", "run.jsonl", "wire.jsonl"]
        logs[2].stage({"k": "sync"})
        writer.wait()  # from the loop's thread, before the iteration ends: woken now, not deadlocked
        assert writer.flushes == 2

    asyncio.run(main())
    staged = threading.Thread(target=lambda: logs[0].stage({"k": "thread"}))
    staged.start()
    staged.join()
    deadline = time.monotonic() + 10
    while writer.durable < writer.staged and time.monotonic() < deadline:  # nobody waits: flushed anyway
        time.sleep(0.005)
    assert writer.durable == writer.staged and writer.flushes == 3
    writer.close()
    for name, n in (("wire", 5), ("attempts", 4), ("run", 5)):
        assert verify_log(tmp_path / f"{name}.jsonl", SEED).lines == n
