"""ParsedMemo: one parse per key, the last few kept, refusals never kept, safe across threads."""

from __future__ import annotations

import threading

import pytest

from harness.evidence.memo import ParsedMemo


def test_a_key_is_parsed_once_and_the_oldest_key_goes_first() -> None:
    memo: ParsedMemo[str, list[str]] = ParsedMemo(keep=2)
    calls: list[str] = []

    def parse(key: str) -> list[str]:
        calls.append(key)
        return [key]

    a = memo.get("a", lambda: parse("a"))
    assert memo.get("a", lambda: parse("a")) is a
    memo.get("b", lambda: parse("b"))
    memo.get("c", lambda: parse("c"))  # "a" goes: two kept
    memo.get("a", lambda: parse("a"))
    assert calls == ["a", "b", "c", "a"]


def test_a_refusal_is_never_kept_and_keep_zero_parses_every_time() -> None:
    memo: ParsedMemo[str, int] = ParsedMemo()

    def refuse() -> int:
        raise ValueError("bad bytes")

    with pytest.raises(ValueError):
        memo.get("k", refuse)
    assert memo.get("k", lambda: 7) == 7
    never: ParsedMemo[str, object] = ParsedMemo(keep=0)
    assert never.get("k", object) is not never.get("k", object)


def test_threads_asking_for_one_key_all_get_one_value() -> None:
    memo: ParsedMemo[int, object] = ParsedMemo(keep=3)
    got: list[object] = []
    barrier = threading.Barrier(8)

    def ask() -> None:
        barrier.wait()
        for key in range(50):
            value = memo.get(key % 5, object)
            if key % 5 == 0:
                got.append(value)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 * 10  # no eviction race raised in any thread
