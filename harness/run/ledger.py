"""The ledger: where a stage stands, from its files alone (`load_ledger`).

Every log of the stage folder is read, each record checked by its type in
`harness.records`, and every link cross-checked (attempt numbering, finals
against their attempts, receipts and archives, run-log attempt lines).
See docs/run.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.errors import Code, Refusal
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.records._shape import CHAIN_KEYS, refusal
from harness.records.attempt import validate_run_attempt
from harness.records.final import FINAL_KIND, RunFinal
from harness.records.plan import PlanCell
from harness.records.run_event import RunEvent
from harness.run.layout import archive_name, log_seed, receipt_name
from harness.run.rules import action_for, booked_spend, classify, cost_for_spend, run_ended

__all__ = ["AttemptLine", "CellState", "FinalLine", "Ledger", "load_ledger"]

AttemptLine = tuple[int, dict[str, Any], str]
"""(attempts.jsonl line, the record without chain fields, the line's sha256)."""
FinalLine = tuple[int, RunFinal, bytes]
"""(finals.jsonl line or 0 when just written, the final, the line's bytes)."""


@dataclass
class CellState:
    """One cell (run id) as the files say.

    `finals` are (line, final, line bytes) oldest first; `attempts` maps a rerun
    to its (attempts line, record, line sha256) in order.
    """

    request: PlanCell
    finals: list[FinalLine] = field(default_factory=list)
    attempts: dict[int, list[AttemptLine]] = field(default_factory=dict)

    @property
    def last_final(self) -> RunFinal | None:
        return self.finals[-1][1] if self.finals else None

    @property
    def standing(self) -> bool:
        last = self.last_final
        return last is not None and last.action == "stand"

    @property
    def rerun(self) -> int:
        """The run owed next (or under way): one after the last final's."""
        return 0 if not self.finals else self.finals[-1][1].rerun + 1

    def current(self) -> list[AttemptLine]:
        return self.attempts.get(self.rerun, [])

    def unfinalised(self, transport_retries: int) -> bool:
        """The current run's last attempt ended it but no final was written (a crash in between)."""
        cur = self.current()
        return bool(cur) and not self.standing and run_ended(cur[-1][1], transport_retries)

    def next_attempt(self) -> int:
        return len(self.current()) + 1


@dataclass
class Ledger:
    """A stage folder read whole and cross-checked."""

    cells: dict[str, CellState]
    attempt_lines: int
    attempts_head: str | None
    finals_lines: int
    run_events: list[dict[str, Any]]
    admissions: list[dict[str, Any]]
    logged_attempt_lines: set[int]
    spend: dict[str, float]
    spend_parts: dict[str, list[float]]
    late_costs: int
    last_time: float
    unresolved: list[dict[str, Any]] = field(default_factory=list)
    """Intent events no attempt record resolves (a crash between the intent and the outcome), in log
    order; the next invocation resolves each (`Upkeep.recover`) before it starts."""

    def paused(self, system: str) -> bool:
        state = False
        for e in self.run_events:
            if e.get("system") == system and e["event"] == "pause":
                state = True
            elif e.get("system") == system and e["event"] == "resume_paused":
                state = False
        return state

    def refused_before(self, system: str) -> bool:
        return any(a["system"] == system and a["decision"] == "refuse" for a in self.admissions)

    def inconclusive_items(self, system: str) -> int:
        return len({c.request.item for c in self.cells.values() if c.request.system == system
                    and any(f.cls == "inconclusive" for _, f, _ in c.finals)})


def _read(folder: str, name: str, study: str, stage: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, f"{name}.jsonl")
    if not os.path.lexists(path):
        return []
    return read_log(path, log_seed(study, stage, name))


def _repair(record: dict[str, Any]) -> bool:
    """A torn-tail repair line of a chained log (no record of the run's own)."""
    return record.get("event") == "log_repair" and "kind" not in record


def load_ledger(
    folder: str, study: str, stage: str, requests: Sequence[PlanCell], *,
    reruns: int, transport_retries: int, reserve_usd: float,
) -> Ledger:
    """Read every log of a stage folder, check each link, and say where every cell stands.

    Refusals: the chain reader's (`log_broken`, `log_torn_tail`, seed mismatch), the
    attempt validators' (`attempt_invalid`, ...), `attempt_unknown_run_id`,
    `attempt_request_changed`, `attempt_numbering_invalid` (a gap or repeat in attempt
    or rerun numbers), `attempt_after_final` (an attempt after its run ended),
    `run_final_invalid` (a final whose fields, link, class, action, receipt or archive
    disagree with the files), `run_log_invalid` (an unknown or malformed event).
    """
    cells = {r.run_id: CellState(r) for r in requests}
    apath = os.path.join(folder, "attempts.jsonl")
    attempts = _read(folder, "attempts", study, stage)
    head: str | None = None
    for line, rec in enumerate(attempts, start=1):
        raw = canonical_bytes(rec)
        head = sha256_hex(raw)
        if _repair(rec):
            continue
        body = {k: v for k, v in rec.items() if k not in CHAIN_KEYS}
        validate_run_attempt(body, line, reruns=reruns, path=apath)
        cell = cells.get(body["run_id"])
        if cell is None:
            raise refusal(Code.ATTEMPT_UNKNOWN_RUN_ID, f"run id {body['run_id']!r} is not in this stage's plan",
                          apath, line)
        if body["request_sha256"] != cell.request.request_sha256:
            raise refusal(Code.ATTEMPT_REQUEST_CHANGED, "request_sha256 is not the plan's", apath, line)
        rerun = body["rerun"]
        if rerun > 0 and rerun - 1 not in cell.attempts:
            raise refusal(Code.ATTEMPT_NUMBERING_INVALID, f"rerun {rerun} follows no rerun {rerun - 1}", apath, line)
        if any(r > rerun for r in cell.attempts):
            raise refusal(Code.ATTEMPT_NUMBERING_INVALID, f"rerun {rerun} after a later rerun", apath, line)
        run = cell.attempts.setdefault(rerun, [])
        if body["attempt"] != len(run) + 1:
            raise refusal(Code.ATTEMPT_NUMBERING_INVALID, f"attempt {body['attempt']}: expected {len(run) + 1}",
                          apath, line)
        if run and run_ended(run[-1][1], transport_retries):
            raise refusal(Code.ATTEMPT_AFTER_FINAL, "an attempt after its run ended", apath, line)
        run.append((line, body, head))
    by_line = {line: (rid, rec, sha) for rid, c in cells.items() for runs in c.attempts.values()
               for line, rec, sha in runs}

    fpath = os.path.join(folder, "finals.jsonl")
    finals = _read(folder, "finals", study, stage)
    for line, rec in enumerate(finals, start=1):
        _check_final(folder, fpath, line, rec, cells, by_line, reruns, transport_retries)
    for c in cells.values():  # a rerun's attempts need the earlier run's final, and not a standing one
        for rerun in c.attempts:
            if rerun > 0 and (len(c.finals) < rerun or c.finals[rerun - 1][1].action == "stand"):
                raise refusal(Code.ATTEMPT_NUMBERING_INVALID,
                              f"run {c.request.run_id}: rerun {rerun} has no final for rerun {rerun - 1} "
                              "that asks for it", apath, None)

    events = _read(folder, "run", study, stage)
    rpath = os.path.join(folder, "run.jsonl")
    logged: set[int] = set()
    spend = {r.system: 0.0 for r in requests}
    late: list[tuple[str, float]] = []
    intents: list[tuple[int, dict[str, Any]]] = []
    last = 0.0
    for line, e in enumerate(events, start=1):
        if _repair(e):
            continue
        event = RunEvent.from_json(e, path=rpath, line=line)
        last = max(last, event.at)
        if event.event == "attempt":
            got = by_line.get(int(e["attempts_line"]))
            if got is None or got[2] != e["attempt_sha256"]:
                raise refusal(Code.RUN_LOG_INVALID, "an attempt line that disagrees with attempts.jsonl", rpath, line)
            logged.add(int(e["attempts_line"]))
        elif event.event == "late_cost":
            late.append((str(e["system"]), cost_for_spend(e["cost_usd"], reserve_usd)))
        elif event.event == "intent":
            intents.append((line, e))
    for rid, rec, _ in by_line.values():
        spend[cells[rid].request.system] += 0.0  # keep every system present
        last = max(last, float(rec["ended"]))
    parts: dict[str, list[float]] = {system: [] for system in spend}
    for rid, rec, _ in by_line.values():  # a cascade's steps each to its own system (`booked_spend`)
        for system, amount in booked_spend(rec, cells[rid].request.system, reserve_usd, parts):
            parts[system].append(amount)
    for system in spend:
        parts[system] += [c for s, c in late if s == system]
        spend[system] = math.fsum(parts[system])
    admissions = _read(folder, "admission", study, stage)
    for a in admissions:
        last = max(last, float(a.get("at", 0.0)))
    unresolved = _unresolved(rpath, intents, cells, by_line)
    return Ledger(cells, len(attempts), head, len(finals), events, admissions, logged, spend, parts, len(late), last,
                  unresolved)


def _unresolved(path: str, intents: list[tuple[int, dict[str, Any]]], cells: dict[str, CellState],
                by_line: dict[int, tuple[str, dict[str, Any], str]]) -> list[dict[str, Any]]:
    """The intents no attempt record resolves; each must name its cell's next attempt (`run_log_invalid`)."""
    recorded = {(rid, rec["rerun"], rec["attempt"]) for rid, rec, _ in by_line.values()}
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, int, int]] = set()
    for line, e in intents:
        key = (str(e["run_id"]), int(e["rerun"]), int(e["attempt"]))
        if key in seen:
            raise refusal(Code.RUN_LOG_INVALID, f"a second intent for {key}", path, line)
        seen.add(key)
        if key in recorded:
            continue
        cell = cells.get(key[0])
        if cell is None or cell.request.system != e["system"] or cell.standing or (key[1], key[2]) != (
                cell.rerun, cell.next_attempt()) or any(u["run_id"] == key[0] for u in out):
            raise refusal(Code.RUN_LOG_INVALID, f"an unresolved intent for {key} that is not its cell's next "
                          "attempt", path, line)
        out.append(e)
    return out


def _check_final(
    folder: str, path: str, line: int, rec: dict[str, Any], cells: dict[str, CellState],
    by_line: dict[int, tuple[str, dict[str, Any], str]], reruns: int, transport_retries: int,
) -> None:
    def bad(message: str) -> Refusal:
        return refusal(Code.RUN_FINAL_INVALID, message, path, line)

    if rec.get("kind") != FINAL_KIND:
        raise bad(f"kind must be {FINAL_KIND}")
    cell = cells.get(rec.get("run_id", ""))
    if cell is None:
        raise bad(f"run id {rec.get('run_id')!r} is not in this stage's plan")
    final = RunFinal.from_json(rec, path=path, line=line)
    if final.rerun != len(cell.finals):
        raise bad(f"rerun {final.rerun!r}: expected {len(cell.finals)} (a gap or repeat)")
    if cell.standing:
        raise bad("a final after the cell's standing final")
    got = by_line.get(final.attempt_line)
    if got is None or got[0] != cell.request.run_id or got[1]["rerun"] != final.rerun:
        raise bad("attempt_line does not point at an attempt of this run")
    _, attempt, sha = got
    if sha != final.attempt_sha256 or attempt["attempt"] != final.attempt:
        raise bad("attempt_sha256 or attempt disagrees with attempts.jsonl")
    if attempt is not cell.attempts[final.rerun][-1][1] or not run_ended(attempt, transport_retries):
        raise bad("the linked attempt is not the one that ended its run")
    cls = classify(attempt)
    if final.cls != cls or final.action != action_for(cls, final.rerun, reruns):
        raise bad(f"class/action {final.cls}/{final.action} are not the recomputed "
                  f"{cls}/{action_for(cls, final.rerun, reruns)}")
    if cls == "delivered":
        receipt = os.path.join(folder, str(final.receipt))
        if final.receipt != receipt_name(cell.request.run_id, final.rerun) or not os.path.exists(receipt):
            raise bad("the receipt is missing")
        if sha256_hex(read_bytes(receipt)) != final.receipt_sha256:
            raise bad("receipt_sha256 is not the receipt file's")
    if len(final.replaced) != len(cell.finals):
        raise bad("replaced must list every earlier final of the cell")
    for entry, (_, old, old_bytes) in zip(final.replaced, cell.finals, strict=True):
        want = archive_name(cell.request.run_id, old.rerun)
        apath = os.path.join(folder, want)
        if entry.archive != want or not os.path.exists(apath):
            raise bad(f"the archive {want} is missing")
        data = read_bytes(apath)
        if data != old_bytes + b"\n" or entry.sha256 != sha256_hex(data):
            raise bad(f"the archive {want} is not a byte copy of the replaced final")
    cell.finals.append((line, final, canonical_bytes(rec)))
