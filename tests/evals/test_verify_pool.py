"""The verifier pool: real warm verifiers, shared, bounded, replaced when they die, stopped at close."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.evals.verify_humaneval import VerifierUnavailable, WarmVerifier
from harness.evals.verify_pool import VerifierPool, pool_size

PASS = "def f():\n    return 1\n\ndef check(candidate):\n    assert candidate() == 1\n"
FAIL = "def f():\n    return 2\n\ndef check(candidate):\n    assert candidate() == 1\n"


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie) in the process table."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_size_is_lanes_bounded_by_the_cores() -> None:
    assert pool_size(8, 2) == 2
    assert pool_size(1, 4) == 1
    assert pool_size(3, 3) == 3
    assert pool_size(0, 2) == 1  # never empty
    assert pool_size(1000) == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError):
        VerifierPool(0)


def test_nothing_starts_before_the_first_lease_and_leases_reuse_one_verifier() -> None:
    with VerifierPool(2) as pool:
        assert pool.made == 0 and pool.verifiers == ()
        with pool.lease() as v:
            assert v.run(PASS, check="f").passed
            pid = v.pid
        with pool.lease() as again:  # one caller at a time: the idle one is lent again, not a new one
            assert again is v and again.pid == pid
            assert again.run(FAIL, check="f").status == "failed"
        assert pool.made == 1


def test_at_most_size_verifiers_are_lent_at_once_and_each_to_one_caller() -> None:
    lent: set[int] = set()
    most = 0
    guard = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Barrier(5)

    def checker(pool: VerifierPool) -> None:
        nonlocal most
        try:
            for _ in range(3):
                with pool.lease() as v:
                    with guard:
                        assert id(v) not in lent, "a verifier was lent to two callers at once"
                        lent.add(id(v))
                        most = max(most, len(lent))
                    assert v.run(PASS, check="f").passed
                    with guard:
                        lent.discard(id(v))
        except BaseException as exc:
            errors.append(exc)
        done.wait()  # bwrap's worker dies with the thread that started it: no thread ends before the last check

    with VerifierPool(2) as pool:
        threads = [threading.Thread(target=checker, args=(pool,)) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert (pool.made, pool.replaced, most, len(pool.verifiers)) == (2, 0, 2, 2)


def test_a_killed_verifier_is_replaced_by_a_fresh_one() -> None:
    with VerifierPool(1) as pool:
        with pool.lease() as v:
            assert v.run(PASS, check="f").passed
            pid = v.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # the worker runs in its own session
        assert wait_gone(pid)
        with pool.lease() as fresh:
            assert fresh is not v and fresh.run(PASS, check="f").passed
            assert fresh.pid != pid
        assert (pool.made, pool.replaced) == (2, 1)
        assert pool.verifiers == (fresh,) and not v.alive()


def test_a_verifier_that_fails_is_dropped_and_the_failure_reaches_the_caller(tmp_path: Path) -> None:
    made: list[WarmVerifier] = []

    def factory() -> WarmVerifier:
        made.append(WarmVerifier(python=str(tmp_path / "no-python") if not made else None))
        return made[-1]

    with VerifierPool(1, factory) as pool:
        with pytest.raises(VerifierUnavailable), pool.lease() as v:
            v.run(PASS, check="f")
        assert pool.verifiers == () and pool.replaced == 1
        with pool.lease() as v:  # the next checker gets a working one
            assert v is made[1] and v.run(PASS, check="f").passed


def test_an_error_that_is_not_the_verifiers_keeps_it() -> None:
    with VerifierPool(1) as pool:
        with pytest.raises(KeyError), pool.lease() as v:
            assert v.run(PASS, check="f").passed
            raise KeyError("the caller's own failure")
        assert pool.verifiers == (v,) and pool.replaced == 0 and v.alive()


def test_close_stops_every_worker_and_refuses_later_leases() -> None:
    pool = VerifierPool(2)
    pids = []
    barrier, checked, end = threading.Barrier(2), threading.Barrier(3), threading.Event()

    def check() -> None:
        with pool.lease() as v:
            barrier.wait()  # both lent at once: two workers
            assert v.run(PASS, check="f").passed
            pids.append(v.pid)
        checked.wait()
        end.wait()  # bwrap's worker dies with the thread that started it: keep the threads until the end

    threads = [threading.Thread(target=check) for _ in range(2)]
    for t in threads:
        t.start()
    checked.wait()
    assert len(set(pids)) == 2 and all(pid is not None and running(pid) for pid in pids)
    pool.close()
    pool.close()  # idempotent
    end.set()
    for t in threads:
        t.join()
    assert all(pid is not None and not running(pid) for pid in pids)
    assert pool.verifiers == ()
    with pytest.raises(VerifierUnavailable, match="closed"), pool.lease():
        pass


def test_a_verifier_lent_at_close_is_stopped_when_its_lease_ends() -> None:
    pool = VerifierPool(1)
    with pool.lease() as v:
        assert v.run(PASS, check="f").passed
        pool.close()
        assert v.alive()  # its checker still holds it
    assert not v.alive() and pool.verifiers == ()


def test_a_verifier_whose_starting_thread_ended_is_replaced_at_its_next_lease() -> None:
    with VerifierPool(1) as pool:
        pids: list[int | None] = []

        def check() -> None:
            with pool.lease() as v:
                assert v.run(PASS, check="f").passed
                pids.append(v.pid)

        thread = threading.Thread(target=check)
        thread.start()
        thread.join()
        assert pids[0] is not None
        if wait_gone(pids[0], timeout=5.0):  # bwrap --die-with-parent: gone with its thread
            with pool.lease() as fresh:
                assert fresh.pid is None or fresh.pid != pids[0]
                assert fresh.run(PASS, check="f").passed
            assert (pool.made, pool.replaced) == (2, 1)
        else:  # a sandbox that outlives the thread (--sandbox none): the same one serves again
            with pool.lease() as same:
                assert same.pid == pids[0] and same.run(PASS, check="f").passed
            assert (pool.made, pool.replaced) == (1, 0)


def test_prestart_launches_workers_at_once_and_the_first_checks_use_them() -> None:
    with VerifierPool(2) as pool:
        assert pool.prestart(1) == 1  # until the pool holds what the caller asks for, within the size
        assert pool.prestart() == 1 and pool.prestart(2) == 0  # then as many as the size allows
        assert pool.prestart() == 0
        launched = pool.verifiers
        pids = {v.pid for v in launched}
        assert pool.made == 2 and None not in pids and all(running(pid) for pid in pids if pid is not None)
        with pool.lease() as v, pool.lease() as w:  # the launched ones, each ready by its first check
            assert {v.pid, w.pid} == pids
            assert v.run(PASS, check="f").passed and w.run(FAIL, check="f").status == "failed"
        assert pool.made == 2 and pool.replaced == 0
    assert all(pid is not None and wait_gone(pid) for pid in pids)  # closed with the pool


def test_close_stops_workers_launched_ahead_before_they_checked_anything() -> None:
    pool = VerifierPool(2)
    assert pool.prestart() == 2
    pids = [v.pid for v in pool.verifiers]
    pool.close()
    assert all(pid is not None and wait_gone(pid) for pid in pids)
    assert pool.prestart() == 0 and pool.verifiers == ()


def test_a_worker_launched_ahead_that_cannot_start_fails_its_first_lease_and_is_replaced(tmp_path: Path) -> None:
    made: list[WarmVerifier] = []

    def factory() -> WarmVerifier:
        made.append(WarmVerifier(python=str(tmp_path / "no-python") if not made else None))
        return made[-1]

    with VerifierPool(1, factory) as pool:
        if pool.prestart() == 1:  # launched in bwrap: it fails at its first check
            with pytest.raises(VerifierUnavailable), pool.lease() as v:
                assert v is made[0]
                v.run(PASS, check="f")
            assert pool.replaced == 1
        else:  # no sandbox: the launch itself fails and the verifier is dropped at once
            assert pool.verifiers == () and pool.made == 0 and len(made) == 1
        with pool.lease() as v:
            assert v is made[-1] and len(made) == 2 and v.run(PASS, check="f").passed
