"""A small, thread-safe memo of what was parsed from bytes: the same bytes at the same path give the same
frozen value, so a reader that hashes what it read may skip parsing it again.

The key always includes the sha256 of the bytes just read, so a changed byte is parsed again and a refusal
is never answered from an earlier read. See docs/evidence.md ("Parse reuse").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ParsedMemo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ParsedMemo(Generic[K, V]):
    """The last `keep` values parsed, by key (`keep=0`: never keep, every call parses)."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._values: dict[K, V] = {}
        self._lock = threading.Lock()

    def get(self, key: K, parse: Callable[[], V]) -> V:
        """The value kept for `key`, else `parse()` (outside the lock; its refusal propagates, nothing kept)."""
        with self._lock:
            if key in self._values:
                return self._values[key]
        value = parse()
        with self._lock:
            if self._keep > 0:
                while len(self._values) >= self._keep:
                    del self._values[next(iter(self._values))]
                self._values.setdefault(key, value)
                return self._values[key]
        return value
