"""`proctor record`: one row per call in the task's append-only record: what ran, what passed, what it cost.

The manual: docs/models.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, MeterRefusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import verify_log
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.evidence.portable import portable_value
from harness.gate.continuity import check_continuity, journal_mark
from harness.gate.escalation import escalation_state
from harness.gate.receipts import load_receipt
from harness.gate.state import refuse_nested
from harness.gate.workspace import Gate, check_pin, gated
from harness.records.journal import RecordEvent
from harness.records.task_record import RECORD_SCHEMA, TaskRecord, WireMetering

__all__ = ["RECORD_SCHEMA", "RecordResult", "record_seed", "record_task"]



def record_seed(gate: Gate) -> str:
    """The task record's seed: it names the task and the state folder, so records cannot be swapped."""
    return f"proctor-task-record:{gate.task.task_id}:{os.path.basename(gate.state.root)}"


def _receipt(gate: Gate) -> dict[str, Any] | None:
    verifies = [e for e in gate.events if e["event"] == "verify"]
    if not verifies:
        return None
    last = verifies[-1]
    receipt = load_receipt(gate.state.path("receipts", f"{last['receipt_id']}.json"), last["receipt_sha256"])
    return {
        "receipt_id": receipt.receipt_id,
        "sha256": last["receipt_sha256"],
        "passed": receipt.passed,
        "tree": receipt.tree,
        "dispatch_seq": receipt.dispatch_seq,
        "fingerprint": receipt.fingerprint,
    }


def _accept_state(gate: Gate, receipt: dict[str, Any] | None) -> dict[str, Any]:
    accepts = [e for e in gate.events if e["event"] == "accept"]
    if not accepts:
        return {"state": "not_accepted", "receipt_id": None}
    last = accepts[-1]
    current = receipt is not None and last["receipt_id"] == receipt["receipt_id"]
    return {"state": "accepted" if current else "superseded", "receipt_id": last["receipt_id"], "tree": last["tree"]}


def _journal_wire_logs(gate: Gate) -> tuple[list[dict[str, Any]], list[str]]:
    """The wire logs the journal's dispatches recorded, checked against their dispatch_end; and unmetered ids."""
    ends = {e["dispatch_id"]: e for e in gate.events if e["event"] == "dispatch_end"}
    logs: list[dict[str, Any]] = []
    unmetered: list[str] = []
    for start in (e for e in gate.events if e["event"] == "dispatch_start"):
        path = start.get("wire_log")
        if not path:
            unmetered.append(start["dispatch_id"])
            continue
        end = ends.get(start["dispatch_id"], {})
        logs.append(
            {"path": path, "name": start.get("wire_name"), "dispatch_id": start["dispatch_id"], "expected": end.get("wire")}
        )
    return logs, unmetered


def _check_wire_log(log: dict[str, Any]) -> dict[str, Any]:
    """Lines and head of a wire log; a journal log must be exactly what its dispatch's proxy wrote.

    The dispatch recorded the proxy's in-memory tally (`lines`, `head`: what it
    appended, never read back from the file) and `interleaved` (appends that
    found someone else's line at the end of the log).
    """
    from harness.meter.wire import wire_seed

    path = log["path"]
    if not os.path.lexists(path) and log.get("expected") is not None:
        status_lines, head = 0, None  # the proxy saw no exchange
    else:
        status = verify_log(path, wire_seed(log["name"]) if log.get("name") else None)
        if status.problem is not None:
            raise MeterRefusal(Code.WIRE_LOG_BROKEN, status.problem.message, path, line=status.problem.line)
        status_lines, head = status.lines, (status.head if status.lines else None)
    expected = log.get("expected")
    if log.get("dispatch_id") is not None:
        if expected is None:
            raise MeterRefusal(
                Code.WIRE_LOG_UNRECORDED,
                f"dispatch {log['dispatch_id']} did not end normally, so its wire log was never checked in; "
                "give it with --wire to meter it as it stands",
                path,
            )
        if (
            (status_lines, head) != (expected.get("lines"), expected.get("head"))
            or (expected.get("exchanges") is not None and expected["exchanges"] != status_lines)
            or expected.get("interleaved")
        ):
            raise MeterRefusal(
                Code.WIRE_LOG_TAMPERED,
                f"the wire log of dispatch {log['dispatch_id']} has {status_lines} line(s) ending in "
                f"{str(head)[:16]}; its metering proxy wrote {expected.get('lines')} ending in "
                f"{str(expected.get('head'))[:16]}"
                + (f", and {expected['interleaved']} of its appends found lines it had not written"
                   if expected.get("interleaved") else ""),
                path,
                expected_lines=expected.get("lines"),
                expected_head=expected.get("head"),
                lines=status_lines,
                head=head,
            )
    return {"path": path, "dispatch_id": log.get("dispatch_id"), "lines": status_lines, "head": head}


def _pricing_keys(gate: Gate, catalog_path: str | None) -> dict[str, str]:
    """API model name -> pricing key, from the catalog and the journal's dispatches (the journal wins)."""
    from harness.providers.catalog import load_catalog

    keys = {m.api_model: m.pricing_key for m in load_catalog(catalog_path).models}
    for start in (e for e in gate.events if e["event"] == "dispatch_start"):
        if start.get("pricing_key") and start.get("api_model"):
            keys[start["api_model"]] = start["pricing_key"]
    return keys


def _meter(
    gate: Gate, logs: list[dict[str, Any]], pricing_path: str | None, catalog_path: str | None
) -> tuple[WireMetering, dict[str, Any]]:
    from harness.meter.pricing import load_pricing
    from harness.meter.wire import meter_wire, read_wire

    checked = [_check_wire_log(log) for log in logs]
    records = []
    for log, seen in zip(logs, checked, strict=True):
        if seen["lines"]:
            records.extend(read_wire(log["path"], log.get("name")))
    # The installed table (the bundled one) unless --pricing names a file; the row names either by
    # its place (`<repo>/harness/data/pricing.yaml`), never a folder of this machine, and its sha256.
    pricing = load_pricing(None if pricing_path is None else os.path.abspath(pricing_path))
    totals = meter_wire(records, pricing, _pricing_keys(gate, catalog_path))
    wire = WireMetering(
        wire_logs=tuple(checked),
        pricing={"path": portable_value(pricing.path), "sha256": pricing.sha256, "notional": pricing.notional},
        exchanges=totals.metered,
        errors_unbilled=totals.errors_unbilled,
        not_metered=totals.not_metered,
        by_model={k: dict(v) for k, v in totals.by_model.items()},
    )
    measured: dict[str, Any] = {
        "tokens": totals.tokens.to_json(),
        "cost": totals.cost.total,
        "known_cost": totals.cost.known_total,
        "cost_status": totals.cost.status,
        "usage_unknown": totals.usage_unknown,
        "price_unknown": totals.price_unknown,
    }
    return wire, measured


@dataclass(frozen=True)
class RecordResult:
    """The row `proctor record` appended, and where."""

    record_path: str
    line: int
    row: TaskRecord

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "record_path": self.record_path, "line": self.line, **self.row.to_json()}


def record_task(
    workspace: str,
    task_path: str,
    wire_paths: Sequence[str] = (),
    pricing_path: str | None = None,
    catalog_path: str | None = None,
    state_dir: str | None = None,
) -> RecordResult:
    """Append one row to the task record; returns it with where it was written."""
    refuse_nested("record")
    with gated(workspace, task_path, state_dir) as gate, gate.journaling_refusals("record"):
        check_pin(gate.task, gate.pin)
        check_continuity(gate, record_seed(gate))
        esc = escalation_state(gate.pin["lane"]["lane"], gate.events)
        starts = [e for e in gate.events if e["event"] == "dispatch_start"]
        receipt = _receipt(gate)
        unmetered: list[str] = []
        source: str | None = None
        if wire_paths:
            logs = [{"path": os.path.abspath(p), "name": None, "dispatch_id": None} for p in wire_paths]
            source = "flag"
        else:
            logs, unmetered = _journal_wire_logs(gate)
            source = "journal" if logs else None
        common: dict[str, Any] = {
            "task_id": gate.task.task_id,
            "task_sha256": gate.task.sha256,
            "lane": esc.lane,
            "initial_lane": esc.initial_lane,
            "lane_switches": tuple({"from": s["from"], "to": s["to"], "reason": s["reason"]} for s in esc.switches),
            "dispatches": {
                "count": len(starts),
                "ids": [e["dispatch_id"] for e in starts],
                "models": [e.get("model") for e in starts],
                "lanes": [e.get("lane") for e in starts],
            },
            "receipt": receipt,
            "accept": _accept_state(gate, receipt),
            "journal_lines": journal_mark(gate.events)[0],
            "journal_head": journal_mark(gate.events)[1],
        }
        row: TaskRecord
        if logs:
            wire, measured = _meter(gate, logs, pricing_path, catalog_path)
            if unmetered:
                measured.update(cost=None, cost_status="partial")
            row = TaskRecord(**common, metering="wire", wire_source=source, wire=wire, **measured,
                             unmetered_dispatch_ids=tuple(unmetered) if unmetered else None)  # fmt: skip
        elif starts:
            if pricing_path is not None:
                raise GateRefusal(
                    Code.PRICING_WITHOUT_WIRE,
                    "--pricing needs a wire log: this task's dispatches were not metered (give --wire FILE)",
                    pricing_path,
                )
            row = TaskRecord(
                **common,
                metering="flat_rate",
                wire_source=None,
                note="dispatched without a wire log: a flat-rate worker (subscription, local or scripted); "
                "tokens and cost were not metered",
                tokens=None,
                cost=None,
                known_cost=None,
                cost_status="flat_rate",
                usage_unknown=0,
                price_unknown=0,
                unmetered_dispatch_ids=tuple(e["dispatch_id"] for e in starts),
            )
        else:
            row = TaskRecord(**common, metering="none", wire_source=None, tokens=None, cost=0.0, known_cost=0.0,
                             cost_status="no_dispatch", usage_unknown=0, price_unknown=0)  # fmt: skip
        log = ChainedLog(gate.state.path("task-record.jsonl"), record_seed(gate))
        written = log.append(row.to_json())
        line = log.status().lines
        gate.record(RecordEvent(line=line, row_sha256=sha256_hex(canonical_bytes(written)), cost_status=row.cost_status))
    return RecordResult(record_path=log.path, line=line, row=row)
