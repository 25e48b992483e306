"""`proctor resume` and `schedule`: every refusal through the CLI, the schedule rules, properties.

Attempts logs are written with `ChainedLog`, so they chain correctly; a
refusal comes from the crafted record, not from a broken chain (except where a
broken chain is the point).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from harness.cli.main import main
from harness.errors import Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import verify_log
from harness.evidence.jsonio import canonical_bytes, canonical_line, loads_strict, sha256_hex
from harness.records.plan import Plan
from harness.run.resume import ERROR_CLASSES, TRANSPORT_CODES, RunState, schedule
from harness.run.runner import run_stage
from tests.support import study
from tests.support.attempts import delivered, failed, plan_records, write_plan, write_records
from tests.support.cli import run_proctor
from tests.support.study import Sim

FINAL_CODES = tuple(c for c in ERROR_CLASSES if c not in TRANSPORT_CODES)


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return write_plan(tmp_path / "plan.jsonl")


def log_of(plan: Plan, path: Path, records: list[dict[str, Any]], seed: str | None = None) -> Path:
    """Append `records` to a chained attempts log at `path`."""
    log = ChainedLog(path, seed or plan.attempts_seed())
    for record in records:
        log.append(record)
    return path


def resume_cli(plan: Plan, tmp_path: Path, attempts: Path | None, *extra: str) -> Any:
    words = ["resume", "--plan", plan.path, "--out", str(tmp_path / "schedule.jsonl"), *extra]
    if attempts is not None:
        words += ["--attempts", str(attempts)]
    return run_proctor(*words)


def states(plan: Plan, records: list[dict[str, Any]], **kwargs: Any) -> dict[str, RunState]:
    return {s.run_id: s for s in schedule(plan, records, **kwargs)}


# --------------------------------------------------------------------------
# The schedule rules


def test_nothing_tried_is_pending_attempt_one(plan: Plan) -> None:
    result = schedule(plan, [])
    assert [s.run_id for s in result] == [r.run_id for r in plan.requests]
    assert all((s.state, s.next_attempt, s.attempts, s.failure_class) == ("pending", 1, 0, None) for s in result)


def test_each_state(plan: Plan) -> None:
    a, b, c = plan.requests
    records = [
        failed(a, 1, "timeout"), failed(b, 1, "rate_limited"), failed(c, 1, "auth"),
        failed(a, 2, "server_error"), delivered(b, 2),
        failed(a, 3, "transport"),
    ]
    got = states(plan, records)
    assert got[a.run_id] == RunState(a.run_id, "pending", 4, 3, "provider", "transport", (1, 4, 6))
    assert got[b.run_id] == RunState(b.run_id, "delivered", None, 2, None, None, (2, 5))
    assert got[c.run_id] == RunState(c.run_id, "final_error", None, 1, "operator", "auth", (3,))
    got = states(plan, [*records, failed(a, 4, "timeout")])
    assert (got[a.run_id].state, got[a.run_id].next_attempt, got[a.run_id].failure_class) == (
        "exhausted", None, "provider",
    )
    assert got[a.run_id].to_json() == {
        "kind": "resume-run.v1", "run_id": a.run_id, "state": "exhausted", "next_attempt": None,
        "attempts": 4, "class": "provider", "error_code": "timeout",
    }


@pytest.mark.parametrize(
    ("code", "cls"),
    [("auth", "operator"), ("billing", "operator"), ("quota", "operator"),
     ("context_length", "model"), ("content_filter", "model"),
     ("bad_request", "inconclusive"), ("malformed_response", "inconclusive"),
     ("AttemptDeadline", "harness"), ("harness_error", "harness"), ("budget_stop", "ceiling")],
)
def test_a_non_retryable_error_is_final_with_its_class(plan: Plan, code: str, cls: str) -> None:
    a = plan.requests[0]
    got = states(plan, [failed(a, 1, "timeout"), failed(a, 2, code)])[a.run_id]
    assert (got.state, got.next_attempt, got.failure_class, got.error_code) == ("final_error", None, cls, code)


def test_every_error_code_has_a_class() -> None:
    from harness.records.attempt import ATTEMPT_ERROR_CODES

    assert set(ERROR_CLASSES) == set(ATTEMPT_ERROR_CODES)
    assert {ERROR_CLASSES[c] for c in TRANSPORT_CODES} == {"provider"}


def test_registered_fewer_retries_exhaust_sooner(plan: Plan) -> None:
    a = plan.requests[0]
    got = states(plan, [failed(a, 1, "timeout")], transport_retries=1)[a.run_id]
    assert (got.state, got.next_attempt) == ("pending", 2)
    got = states(plan, [failed(a, 1, "timeout"), failed(a, 2, "timeout")], transport_retries=1)[a.run_id]
    assert got.state == "exhausted"
    assert states(plan, [failed(a, 1, "timeout")], transport_retries=0)[a.run_id].state == "exhausted"
    with pytest.raises(ValueError):
        schedule(plan, [], transport_retries=4)


def test_a_recorded_repair_is_not_an_attempt(plan: Plan, tmp_path: Path) -> None:
    a = plan.requests[0]
    path = log_of(plan, tmp_path / "attempts.jsonl", [failed(a, 1, "timeout")])
    with path.open("ab") as f:
        f.write(b'{"kind":"model-attempt.v1","run_id":')  # a crash mid-append: a torn tail
    ChainedLog(path, plan.attempts_seed()).repair()
    log_of(plan, path, [delivered(a, 2)])
    done = resume_cli(plan, tmp_path, path)
    assert done.code == 0, done.out
    assert done.out["counts"] == {"delivered": 1, "pending": 2, "exhausted": 0, "final_error": 0}
    assert done.out["attempts_lines"] == 3


# --------------------------------------------------------------------------
# Refusals, each through the CLI: exit 3, the named refusal, its line, no traceback


Crafted = Callable[[Plan], list[dict[str, Any]]]


def _unknown(plan: Plan) -> list[dict[str, Any]]:
    record = failed(plan.requests[0], 1, "timeout")
    return [delivered(plan.requests[1], 1), {**record, "run_id": "r-00000000000000000000"}]


def _changed(plan: Plan) -> list[dict[str, Any]]:
    a, b = plan.requests[:2]
    return [failed(a, 1, "timeout"), {**failed(a, 2, "timeout"), "request_sha256": b.request_sha256}]


def _duplicate(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[0]
    return [failed(a, 1, "timeout"), failed(a, 2, "timeout"), failed(a, 2, "rate_limited")]


def _gap(plan: Plan) -> list[dict[str, Any]]:
    a, b = plan.requests[:2]
    return [failed(a, 1, "timeout"), failed(b, 1, "timeout"), failed(a, 3, "timeout")]


def _starts_at_two(plan: Plan) -> list[dict[str, Any]]:
    return [failed(plan.requests[2], 2, "timeout")]


def _hash(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[0]
    good = delivered(a, 2)
    return [failed(a, 1, "timeout"), {**good, "response_sha256": sha256_hex(b"another response")}]


def _after_delivery(plan: Plan) -> list[dict[str, Any]]:
    a, b = plan.requests[:2]
    return [delivered(a, 1), failed(b, 1, "timeout"), failed(a, 2, "timeout")]


def _redelivered(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[0]
    return [delivered(a, 1), delivered(a, 1)]


def _after_final(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[1]
    return [failed(a, 1, "context_length"), delivered(a, 2)]


def _limit(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[0]
    return [failed(a, n, "timeout") for n in (1, 2, 3, 4)] + [delivered(a, 5)]


def _schema(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[0]
    return [failed(a, 1, "timeout"), {**failed(a, 2, "timeout"), "cost_usd": 0, "attempt": True}]


def _text_on_error(plan: Plan) -> list[dict[str, Any]]:
    a = plan.requests[0]
    return [{**failed(a, 1, "content_filter"), "text": "looks like an answer"}]


def _not_an_attempt(plan: Plan) -> list[dict[str, Any]]:
    return [delivered(plan.requests[0], 1), {"event": "ceiling", "at": 1.0}]


REFUSALS: list[tuple[str, Crafted, str, int]] = [
    ("unknown run id", _unknown, "attempt_unknown_run_id", 2),
    ("request changed", _changed, "attempt_request_changed", 2),
    ("duplicate number", _duplicate, "attempt_numbering_invalid", 3),
    ("gap in numbers", _gap, "attempt_numbering_invalid", 3),
    ("starts at two", _starts_at_two, "attempt_numbering_invalid", 1),
    ("response hash", _hash, "attempt_response_hash_mismatch", 2),
    ("retry after delivery", _after_delivery, "attempt_after_delivery", 3),
    ("second delivery", _redelivered, "attempt_after_delivery", 2),
    ("attempt after final error", _after_final, "attempt_after_final", 2),
    ("fifth attempt", _limit, "attempt_limit_exceeded", 5),
    ("schema", _schema, "attempt_invalid", 2),
    ("text on an error", _text_on_error, "attempt_invalid", 1),
    ("not an attempt", _not_an_attempt, "attempt_invalid", 2),
]


@pytest.mark.parametrize(("name", "craft", "code", "line"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_resume_refuses_a_crafted_log(
    plan: Plan, tmp_path: Path, name: str, craft: Crafted, code: str, line: int
) -> None:
    attempts = log_of(plan, tmp_path / "attempts.jsonl", craft(plan))
    assert verify_log(attempts, plan.attempts_seed()).ok  # the chain is intact: the record is the problem
    done = resume_cli(plan, tmp_path, attempts)
    assert done.code == 3, done.out
    assert done.out["refusal"] == code, done.out
    assert done.out["line"] == line, done.out
    assert done.out["message"].startswith(f"line {line}: ")
    assert done.out["path"] == str(attempts)
    assert not (tmp_path / "schedule.jsonl").exists()  # nothing written on a refusal
    with pytest.raises(Refusal) as caught:  # the pure core says the same
        schedule(plan, craft(plan))
    assert (caught.value.code, caught.value.details["line"]) == (code, line)


def test_resume_refuses_a_broken_chain(plan: Plan, tmp_path: Path) -> None:
    a, b = plan.requests[:2]
    attempts = log_of(plan, tmp_path / "attempts.jsonl", [failed(a, 1, "timeout"), delivered(b, 1), delivered(a, 2)])
    lines = attempts.read_bytes().split(b"\n")
    edited = loads_strict(lines[1])
    edited["cost_usd"] = 0.0  # rewritten in place (still canonical): the next line's prev no longer matches
    lines[1] = canonical_bytes(edited)
    attempts.write_bytes(b"\n".join(lines))
    done = resume_cli(plan, tmp_path, attempts)
    assert (done.code, done.out["refusal"], done.out["line"], done.out["kind"]) == (3, "log_broken", 3, "broken_prev")


def test_resume_refuses_a_torn_tail(plan: Plan, tmp_path: Path) -> None:
    attempts = log_of(plan, tmp_path / "attempts.jsonl", [failed(plan.requests[0], 1, "timeout")])
    with attempts.open("ab") as f:
        f.write(canonical_bytes(failed(plan.requests[0], 2, "timeout"))[:50])
    done = resume_cli(plan, tmp_path, attempts)
    assert (done.code, done.out["refusal"], done.out["line"]) == (3, "log_torn_tail", 2)


def test_resume_refuses_a_log_of_another_stage_or_study(plan: Plan, tmp_path: Path) -> None:
    attempts = log_of(plan, tmp_path / "attempts.jsonl", [failed(plan.requests[0], 1, "timeout")],
                      seed="proctor-attempts:demo:B")
    done = resume_cli(plan, tmp_path, attempts)
    assert (done.code, done.out["refusal"], done.out["line"]) == (3, "log_seed_mismatch", 1)


def test_resume_refuses_a_bad_plan_naming_the_line(tmp_path: Path) -> None:
    records = plan_records()
    records[2]["request_sha256"] = sha256_hex(b"x")
    path = write_records(tmp_path / "plan.jsonl", records)
    done = run_proctor("resume", "--plan", str(path), "--out", str(tmp_path / "s.jsonl"))
    assert (done.code, done.out["refusal"], done.out["line"], done.out["path"]) == (3, "plan_invalid", 3, str(path))


def test_resume_refuses_an_unknown_stage_and_an_output_over_an_input(plan: Plan, tmp_path: Path) -> None:
    done = resume_cli(plan, tmp_path, None, "--stage", "Z")
    assert (done.code, done.out["refusal"]) == (3, "resume_stage_unknown")
    attempts = log_of(plan, tmp_path / "attempts.jsonl", [failed(plan.requests[0], 1, "timeout")])
    before = attempts.read_bytes()
    for target in (str(attempts), plan.path):
        done = run_proctor("resume", "--plan", plan.path, "--attempts", str(attempts), "--out", target)
        assert (done.code, done.out["refusal"]) == (3, "resume_out_conflict")
    assert attempts.read_bytes() == before


def test_resume_refuses_missing_and_special_files(plan: Plan, tmp_path: Path) -> None:
    done = resume_cli(plan, tmp_path, tmp_path / "nope.jsonl")
    assert (done.code, done.out["refusal"]) == (3, "file_missing")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = resume_cli(plan, tmp_path, fifo)
    assert (done.code, done.out["refusal"]) == (3, "not_a_regular_file")
    done = run_proctor("resume", "--plan", plan.path, "--out", str(tmp_path / "no" / "such" / "s.jsonl"))
    assert (done.code, done.out["refusal"]) == (3, "folder_missing")


# --------------------------------------------------------------------------
# What resume writes


def test_resume_writes_a_canonical_schedule(plan: Plan, tmp_path: Path) -> None:
    a, b, c = plan.requests
    attempts = log_of(plan, tmp_path / "attempts.jsonl", [
        failed(a, 1, "timeout"), delivered(b, 1), failed(c, 1, "billing"), failed(a, 2, "server_error"),
    ])
    done = resume_cli(plan, tmp_path, attempts)
    assert done.code == 0, done.out
    out = tmp_path / "schedule.jsonl"
    data = out.read_bytes()
    lines = [loads_strict(x) for x in data.splitlines()]
    assert data == b"".join(canonical_line(x) for x in lines)
    header, *runs = lines
    status = verify_log(attempts, plan.attempts_seed())
    assert header == {
        "kind": "resume-header.v1", "study": "demo", "scope": "pilot", "stage": None,
        "plan_sha256": plan.sha256, "attempts_sha256": sha256_hex(attempts.read_bytes()),
        "attempts_seed": "proctor-attempts:demo:A", "attempts_lines": 4, "attempts_head": status.head,
        "transport_retries": 3, "max_attempts": 4, "runs": 3,
        "counts": {"delivered": 1, "pending": 1, "exhausted": 0, "final_error": 1},
        "final_error_classes": {"operator": 1},
    }
    assert [(r["run_id"], r["state"], r["next_attempt"], r["attempts"], r["class"]) for r in runs] == [
        (a.run_id, "pending", 3, 2, "provider"),
        (b.run_id, "delivered", None, 1, None),
        (c.run_id, "final_error", None, 1, "operator"),
    ]
    assert done.out["counts"] == header["counts"] and done.out["schedule_sha256"] == sha256_hex(data)
    assert resume_cli(plan, tmp_path, attempts).code == 0
    assert out.read_bytes() == data  # the same inputs give the same bytes


def test_resume_without_attempts_schedules_everything_once(plan: Plan, tmp_path: Path) -> None:
    done = resume_cli(plan, tmp_path, None)
    assert done.code == 0
    assert done.out["counts"] == {"delivered": 0, "pending": 3, "exhausted": 0, "final_error": 0}
    header = loads_strict((tmp_path / "schedule.jsonl").read_bytes().splitlines()[0])
    assert "attempts_sha256" not in header


def test_resume_by_stage_uses_that_stages_log(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.jsonl", 2, stages=("A", "B"))
    b_runs = [r for r in plan.requests if r.stage == "B"]
    a_run = plan.requests[0]
    attempts = log_of(plan, tmp_path / "b.jsonl", [delivered(b_runs[0], 1)], seed=plan.attempts_seed("B"))
    done = resume_cli(plan, tmp_path, attempts, "--stage", "B")
    assert done.code == 0, done.out
    assert done.out["counts"] == {"delivered": 1, "pending": 1, "exhausted": 0, "final_error": 0}
    log_of(plan, attempts, [failed(a_run, 1, "timeout")], seed=plan.attempts_seed("B"))
    done = resume_cli(plan, tmp_path, attempts, "--stage", "B")
    assert (done.out["refusal"], done.out["line"]) == ("attempt_unknown_run_id", 2)
    assert "belongs to stage 'A'" in done.out["message"]


def test_resume_prints_for_a_person_and_opens_no_socket(
    plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("resume opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    attempts = log_of(plan, tmp_path / "attempts.jsonl", [delivered(plan.requests[0], 1)])
    code = main(["resume", "--plan", plan.path, "--attempts", str(attempts), "--out", str(tmp_path / "s.jsonl")])
    shown = capsys.readouterr()
    assert code == 0, shown.err
    assert "delivered: 1" in shown.out and "pending: 2" in shown.out


# --------------------------------------------------------------------------
# Properties

OUTCOMES = ("delivered", *TRANSPORT_CODES, *FINAL_CODES)
# Transport-class errors drawn half the time, so that chains of four are common.
outcomes = st.sampled_from(TRANSPORT_CODES) | st.sampled_from(OUTCOMES)
errors = st.sampled_from(TRANSPORT_CODES) | st.sampled_from((*TRANSPORT_CODES, *FINAL_CODES))


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 2), outcomes), max_size=40))
def test_a_runner_following_the_schedule_never_exceeds_four_attempts(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, str]]
) -> None:
    """Simulate a runner: each step, a run asks the schedule and makes the attempt it is owed."""
    plan = _property_plan(tmp_path_factory)
    records: list[dict[str, Any]] = []
    outcomes: dict[str, list[str]] = {r.run_id: [] for r in plan.requests}
    for index, outcome in steps:
        request = plan.requests[index]
        now = states(plan, records)
        event(f"states {sorted({s.state for s in now.values()})}")
        _check_invariants(now, outcomes)
        run = now[request.run_id]
        if run.state != "pending":
            continue
        assert run.next_attempt == len(outcomes[request.run_id]) + 1 <= 4
        made = delivered(request, run.next_attempt) if outcome == "delivered" else failed(
            request, run.next_attempt, outcome
        )
        records.append(made)
        outcomes[request.run_id].append(outcome)
    _check_invariants(states(plan, records), outcomes)


def _check_invariants(now: dict[str, RunState], outcomes: dict[str, list[str]]) -> None:
    for run_id, seen in outcomes.items():
        run = now[run_id]
        assert run.attempts == len(seen) <= 4
        transport = sum(1 for o in seen if o in TRANSPORT_CODES)
        assert (run.state == "exhausted") == (transport == 4 and len(seen) == 4)
        if "delivered" in seen:
            assert seen[-1] == "delivered" and run.state == "delivered" and run.next_attempt is None
        if run.state == "pending":
            assert run.next_attempt == len(seen) + 1 <= 4
            assert all(o in TRANSPORT_CODES for o in seen)
        else:
            assert run.next_attempt is None
        if run.state == "final_error":
            assert seen[-1] in FINAL_CODES and run.failure_class == ERROR_CLASSES[seen[-1]]


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[list[str]], list[int]]:
    """Per run, any outcome sequence where nothing follows a delivery; and an interleaving."""
    chains: list[list[str]] = []
    for _ in range(3):
        drawn = draw(st.lists(errors, max_size=6))
        chains.append(drawn + (["delivered"] if draw(st.booleans()) else []))
    order = [i for i, chain in enumerate(chains) for _ in chain]
    return chains, draw(st.permutations(order))


@settings(max_examples=300, deadline=None)
@given(drawn=logs())
def test_any_log_is_scheduled_or_refused_exactly_as_the_rules_say(
    tmp_path_factory: pytest.TempPathFactory, drawn: tuple[list[list[str]], list[int]]
) -> None:
    chains, order = drawn
    plan = _property_plan(tmp_path_factory)
    records: list[dict[str, Any]] = []
    made = [0, 0, 0]
    expected_refusal: tuple[str, int] | None = None
    for line, index in enumerate(order, start=1):
        request, outcome = plan.requests[index], chains[index][made[index]]
        earlier = chains[index][: made[index]]
        made[index] += 1
        if expected_refusal is None and earlier:
            if earlier[-1] not in TRANSPORT_CODES:
                expected_refusal = ("attempt_after_final", line)
            elif len(earlier) >= 4:
                expected_refusal = ("attempt_limit_exceeded", line)
        records.append(
            delivered(request, made[index]) if outcome == "delivered" else failed(request, made[index], outcome)
        )
    if expected_refusal is not None:
        with pytest.raises(Refusal) as caught:
            schedule(plan, records)
        assert (caught.value.code, caught.value.details["line"]) == expected_refusal
        event(expected_refusal[0])
        return
    result = schedule(plan, records)
    event(f"states {sorted({s.state for s in result})}")
    for run, chain in zip(result, chains, strict=True):
        assert run.attempts == len(chain) <= 4
        if not chain:
            assert (run.state, run.next_attempt) == ("pending", 1)
        elif chain[-1] == "delivered":
            assert (run.state, run.next_attempt) == ("delivered", None)
        elif chain[-1] in FINAL_CODES:
            assert (run.state, run.failure_class) == ("final_error", ERROR_CLASSES[chain[-1]])
        elif len(chain) == 4:
            assert (run.state, run.next_attempt) == ("exhausted", None)
        else:
            assert (run.state, run.next_attempt) == ("pending", len(chain) + 1)


_PLANS: dict[int, Plan] = {}


def _property_plan(factory: pytest.TempPathFactory) -> Plan:
    if id(factory) not in _PLANS:
        _PLANS[id(factory)] = write_plan(factory.mktemp("plan") / "plan.jsonl")
    return _PLANS[id(factory)]


# --------------------------------------------------------------------------
# The runner's own attempts log (issue 13 item 10)


def test_resume_reads_the_runners_own_attempts_log(tmp_path: Path, sim: Sim) -> None:
    # a real stage with server errors, so its attempts log holds reruns (attempts numbered per rerun)
    url = sim([study.system("sim-flash", 1.0, server_error=0.5), study.system("sim-glm", 0.0)])
    summary = run_stage(study.prereg(tmp_path), "A", tmp_path / "results", base_urls=study.urls(url))
    folder = Path(summary.folder)
    attempts = study.logs(folder)["attempts"]
    assert max(a["rerun"] for a in attempts) >= 1
    out = tmp_path / "schedule.jsonl"
    done = run_proctor("resume", "--plan", str(folder / "plan.jsonl"), "--attempts", str(folder / "attempts.jsonl"),
                       "--out", str(out), "--transport-retries", "0")
    assert done.code == 0, done.out
    runs = [loads_strict(x) for x in out.read_bytes().splitlines()[1:]]
    finals: dict[str, dict[str, Any]] = {}
    for f in study.logs(folder)["finals"]:
        finals[f["run_id"]] = f  # the last final of each run
    assert {r["run_id"] for r in runs} == set(finals)
    for r in runs:
        last = finals[r["run_id"]]
        assert r["rerun"] == last["rerun"]
        assert r["state"] == ("delivered" if last["class"] == "delivered" else "exhausted"), (r, last)


def _run_records(plan: Plan, records: list[tuple[dict[str, Any], int]]) -> list[dict[str, Any]]:
    return [{**record, "rerun": rerun} for record, rerun in records]


def test_a_runner_log_is_checked_rerun_by_rerun(plan: Plan) -> None:
    a, b, _ = plan.requests
    got = states(plan, _run_records(plan, [(failed(a, 1, "server_error"), 0), (failed(a, 1, "timeout"), 1),
                                           (delivered(a, 2), 1), (delivered(b, 1), 0)]), transport_retries=1)
    assert (got[a.run_id].state, got[a.run_id].rerun, got[a.run_id].attempts) == ("delivered", 1, 2)
    assert got[a.run_id].to_json()["rerun"] == 1 and "rerun" not in states(plan, [])[a.run_id].to_json()
    cases = [
        ([(failed(a, 1, "server_error"), 1)], "attempt_numbering_invalid", "rerun 1 out of order"),
        ([(delivered(a, 1), 0), (delivered(a, 1), 1)], "attempt_after_delivery", "delivered attempt 1"),
        ([(failed(a, 1, "content_filter"), 0), (delivered(a, 1), 1)], "attempt_after_final", "model failure"),
        ([(failed(a, 1, "server_error"), 0), (failed(a, 1, "server_error"), 2)], "attempt_numbering_invalid",
         "expected rerun 0 or 1"),
        ([(failed(a, 1, "server_error"), 0), (failed(a, 1, "server_error"), 1), (failed(a, 2, "timeout"), 0)],
         "attempt_numbering_invalid", "rerun 0 out of order"),
    ]
    for records, code, fragment in cases:
        with pytest.raises(Refusal) as caught:
            schedule(plan, _run_records(plan, records), transport_retries=1)
        assert caught.value.code == code and fragment in caught.value.message, (records, caught.value.message)
