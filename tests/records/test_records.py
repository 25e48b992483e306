"""harness.records: every record declared once, read strictly and written back byte for byte.

The committed evidence (results/local-gemma) is read through each record type and
written back: the canonical bytes must be the file's. The final's fields come from
one place: the loader, the oracle and the writer all use `fields(RunFinal)`.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest

from harness.audit.oracle.shapes import (
    FINAL_SHAPE,
    admission_problem,
    anchor_problem,
    event_problem,
    final_problem,
)
from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes
from harness.records.admission import ADMISSION_FIELDS, ADMISSION_OPTIONAL, Admission
from harness.records.anchor import ANCHOR_FIELDS, Anchor
from harness.records.attempt import Attempt
from harness.records.final import FINAL_FIELDS, FINAL_KIND, Replaced, RunFinal
from harness.records.host import HostSample
from harness.records.plan import PlanCell, PlanHeader
from harness.records.run_event import EVENT_FIELDS, OPTIONAL_FIELDS, RunEvent
from harness.run.attempts import read_plan
from tests.support.paths import REPO

STAGE = REPO / "results" / "local-gemma" / "pilot"
CHAIN = ("prev", "seed")


def lines(name: str) -> list[dict[str, Any]]:
    with open(STAGE / f"{name}.jsonl", "rb") as fh:
        return [json.loads(raw) for raw in fh.read().splitlines()]


def body(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in CHAIN}


def json_names(cls: type) -> set[str]:
    return {"class" if f.name == "cls" else f.name for f in fields(cls)}


# --------------------------------------------------------------------------
# The final's fields, from one place


def test_the_final_fields_are_declared_once() -> None:
    assert json_names(RunFinal) == set(FINAL_FIELDS)
    assert set(FINAL_SHAPE) - {"kind"} == set(FINAL_FIELDS)  # the oracle's shape is the record's
    final = RunFinal.from_json(body(lines("finals")[0]), path=None, line=1)
    assert set(final.to_json()) == {"kind"} | set(FINAL_FIELDS)


@pytest.mark.parametrize("name", sorted(FINAL_FIELDS))
def test_a_final_without_any_one_field_is_refused_by_the_loader_and_flagged_by_the_oracle(name: str) -> None:
    rec = body(lines("finals")[0])
    del rec[name]
    with pytest.raises(Refusal) as caught:
        RunFinal.from_json(rec, path="finals.jsonl", line=1)
    assert caught.value.code == "run_final_invalid" and name in caught.value.message
    assert final_problem(rec) == ("final_link", f"no field {name!r}")


def test_a_final_of_another_kind_is_refused_first() -> None:
    rec = {**body(lines("finals")[0]), "kind": "run-final.v0"}
    with pytest.raises(Refusal) as caught:
        RunFinal.from_json(rec, path="finals.jsonl", line=3)
    assert caught.value.code == "run_final_invalid" and caught.value.message == f"line 3: kind must be {FINAL_KIND}"


def test_a_final_with_replaced_finals_round_trips() -> None:
    rec = body(lines("finals")[0])
    old = Replaced(0, "archive/x.r0.final.jsonl", "a" * 64, "b" * 64)
    rec.update(rerun=1, replaced=[old.to_json()])
    final = RunFinal.from_json(rec, path=None, line=None)
    assert final.replaced == (old,) and final.to_json() == rec
    rec["replaced"] = [{"rerun": 0, "archive": "archive/x.r0.final.jsonl"}]
    with pytest.raises(Refusal, match="replaced: no field 'sha256'"):
        RunFinal.from_json(rec, path=None, line=None)


# --------------------------------------------------------------------------
# Today's bytes, from the committed evidence


def test_finals_read_and_write_back_byte_for_byte() -> None:
    for n, rec in enumerate(lines("finals"), start=1):
        assert canonical_bytes(RunFinal.from_json(rec, path=None, line=n).to_json()) == canonical_bytes(body(rec))


def test_run_events_read_and_write_back_byte_for_byte() -> None:
    for n, rec in enumerate(lines("run"), start=1):
        event = RunEvent.from_json(rec, path=None, line=n)
        assert canonical_bytes(event.to_json()) == canonical_bytes(body(rec))
        assert event_problem(rec) is None


def test_admissions_anchors_and_host_samples_write_back_byte_for_byte() -> None:
    for name, cls, problem in (("admission", Admission, admission_problem), ("anchors", Anchor, anchor_problem),
                               ("host", HostSample, None)):
        for n, rec in enumerate(lines(name), start=1):
            got = cls.from_json(rec, path=None, line=n)  # type: ignore[attr-defined]
            assert canonical_bytes(got.to_json()) == canonical_bytes(body(rec)), (name, n)
            if problem is not None:
                assert problem(rec) is None


def test_attempts_read_and_write_back_byte_for_byte() -> None:
    for n, rec in enumerate(lines("attempts"), start=1):
        got = Attempt.from_json(body(rec), line=n, reruns=2)
        assert canonical_bytes(got.to_json()) == canonical_bytes(body(rec))


def test_the_plan_reads_back_as_the_planned_type_and_writes_back_byte_for_byte() -> None:
    plan = read_plan(STAGE / "plan.jsonl")
    raw = (STAGE / "plan.jsonl").read_bytes().splitlines()
    assert all(type(r) is PlanCell for r in plan.requests)
    assert canonical_bytes(PlanHeader.from_json(plan.header, path="plan.jsonl").to_json()) == raw[0]
    for request, line in zip(plan.requests, raw[1:], strict=True):
        assert canonical_bytes(request.to_json()) == line


# --------------------------------------------------------------------------
# Shapes: the oracle's are the records'


def test_the_oracle_checks_the_records_declared_fields() -> None:
    adm = body(lines("admission")[0])
    del adm["under_way"]
    assert admission_problem(adm) == ("admission_rule", "no field 'under_way'")
    anchor = body(lines("anchors")[0])
    anchor["logs"] = {"run": {"lines": "3", "head": None}}
    assert anchor_problem(anchor) is not None
    # issue 13: an admission names its attempt (run_id, rerun, attempt), absent from logs written before
    assert set(ADMISSION_FIELDS) | set(ADMISSION_OPTIONAL) == {"kind"} | {f.name for f in fields(Admission)}
    assert set(ADMISSION_OPTIONAL) == {"run_id", "rerun", "attempt"}
    assert set(ANCHOR_FIELDS) == {"kind"} | {f.name for f in fields(Anchor)}
    start = next(body(r) for r in lines("run") if r["event"] == "start")
    for name in EVENT_FIELDS["start"]:
        broken = {k: v for k, v in start.items() if k != name}
        assert event_problem(broken) == ("halted", f"start event: no field {name!r}")
        with pytest.raises(Refusal) as caught:
            RunEvent.from_json(broken, path="run.jsonl", line=1)
        assert caught.value.code == "run_log_invalid"


def test_an_unknown_event_is_refused_as_before() -> None:
    with pytest.raises(Refusal) as caught:
        RunEvent.from_json({"kind": "run-event.v1", "event": "nap", "at": 1.0}, path="run.jsonl", line=4)
    assert caught.value.code == "run_log_invalid" and caught.value.message == "line 4: unknown event 'nap'"


def test_the_derived_shapes_say_what_the_declared_ones_said() -> None:
    def said(shape: Any) -> dict[str, str]:
        return {k: f.what for k, f in shape.items()}

    assert said(FINAL_FIELDS)["class"] == "a string" and said(FINAL_FIELDS)["passed"] == "true, false or null"
    assert next(iter(FINAL_FIELDS)) == "at" and said(FINAL_FIELDS)["replaced"] == "a list"
    assert said(ADMISSION_FIELDS)["ceiling"] == "{total_usd, ceiling_usd, crossed}"
    assert said(ADMISSION_FIELDS)["decision"] == "one of admit, refuse"
    assert said(EVENT_FIELDS["start"])["systems"] == "a list of {slot, cap_usd, lanes}"
    assert said(EVENT_FIELDS["late_cost"])["wire_line"] == "an integer or null"
    assert said(EVENT_FIELDS["attempt"])["cost_usd"] == 'a non-negative number or "unknown"'
    assert {e: said(s) for e, s in OPTIONAL_FIELDS.items()} == {
        "attempt": {"recovered": "true or false", "node": "a string or null"}, "pause": {"recovered": "true or false"},
        "start": {"reruns": "an integer", "transport_retries": "an integer",
                  "provenance": "{harness, commit, dirty} or null",  # issue 13: the run's provenance
                  "engine": "{kind, ray_version, sandbox, nodes} or null"}}  # issue 18: the ray engine
