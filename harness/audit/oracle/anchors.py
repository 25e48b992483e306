"""Anchors: `anchor` (a prefix of each log as it is now; each manifest's sha256).

The manual: docs/oracle.md.
"""

from __future__ import annotations

from typing import Any

from harness.audit.oracle.base import CheckBase, file_bytes, seed_hash_of
from harness.evidence.jsonio import sha256_hex
from harness.run.layout import log_seed

__all__ = ["AnchorRules"]


class AnchorRules(CheckBase):
    """Anchors: `anchor` (a prefix of each log as it is now; each manifest's sha256)."""

    def check_anchors(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        for line, a in records:
            for name, got in a["logs"].items():
                heads = self.heads.get(name)
                if heads is None:
                    self.p("anchors.jsonl", line, "anchor", f"an anchor for an unknown log {name!r}")
                    continue
                n, head = got["lines"], got["head"]
                if n == 0:
                    ok = head is None or head == seed_hash_of(log_seed(self.study, self.stage, name))
                else:
                    ok = 0 < n <= len(heads) and heads[n - 1] == head
                if not ok:
                    self.p("anchors.jsonl", line, "anchor",
                           f"{name}: {n} lines with head {head} is not a prefix of the log ({len(heads)} lines)")
            for name, sha in a["manifests"].items():
                path = self.rules.manifests.get(name)
                if path is None:
                    continue
                data = file_bytes(path)
                now = None if data is None else sha256_hex(data)
                if sha != now and sha not in self.rules.earlier.get(name, frozenset()):
                    self.p("anchors.jsonl", line, "anchor", f"manifest {name}: sha256 {sha} is not the file's {now}")
