"""Provenance of a run or an analysis: the harness version and the git commit it ran from.

The manual: docs/records.md (run events) and docs/analysis.md (provenance.csv).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness._version import __version__
from harness.evidence.checkout import package_checkout

__all__ = ["Provenance", "current_provenance", "provenance_soon"]


@dataclass(frozen=True)
class Provenance:
    """The harness version, the commit of its checkout ("unknown" outside a git checkout) and whether
    its tracked files outside results/ differed from that commit (None when unknown). No path."""

    harness: str
    commit: str
    dirty: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"harness": self.harness, "commit": self.commit, "dirty": self.dirty}


def current_provenance() -> Provenance:
    """The provenance of the harness running now."""
    commit, dirty = package_checkout()
    return Provenance(__version__, commit, dirty)


def provenance_soon() -> Callable[[], Provenance]:
    """`current_provenance` started now on a thread (its two git commands take ~30 ms), for a caller that has other
    work before it needs the answer; the returned call waits for it (raising what the thread raised)."""
    done: list[Provenance] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            done.append(current_provenance())
        except BaseException as exc:  # handed to the caller, who decides what it means
            failed.append(exc)

    thread = threading.Thread(target=work, name="proctor-provenance", daemon=True)
    thread.start()

    def result() -> Provenance:
        thread.join()
        if failed:
            raise failed[0]
        return done[0]

    return result
