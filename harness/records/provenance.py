"""Provenance of a run or an analysis: the harness version and the git commit it ran from.

The manual: docs/records.md (run events) and docs/analysis.md (provenance.csv).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness._version import __version__
from harness.evidence.checkout import package_checkout

__all__ = ["Provenance", "current_provenance"]


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
