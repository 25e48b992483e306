"""The non-decreasing clock and UTC timestamps."""

from __future__ import annotations

import itertools
import re
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evidence.clock import Clock, utc_iso

_times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


class _Script:
    """A fake wall clock replaying a fixed list of times."""

    def __init__(self, times: list[float]) -> None:
        self.times = list(times)
        self.calls = 0

    def __call__(self) -> float:
        t = self.times[self.calls]
        self.calls += 1
        return t


@settings(max_examples=200, deadline=None)
@given(st.lists(_times, min_size=1, max_size=50), _times)
def test_now_never_decreases(source_times: list[float], floor: float) -> None:
    clock = Clock(floor=floor, source=_Script(source_times))
    seen = [clock.now() for _ in source_times]
    assert all(a <= b for a, b in itertools.pairwise(seen))
    assert all(t >= floor for t in seen)
    # exactly the running maximum of the floor and the source
    running = floor
    for got, source in zip(seen, source_times, strict=True):
        running = max(running, source)
        assert got == running


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["now", "advance"]), _times),
        min_size=1,
        max_size=60,
    )
)
def test_advance_floor_interleaved(ops: list[tuple[str, float]]) -> None:
    source_times = [t for op, t in ops if op == "now"]
    clock = Clock(source=_Script(source_times))
    last = 0.0
    floor = 0.0
    for op, t in ops:
        if op == "advance":
            clock.advance_floor(t)
            floor = max(floor, t)
        else:
            got = clock.now()
            assert got >= last
            assert got >= floor
            assert got == max(last, floor, t)
            last = got


def test_floor_respected() -> None:
    clock = Clock(floor=100.0, source=lambda: 50.0)
    assert clock.now() == 100.0
    assert clock.now() == 100.0


def test_source_ahead_of_floor_is_used() -> None:
    clock = Clock(floor=100.0, source=_Script([150.0, 120.0, 200.0]))
    assert [clock.now(), clock.now(), clock.now()] == [150.0, 150.0, 200.0]


def test_advance_floor() -> None:
    clock = Clock(source=lambda: 10.0)
    assert clock.now() == 10.0
    clock.advance_floor(20.0)
    assert clock.now() == 20.0
    clock.advance_floor(5.0)  # a lower floor never moves time back
    assert clock.now() == 20.0


def test_default_source_is_wall_clock() -> None:
    clock = Clock()
    before = time.time()
    got = clock.now()
    after = time.time()
    assert before <= got <= after


def test_utc_iso_examples() -> None:
    assert utc_iso(0) == "1970-01-01T00:00:00.000000Z"
    assert utc_iso(0.0) == "1970-01-01T00:00:00.000000Z"
    assert utc_iso(1.5) == "1970-01-01T00:00:01.500000Z"
    assert utc_iso(1_700_000_000) == "2023-11-14T22:13:20.000000Z"
    assert utc_iso(951_782_400.25) == "2000-02-29T00:00:00.250000Z"


_ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_utc_iso_format_and_value(t: float) -> None:
    text = utc_iso(t)
    assert _ISO.fullmatch(text), text
    parsed = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert abs(parsed.timestamp() - t) <= 1e-6 + abs(t) * sys.float_info.epsilon


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=4_000_000_000),
    st.integers(min_value=0, max_value=4_000_000_000),
)
def test_utc_iso_order_matches_time_order(a: int, b: int) -> None:
    # Fixed width: string order is time order, so logs sort correctly as text.
    assert (utc_iso(a) < utc_iso(b)) == (a < b)


def test_thread_safety() -> None:
    threads_n, calls_n = 8, 1500
    total = threads_n * calls_n
    # A jittery source that often steps back; index = order of calls under the lock.
    script = [float((i // 3) * 10 - (i % 3) * 7) for i in range(total)]
    source = _Script(script)
    clock = Clock(source=source)
    results: list[list[float]] = [[] for _ in range(threads_n)]
    start = threading.Barrier(threads_n)

    def worker(k: int) -> None:
        start.wait()
        out = results[k]
        for _ in range(calls_n):
            out.append(clock.now())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        sys.setswitchinterval(old)

    assert source.calls == total
    for seq in results:
        assert len(seq) == calls_n
        assert all(a <= b for a, b in itertools.pairwise(seq))
    # The values handed out are exactly the running maxima of the source in call
    # order: no update was lost and no thread saw a time another had passed.
    expected: list[float] = []
    running = 0.0
    for t in script:
        running = max(running, t)
        expected.append(running)
    assert Counter(t for seq in results for t in seq) == Counter(expected)
