"""Finals, receipts and archives: `final_link`, `class_action`, `archive`, and a rerun no final asked
for (`attempt_numbering`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from harness.audit.oracle.base import CheckBase, file_bytes
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.records.final import FINAL_KIND
from harness.run.layout import archive_name, receipt_name
from harness.run.rules import action_for, classify, run_ended

__all__ = ["FinalRules"]


class FinalRules(CheckBase):
    """Finals, receipts and archives: `final_link`, `class_action`, `archive`, and a rerun no final asked"""

    def check_finals(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        self.finals: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        reruns = self.rules.reruns
        for line, rec in records:
            rid = rec.get("run_id")
            if rid not in self.requests:
                self.p("finals.jsonl", line, "final_link", f"run id {rid!r} not in the plan")
                continue
            mine = self.finals.setdefault(str(rid), [])
            req = self.requests[str(rid)]
            if [rec.get(k) for k in ("kind", "system", "item", "arm", "repeat")] != [
                    FINAL_KIND, req.system, req.item, req.arm, req.repeat]:
                self.p("finals.jsonl", line, "final_link", "kind, system, item, arm or repeat is not the plan's")
            rerun: int = rec["rerun"]
            if rerun != len(mine):
                self.p("finals.jsonl", line, "final_link", f"rerun {rerun!r}: expected {len(mine)}")
            if mine and mine[-1][1].get("action") == "stand":
                self.p("finals.jsonl", line, "final_link", "a final after the cell's standing final")
            got = self.by_line.get(rec["attempt_line"])
            run = self.runs.get((str(rid), rerun), [])
            if got is None or not run or run[-1][0] != rec.get("attempt_line") or got[1] != rec.get("attempt_sha256"):
                self.p("finals.jsonl", line, "final_link", "attempt_line/attempt_sha256 is not its run's last attempt")
            else:
                attempt = got[0]
                if not run_ended(attempt, self.rules.transport_retries):
                    self.p("finals.jsonl", line, "final_link", "the linked attempt did not end its run")
                cls = classify(attempt)
                want = action_for(cls, rerun, reruns)
                if rec.get("class") != cls or rec.get("action") != want:
                    self.p("finals.jsonl", line, "class_action",
                           f"{rec.get('class')}/{rec.get('action')} is not the recomputed {cls}/{want}")
                if rec.get("attempt") != attempt["attempt"] or rec.get("error_code") != attempt.get("error_code"):
                    self.p("finals.jsonl", line, "final_link", "attempt or error_code is not the record's")
                if cls != "delivered" and any(rec.get(k) is not None for k in ("passed", "receipt", "receipt_sha256")):
                    # the report scores `passed`: only a verified delivered answer may carry one
                    self.p("finals.jsonl", line, "final_link", f"a {cls} final carries a verdict or a receipt")
                if cls == "delivered":
                    name = receipt_name(str(rid), rerun)
                    data = file_bytes(os.path.join(self.folder, name))
                    if rec.get("receipt") != name or data is None:
                        self.p("finals.jsonl", line, "final_link", f"the receipt {name} is missing")
                    elif sha256_hex(data) != rec.get("receipt_sha256"):
                        self.p("finals.jsonl", line, "final_link", "receipt_sha256 is not the receipt's")
            replaced = rec.get("replaced")
            if not isinstance(replaced, list) or len(replaced) != len(mine):
                self.p("finals.jsonl", line, "archive", "replaced does not list every earlier final")
            else:
                for entry, (_, old) in zip(replaced, mine, strict=True):
                    self._archive(line, str(rid), old, entry)
            mine.append((line, rec))
        for (rid, rerun), _ in self.runs.items():
            if rerun > 0:
                prior = self.finals.get(rid, [])
                if len(prior) < rerun or prior[rerun - 1][1].get("action") == "stand":
                    self.p("attempts.jsonl", self.runs[(rid, rerun)][0][0], "attempt_numbering",
                           f"{rid}: rerun {rerun} that no final asked for")

    def _archive(self, line: int, rid: str, old: Mapping[str, Any], entry: Any) -> None:
        want = archive_name(rid, int(old["rerun"]))
        data = file_bytes(os.path.join(self.folder, want))
        if not isinstance(entry, dict) or entry.get("archive") != want or data is None:
            self.p("finals.jsonl", line, "archive", f"{want} is missing or not listed")
            return
        if data != canonical_bytes(old) + b"\n":
            self.p(want, None, "archive", "not a byte copy of the replaced final")
        if entry.get("sha256") != sha256_hex(data):
            self.p("finals.jsonl", line, "archive", f"{want}: sha256 is not the archive's")
        if entry.get("attempt_sha256") != old.get("attempt_sha256"):
            self.p("finals.jsonl", line, "archive", f"{want}: attempt_sha256 is not the replaced final's")

    def check_archives(self) -> None:
        adir = os.path.join(self.folder, "archive")
        finals = {archive_name(rid, int(rec["rerun"])): rec for rid, fs in self.finals.items() for _, rec in fs}
        try:
            names = sorted(os.listdir(adir)) if os.path.isdir(adir) else []
        except OSError as exc:
            self.p("archive", None, "archive", f"the archive folder cannot be listed: {exc.strerror}")
            names = []
        for name in names:
            rel = f"archive/{name}"
            rec = finals.get(rel)
            if rec is None or file_bytes(os.path.join(adir, name)) != canonical_bytes(rec) + b"\n":
                self.p(rel, None, "archive", "an archive that is no final's byte copy")
