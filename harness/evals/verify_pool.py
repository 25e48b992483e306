"""Warm verifiers shared by every system of a run: at most `size`, started on demand, one user each.

The manual: docs/evals.md ("The verifier pool").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from harness.evals.verify_humaneval import VerifierUnavailable, WarmVerifier

__all__ = ["VerifierPool", "pool_size"]


def pool_size(lanes: int, cores: int | None = None) -> int:
    """min(lanes, cores), at least 1; `cores` defaults to the CPUs this process may run on."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return max(1, min(lanes, cores))


class VerifierPool:
    """At most `size` warm verifiers, each lent to one checker at a time (`lease`).

    A verifier is made only when a lease finds none idle (so a run that checks
    nothing starts none), or ahead of the first checks by `prestart`, which
    launches workers without waiting for them. A lent verifier whose worker died, or whose lease ended
    in `VerifierUnavailable`, is closed and dropped; the next lease makes a fresh
    one (`replaced` counts them). `close` stops every verifier and refuses later
    leases; it is idempotent.
    """

    def __init__(self, size: int, factory: Callable[[], WarmVerifier] = WarmVerifier) -> None:
        if size < 1:
            raise ValueError("a verifier pool holds at least one verifier")
        self.size = size
        self.factory = factory
        self.made = 0
        self.replaced = 0
        self._idle: list[WarmVerifier] = []
        self._lent: set[WarmVerifier] = set()
        self._cond = threading.Condition()
        self._closed = False

    @property
    def verifiers(self) -> tuple[WarmVerifier, ...]:
        """Every verifier the pool holds now, idle or lent."""
        with self._cond:
            return (*self._idle, *self._lent)

    def _take(self) -> WarmVerifier:
        with self._cond:
            while True:
                if self._closed:
                    raise VerifierUnavailable("the verifier pool is closed")
                if self._idle:
                    verifier = self._idle.pop(0)  # the longest idle: a launched one is likeliest ready
                    break
                if len(self._lent) < self.size:
                    verifier = self.factory()
                    self.made += 1
                    break
                self._cond.wait()
            self._lent.add(verifier)
        return verifier

    def _give_back(self, verifier: WarmVerifier, *, broken: bool) -> None:
        with self._cond:
            self._lent.discard(verifier)
            keep = not broken and not self._closed
            if keep:
                self._idle.append(verifier)
            self._cond.notify()
        if not keep:
            verifier.close()
            if broken:
                with self._cond:
                    self.replaced += 1

    def prestart(self, count: int | None = None) -> int:
        """Launch verifiers' workers now until the pool holds `count` (at most, and by default, `size`),
        idle at once and each ready by its first check, so that they start while the caller goes on; how
        many it launched. Call it from a thread that outlives the checks (bwrap ends a worker with the thread that
        launched it). A launch that fails is dropped: the lease that needs a verifier meets the failure."""
        with self._cond:
            held = len(self._idle) + len(self._lent)
            launched = []
            for _ in range(0 if self._closed else max(0, min(self.size, self.size if count is None else count) - held)):
                verifier = self.factory()
                try:
                    verifier.launch()
                except VerifierUnavailable:
                    verifier.close()
                    break
                launched.append(verifier)
            self._idle.extend(launched)
            self.made += len(launched)
            self._cond.notify_all()
        return len(launched)

    @contextlib.contextmanager
    def lease(self) -> Iterator[WarmVerifier]:
        """One verifier for this caller alone until the block ends (waits while all `size` are lent)."""
        verifier = self._take()
        if verifier.pid is not None and not verifier.alive():  # died while idle: a fresh one instead
            self._give_back(verifier, broken=True)
            verifier = self._take()
        broken = True
        try:
            yield verifier
            broken = False
        except VerifierUnavailable:
            raise
        except BaseException:
            broken = False
            raise
        finally:
            self._give_back(verifier, broken=broken)

    def close(self) -> None:
        """Stop every idle verifier now and each lent one when its lease ends; refuse later leases."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        stopping = [threading.Thread(target=v.close, name="proctor-verifier-close") for v in idle[1:]]
        for thread in stopping:  # each waits for its worker's exit: all at once, not one after another
            thread.start()
        for verifier in idle[:1]:
            verifier.close()
        for thread in stopping:
            thread.join()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
