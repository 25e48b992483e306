"""The plan reader and `model-attempt.v1` records: builders, the strict validator, round trips.

The plan fixture (tests/support/attempts.py) is written in the documented format (a
header, then one `plan-request.v1` per cell, bodies built by the real openai_chat
adapter); tests/run/test_resume.py uses its `write_plan`, `delivered` and `failed` too.
"""

from __future__ import annotations

import base64
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_bytes, canonical_line, loads_strict, sha256_hex
from harness.meter.cost import Cost, meter
from harness.providers.base import ERROR_CODES
from harness.records.attempt import (
    ATTEMPT_ERROR_CODES,
    HARNESS_ERROR_CODES,
    decode_response_raw,
    validate_attempt,
)
from harness.records.plan import Plan, attempts_seed
from harness.records.usage import TokenUsage
from harness.run.attempts import attempt_from_exchange, error_attempt, read_plan
from tests.support.attempts import (
    PRICE,
    UNKNOWN,
    chat_body,
    delivered,
    exchange,
    failed,
    plan_records,
    write_plan,
    write_records,
)


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return write_plan(tmp_path / "plan.jsonl")


# --------------------------------------------------------------------------
# read_plan


def test_read_plan_reads_the_fixture(tmp_path: Path) -> None:
    path = tmp_path / "plan.jsonl"
    plan = write_plan(path)
    assert plan.sha256 == sha256_hex(path.read_bytes())
    assert len(plan.requests) == 3 and plan.study == "demo" and plan.scope == "pilot"
    assert [r.line for r in plan.requests] == [2, 3, 4]
    first = plan.requests[0]
    assert plan.by_run_id[first.run_id] is first
    assert sha256_hex(first.body) == first.request_sha256
    assert plan.stages == ("A",)
    assert plan.attempts_seed() == attempts_seed("demo", "A") == "proctor-attempts:demo:A"


def test_a_plan_of_many_stages_seeds_by_scope_unless_a_stage_is_named(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.jsonl", 2, stages=("A", "B"))
    assert plan.stages == ("A", "B")
    assert plan.attempts_seed() == "proctor-attempts:demo:pilot"
    assert plan.attempts_seed("B") == "proctor-attempts:demo:B"


def _mutate(records: list[dict[str, Any]], index: int, **changes: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(records)
    for key, value in changes.items():
        if value is _DELETE:
            del out[index][key]
        else:
            out[index][key] = value
    return out


_DELETE = object()


def _plan_cases() -> list[tuple[str, Any, int]]:
    base = plan_records()
    second = base[2]["run_id"]
    return [
        ("empty", b"", 1),
        ("torn", b"".join(canonical_line(r) for r in base)[:-1], 4),
        ("request first", [base[1], base[0], *base[2:]], 1),
        ("unknown kind", _mutate(base, 2, kind="plan-cell.v9"), 3),
        ("duplicate run id", _mutate(base, 3, run_id=second), 4),
        ("count", _mutate(base, 0, requests=4), 1),
        ("count as bool", _mutate(base, 0, requests=True), 1),
        ("bad scope", _mutate(base, 0, scope="everything"), 1),
        ("request sha", _mutate(base, 2, request_sha256=sha256_hex(b"other")), 3),
        ("prompt sha", _mutate(base, 3, prompt_sha256=sha256_hex(b"other")), 4),
        ("body changed", _mutate(base, 1, request_body=base[1]["request_body"] + " "), 2),
        ("missing field", _mutate(base, 2, lane=_DELETE), 3),
        ("extra field", _mutate(base, 2, answer="42"), 3),
        ("bool repeat", _mutate(base, 3, repeat=True), 4),
        ("negative lane", _mutate(base, 1, lane=-1), 2),
        ("study mismatch", _mutate(base, 1, study="other"), 2),
        ("api shape", _mutate(base, 1, api_shape="smoke_signals"), 2),
        ("empty run id", _mutate(base, 1, run_id=""), 2),
        ("lone surrogate", _mutate(base, 1, prompt="\ud800"), 2),
    ]


@pytest.mark.parametrize(("name", "content", "line"), _plan_cases(), ids=[c[0] for c in _plan_cases()])
def test_read_plan_refuses_naming_the_line(tmp_path: Path, name: str, content: Any, line: int) -> None:
    path = tmp_path / "plan.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif name == "lone surrogate":  # canonical_line cannot write it: write the JSON escape by hand
        path.write_bytes(b"".join(
            json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            .encode("utf-8", "surrogatepass").replace(b"\xed\xa0\x80", b"\\ud800") + b"\n"
            for r in content
        ))
    else:
        write_records(path, content)
    with pytest.raises(Refusal) as caught:
        read_plan(path)
    assert caught.value.code == "plan_invalid", caught.value.message
    assert caught.value.details["line"] == line, caught.value.message
    assert caught.value.path == str(path)


def test_read_plan_refuses_a_line_that_is_not_canonical(tmp_path: Path) -> None:
    records = plan_records()
    lines = [canonical_line(r) for r in records]
    lines[2] = (json.dumps(records[2], sort_keys=True) + "\n").encode("utf-8")  # spaces after separators
    path = tmp_path / "plan.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(Refusal) as caught:
        read_plan(path)
    assert (caught.value.code, caught.value.details["line"]) == ("plan_invalid", 3)
    assert "canonical" in caught.value.message


def test_read_plan_refuses_bad_json_and_a_folder(tmp_path: Path) -> None:
    path = tmp_path / "plan.jsonl"
    path.write_bytes(canonical_line(plan_records()[0]) + b'{"kind": NaN}\n')
    with pytest.raises(Refusal) as caught:
        read_plan(path)
    assert (caught.value.code, caught.value.details["line"]) == ("plan_invalid", 2)
    with pytest.raises(Refusal) as caught:
        read_plan(tmp_path)
    assert caught.value.code == "not_a_regular_file"


# --------------------------------------------------------------------------
# Builders


def test_attempt_from_a_real_exchange_is_delivered_and_round_trips(plan: Plan, tmp_path: Path) -> None:
    request = plan.requests[0]
    ex = exchange(request)
    cost = meter(ex.parsed.usage, PRICE)
    record = attempt_from_exchange(request, 1, ex, cost)
    assert record["outcome"] == "delivered" and record["text"] == "def f():\n    return 0\n"
    assert record["response_raw"] == chat_body().decode("utf-8")
    assert record["response_sha256"] == sha256_hex(chat_body())
    assert record["request_sha256"] == request.request_sha256
    assert record["provider_request_id"] == "chatcmpl-123"
    assert record["model_snapshot"] == "sim-flash-2026-01-01"
    assert record["finish_reason"] == "stop"
    assert record["tokens"] == {"input": 40, "cached_input": 0, "cache_write": 0, "output": 12, "reasoning": 0}
    assert record["usage_unknown"] is False
    assert record["cost_usd"] == pytest.approx(40 * 0.5 / 1e6 + 12 * 2.0 / 1e6)
    assert record["cost_status"] == "metered"
    assert record["latency_s"] == ex.ended - ex.started and record["http_status"] == 200
    assert "error_code" not in record
    log = ChainedLog(tmp_path / "attempts.jsonl", plan.attempts_seed())
    log.append(record)
    [back] = read_log(log.path, plan.attempts_seed())
    validate_attempt(back, 1)
    assert {k: v for k, v in back.items() if k not in ("prev", "seed")} == record


def test_unknown_cost_stays_unknown_never_zero(plan: Plan) -> None:
    request = plan.requests[0]
    no_usage = exchange(request, raw=chat_body(usage=False))
    record = attempt_from_exchange(request, 1, no_usage, meter(no_usage.parsed.usage, PRICE))
    assert (record["cost_usd"], record["cost_status"], record["tokens"], record["usage_unknown"]) == (
        "unknown", "usage_unknown", None, True,
    )
    no_price = exchange(request)
    record = attempt_from_exchange(request, 1, no_price, meter(no_price.parsed.usage, None))
    assert (record["cost_usd"], record["cost_status"]) == ("unknown", "price_unknown")
    assert record["tokens"] is not None
    deadline = error_attempt(
        request, 2, error_code="AttemptDeadline", error_message="abandoned at 120 s",
        started=100.0, ended=220.0, cost=UNKNOWN,
    )
    assert deadline["cost_usd"] == "unknown" and deadline["latency_s"] == 120.0
    assert deadline["response_raw"] is None and deadline["response_sha256"] is None
    for cost in (0, 0.0):  # a zero for an unknown cost is refused
        with pytest.raises(Refusal) as caught:
            validate_attempt({**deadline, "cost_usd": cost}, 9)
        assert caught.value.code == "attempt_invalid"


def test_a_cost_that_disagrees_with_unknown_usage_is_refused_by_the_builder(plan: Plan) -> None:
    request = plan.requests[0]
    no_usage = exchange(request, raw=chat_body(usage=False))
    with pytest.raises(Refusal) as caught:
        attempt_from_exchange(request, 1, no_usage, Cost(0.0))
    assert caught.value.code == "attempt_invalid"


def test_an_error_exchange_never_looks_like_an_answer(plan: Plan) -> None:
    request = plan.requests[1]
    raw = canonical_bytes({
        "id": "chatcmpl-9", "model": "sim-flash-2026-01-01",
        "choices": [{"index": 0, "finish_reason": "content_filter", "message": {"role": "assistant", "content": "partial"}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 3},
    })
    ex = exchange(request, raw=raw)
    assert ex.parsed.error_code == "content_filter" and ex.parsed.text == "partial"
    record = attempt_from_exchange(request, 1, ex, meter(ex.parsed.usage, PRICE))
    assert record["outcome"] == "error" and record["error_code"] == "content_filter"
    assert "text" not in record
    assert record["cost_status"] == "metered" and record["response_sha256"] == sha256_hex(raw)
    with pytest.raises(Refusal) as caught:
        validate_attempt({**record, "text": "partial"}, 4)
    assert caught.value.code == "attempt_invalid" and caught.value.details["line"] == 4


def test_a_transport_failure_records_that_nothing_came_back(plan: Plan) -> None:
    request = plan.requests[0]
    from harness.providers.common import failure

    ex = exchange(request, status=None, raw=b"", parsed=failure("timeout", "POST ...: ReadTimeout"))
    record = attempt_from_exchange(request, 1, ex, meter(None, PRICE))
    assert record["outcome"] == "error" and record["error_code"] == "timeout"
    assert record["response_raw"] is None and record["response_sha256"] is None
    assert record["http_status"] is None and record["cost_usd"] == "unknown"
    assert "sent" not in record  # sent (the default): no answer may still have been billed


def test_a_request_that_never_left_costs_exactly_nothing(plan: Plan) -> None:
    """Issue 13 item 1: a refused connection is recorded `"sent": false` at $0, not the reserve."""
    import dataclasses
    import socket

    from harness.providers.transport import Transport
    from harness.records.attempt import Attempt

    request = plan.requests[0]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    sent = dataclasses.replace(exchange(request).request, url=f"http://127.0.0.1:{port}/v1/chat/completions")
    with Transport(timeout_s=5) as transport:
        ex = transport.send(sent, None)
    assert ex.meta["sent"] is False and ex.parsed.error_code == "transport"
    record = attempt_from_exchange(request, 1, ex, meter(None, PRICE))  # the meter says unknown: overruled
    assert record["sent"] is False and record["cost_usd"] == 0 and record["cost_status"] == "metered"
    assert record["tokens"] == dict.fromkeys(record["tokens"], 0) and record["usage_unknown"] is False
    validate_attempt(record, None)
    assert Attempt.from_json(record).to_json() == record


@pytest.mark.parametrize(("name", "change"), [
    ("sent true", {"sent": True}),
    ("sent with a cost", {"sent": False, "cost_usd": 0.01}),
    ("sent with an unknown cost", {"sent": False, "cost_usd": "unknown", "cost_status": "usage_unknown",
                                   "tokens": None, "usage_unknown": True}),
    ("sent with tokens", {"sent": False, "tokens": {"input": 1, "cached_input": 0, "cache_write": 0, "output": 0,
                                                    "reasoning": 0}}),
    ("sent with a status", {"sent": False, "http_status": 503}),
    ("sent on a rate limit", {"sent": False, "error_code": "rate_limited"}),
])
def test_validator_refuses_an_unsent_record_that_is_not_free(plan: Plan, name: str, change: dict[str, Any]) -> None:
    zero = {"input": 0, "cached_input": 0, "cache_write": 0, "output": 0, "reasoning": 0}
    good = {**failed(plan.requests[0], 1, "transport"), "sent": False, "cost_usd": 0.0, "cost_status": "metered",
            "tokens": zero, "usage_unknown": False}
    validate_attempt(good, None)
    with pytest.raises(Refusal) as caught:
        validate_attempt({**good, **change}, 3, path="attempts.jsonl")
    assert caught.value.code == "attempt_invalid" and caught.value.path == "attempts.jsonl", caught.value.message
    with pytest.raises(Refusal):  # and never on an answer
        validate_attempt({**_good(plan), "sent": False}, 3)


def test_a_binary_error_body_is_kept_as_base64(plan: Plan) -> None:
    request = plan.requests[0]
    raw = b"\xff\xfe<html>502 Bad Gateway</html>\x00"
    ex = exchange(request, status=502, raw=raw)
    assert ex.parsed.error_code == "server_error"
    record = attempt_from_exchange(request, 1, ex, meter(ex.parsed.usage, PRICE))
    assert record["response_raw"] == {"base64": base64.b64encode(raw).decode("ascii")}
    assert decode_response_raw(record["response_raw"]) == raw
    assert record["http_status"] == 502 and record["cost_usd"] == "unknown"


def test_the_body_sent_must_be_the_plans(plan: Plan) -> None:
    request = plan.requests[0]
    ex = exchange(request, body=request.body + b" ")
    with pytest.raises(Refusal) as caught:
        attempt_from_exchange(request, 1, ex, meter(ex.parsed.usage, PRICE))
    assert caught.value.code == "attempt_request_changed"


def test_error_attempt_refuses_an_unknown_code(plan: Plan) -> None:
    with pytest.raises(Refusal) as caught:
        failed(plan.requests[0], 1, "gremlins")
    assert caught.value.code == "attempt_invalid"
    for code in ATTEMPT_ERROR_CODES:
        validate_attempt(failed(plan.requests[0], 1, code), 1)
    # issue 13: runner_lost, an intent a crash left without its outcome, resolved on resume
    assert set(HARNESS_ERROR_CODES) == {"AttemptDeadline", "budget_stop", "harness_error", "runner_lost"}
    assert set(ERROR_CODES) < set(ATTEMPT_ERROR_CODES)


# --------------------------------------------------------------------------
# The validator


def _good(plan: Plan) -> dict[str, Any]:
    return delivered(plan.requests[0], 1)


def _validator_cases() -> list[tuple[str, dict[str, Any]]]:
    utf8_b64 = {"base64": base64.b64encode(b"hello").decode("ascii")}
    return [
        ("attempt as bool", {"attempt": True}),
        ("attempt zero", {"attempt": 0}),
        ("attempt float", {"attempt": 1.0}),
        ("run id empty", {"run_id": ""}),
        ("kind", {"kind": "model-attempt.v2"}),
        ("outcome", {"outcome": "maybe"}),
        ("outcome a list", {"outcome": []}),
        ("cost negative", {"cost_usd": -0.01}),
        ("cost bool", {"cost_usd": False}),
        ("cost string", {"cost_usd": "0.1"}),
        ("cost nan", {"cost_usd": math.nan}),
        ("cost inf", {"cost_usd": math.inf}),
        ("cost null", {"cost_usd": None}),
        ("unknown but metered", {"cost_usd": "unknown"}),
        ("status unknown", {"cost_status": "guessed"}),
        ("number with unknown status", {"cost_status": "price_unknown"}),
        ("tokens bool", {"tokens": {"input": True, "cached_input": 0, "cache_write": 0, "output": 1, "reasoning": 0}}),
        ("tokens missing category", {"tokens": {"input": 1, "output": 1}}),
        ("tokens negative", {"tokens": {"input": -1, "cached_input": 0, "cache_write": 0, "output": 1, "reasoning": 0}}),
        ("usage_unknown mismatch", {"usage_unknown": True}),
        ("usage_unknown int", {"usage_unknown": 0}),
        ("started bool", {"started": True}),
        ("ended before started", {"ended": 1.0}),
        ("latency negative", {"latency_s": -1.0}),
        ("status 500 delivered", {"http_status": 500}),
        ("status bool", {"http_status": True}),
        ("status out of range", {"http_status": 700}),
        ("no raw on delivery", {"response_raw": None, "response_sha256": None}),
        ("raw without sha", {"response_sha256": None}),
        ("sha not hex", {"response_sha256": "ABC"}),
        ("request sha not hex", {"request_sha256": "x" * 64}),
        ("raw as list", {"response_raw": ["x"]}),
        ("base64 of text", {"response_raw": utf8_b64, "response_sha256": sha256_hex(b"hello")}),
        ("base64 bad padding", {"response_raw": {"base64": "//8"}}),
        ("base64 not canonical", {"response_raw": {"base64": "//9="}, "response_sha256": sha256_hex(b"\xff\xff")}),
        ("base64 extra key", {"response_raw": {"base64": "//8=", "note": "x"}}),
        ("text not string", {"text": 3}),
        ("snapshot not string", {"model_snapshot": 3}),
        ("extra field", {"score": 1.0}),
        ("error code on delivery", {"error_code": "timeout"}),
    ]


@pytest.mark.parametrize(("name", "change"), _validator_cases(), ids=[c[0] for c in _validator_cases()])
def test_validator_refuses(plan: Plan, name: str, change: dict[str, Any]) -> None:
    record = {**_good(plan), **change}
    with pytest.raises(Refusal) as caught:
        validate_attempt(record, 7, path="attempts.jsonl")
    assert caught.value.code == "attempt_invalid", caught.value.message
    assert caught.value.details == {"line": 7}
    assert caught.value.message.startswith("line 7: ")
    assert caught.value.path == "attempts.jsonl"


def test_validator_refuses_missing_fields_and_non_objects(plan: Plan) -> None:
    good = _good(plan)
    for key in good:
        with pytest.raises(Refusal) as caught:
            validate_attempt({k: v for k, v in good.items() if k != key}, 2)
        assert caught.value.code == "attempt_invalid", key
    for value in ([], "x", None, 3):
        with pytest.raises(Refusal) as caught:
            validate_attempt(value, 2)
        assert caught.value.code == "attempt_invalid"


def test_validator_names_a_response_hash_mismatch(plan: Plan) -> None:
    record = {**_good(plan), "response_sha256": sha256_hex(b"something else")}
    with pytest.raises(Refusal) as caught:
        validate_attempt(record, 5)
    assert caught.value.code == "attempt_response_hash_mismatch"
    assert caught.value.details == {"line": 5}
    tampered = {**_good(plan), "response_raw": _good(plan)["response_raw"].replace("return 0", "return 1")}
    with pytest.raises(Refusal) as caught:
        validate_attempt(tampered, 5)
    assert caught.value.code == "attempt_response_hash_mismatch"


def test_validator_accepts_chain_fields(plan: Plan) -> None:
    validate_attempt({**_good(plan), "prev": "0" * 64, "seed": plan.attempts_seed()}, 1)


# --------------------------------------------------------------------------
# Properties


usages = st.none() | st.builds(
    TokenUsage, *(st.integers(min_value=0, max_value=10**9) for _ in range(5))
)


@settings(max_examples=200, deadline=None)
@given(
    raw=st.none() | st.binary(max_size=300) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    usage=usages,
    code=st.sampled_from(ATTEMPT_ERROR_CODES),
    priced=st.booleans(),
    attempt=st.integers(min_value=1, max_value=4),
    started=st.floats(min_value=0, max_value=2e9),
    took=st.floats(min_value=0, max_value=1e4),
    status=st.none() | st.integers(min_value=100, max_value=599),
)
def test_built_error_records_validate_and_round_trip(
    tmp_path_factory: pytest.TempPathFactory,
    raw: bytes | None, usage: TokenUsage | None, code: str, priced: bool, attempt: int,
    started: float, took: float, status: int | None,
) -> None:
    plan = _property_plan(tmp_path_factory)
    cost = meter(usage, PRICE if priced else None)
    record = error_attempt(
        plan.requests[0], attempt, error_code=code, error_message="x", started=started, ended=started + took,
        cost=cost, usage=usage, http_status=status, response_raw=raw,
    )
    back = loads_strict(canonical_bytes(record))
    assert back == record
    validate_attempt(back, 1)
    if raw is not None:
        assert decode_response_raw(back["response_raw"]) == raw
        assert back["response_sha256"] == sha256_hex(raw)
    if cost.total is None:
        assert back["cost_usd"] == "unknown"
    else:
        assert isinstance(back["cost_usd"], float) and back["cost_status"] == "metered"


@settings(max_examples=100, deadline=None)
@given(text=st.none() | st.text(max_size=100), usage=st.booleans(), status=st.integers(min_value=200, max_value=299))
def test_built_delivered_records_validate_and_round_trip(
    tmp_path_factory: pytest.TempPathFactory, text: str | None, usage: bool, status: int
) -> None:
    plan = _property_plan(tmp_path_factory)
    request = plan.requests[2]
    try:
        raw = chat_body(text, usage=usage)
    except Refusal:  # a lone surrogate cannot be written as UTF-8: no such response exists
        return
    ex = exchange(request, status=status, raw=raw)
    record = attempt_from_exchange(request, 1, ex, meter(ex.parsed.usage, PRICE))
    back = loads_strict(canonical_bytes(record))
    assert back == record
    validate_attempt(back, 1)
    assert back["outcome"] == "delivered" and back["text"] == text
    assert (back["cost_usd"] == "unknown") == (not usage)


_PLANS: dict[int, Plan] = {}


def _property_plan(factory: pytest.TempPathFactory) -> Plan:
    if id(factory) not in _PLANS:
        _PLANS[id(factory)] = write_plan(factory.mktemp("plan") / "plan.jsonl")
    return _PLANS[id(factory)]
