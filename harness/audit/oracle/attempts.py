"""Attempts and the run log's attempt lines: `attempt_invalid`, `attempt_numbering`, `reruns_exceeded`,
`attempt_logged`, and the logged class (`class_action`).
"""

from __future__ import annotations

from typing import Any

from harness.audit.oracle.base import CheckBase
from harness.errors import Refusal
from harness.records.attempt import validate_run_attempt
from harness.run.rules import classify, run_ended

__all__ = ["AttemptRules"]


class AttemptRules(CheckBase):
    """Attempts and the run log's attempt lines: `attempt_invalid`, `attempt_numbering`, `reruns_exceeded`,"""

    def check_attempts(self, log: tuple[list[tuple[int, dict[str, Any]]], list[str]]) -> None:
        records, shas = log
        # (run_id, rerun) -> [(line, record, sha)]
        self.runs: dict[tuple[str, int], list[tuple[int, dict[str, Any], str]]] = {}
        self.by_line: dict[int, tuple[dict[str, Any], str]] = {}
        for line, rec in records:
            sha = shas[line - 1]
            body = {k: v for k, v in rec.items() if k not in ("prev", "seed")}
            try:
                validate_run_attempt(body, line, reruns=10**6)
            except Refusal as exc:
                self.p("attempts.jsonl", line, "attempt_invalid", exc.message)
                continue
            except (TypeError, ValueError, KeyError) as exc:  # the validator tripping on a wrong type
                self.p("attempts.jsonl", line, "attempt_invalid", f"malformed record: {type(exc).__name__}: {exc}")
                continue
            req = self.requests.get(body["run_id"])
            if req is None or body["request_sha256"] != req.request_sha256:
                self.p("attempts.jsonl", line, "attempt_invalid", "run id or request not in the stage's plan")
                continue
            if body["rerun"] > self.rules.reruns:
                self.p("attempts.jsonl", line, "reruns_exceeded",
                       f"{body['run_id']}: rerun {body['rerun']} > run.reruns {self.rules.reruns}")
            run = self.runs.setdefault((body["run_id"], body["rerun"]), [])
            if body["attempt"] != len(run) + 1:
                self.p("attempts.jsonl", line, "attempt_numbering",
                       f"{body['run_id']} rerun {body['rerun']}: attempt {body['attempt']}, expected {len(run) + 1}")
            if run and run_ended(run[-1][1], self.rules.transport_retries):
                self.p("attempts.jsonl", line, "attempt_numbering", f"{body['run_id']}: an attempt after its run ended")
            run.append((line, body, sha))
            self.by_line[line] = (body, sha)

    def check_run_log(self) -> None:
        seen: dict[int, int] = {}
        self.attempt_events: list[tuple[int, dict[str, Any]]] = []
        for line, e in self.events:
            if e["event"] != "attempt":
                continue
            self.attempt_events.append((line, e))
            n = int(e["attempts_line"])
            seen[n] = seen.get(n, 0) + 1
            got = self.by_line.get(n)
            if got is None:
                self.p("run.jsonl", line, "attempt_logged", f"attempts line {n} does not exist")
                continue
            rec, sha = got
            if e.get("attempt_sha256") != sha:
                self.p("run.jsonl", line, "attempt_logged", f"attempts line {n} does not hash as logged")
            for key in ("run_id", "rerun", "attempt", "started", "ended", "cost_usd"):
                if e.get(key) != rec.get(key):
                    self.p("run.jsonl", line, "attempt_logged", f"{key} {e.get(key)!r} is not the record's {rec.get(key)!r}")
            if e.get("system") != self.requests[rec["run_id"]].system:
                self.p("run.jsonl", line, "attempt_logged", "system is not the plan's")
            if e.get("class") != classify(rec):
                self.p("run.jsonl", line, "class_action", f"class {e.get('class')!r} is not {classify(rec)!r}")
        for n in self.by_line:
            if seen.get(n, 0) != 1:
                self.p("attempts.jsonl", n, "attempt_logged", f"{seen.get(n, 0)} run-log lines (exactly one owed)")
