"""A wall clock that never goes backwards.

The manual: docs/evidence.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["Clock", "utc_iso"]


def utc_iso(t: float) -> str:
    """`t` (epoch seconds) as an ISO 8601 UTC string with microseconds."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Clock:
    """Epoch seconds that never come earlier than a time returned before.

    A wall clock can step back (NTP, a VM resumed); evidence must not. `floor`
    carries the last time a previous process recorded, so the order also
    holds across invocations that read it back from their journal.
    """

    def __init__(self, floor: float = 0.0, source: Callable[[], float] = time.time) -> None:
        self._last = floor
        self._source = source
        self._lock = threading.Lock()

    def now(self) -> float:
        """The current time, or the last time returned if the wall clock went back."""
        with self._lock:
            t = self._source()
            if t < self._last:
                t = self._last
            self._last = t
            return t

    def advance_floor(self, t: float) -> None:
        """Never return a time earlier than `t` from now on."""
        with self._lock:
            self._last = max(self._last, t)
