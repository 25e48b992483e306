"""The attempt records a runner writes: `attempt_from_exchange` and `error_attempt`.

The record itself (`model-attempt.v1`, its fields and its strict check) is
`harness.records.attempt`; the plan and its reader are `harness.records.plan`.

The manual: docs/records.md.
"""

from __future__ import annotations

import os
from typing import Any

from harness.errors import Code, RunRefusal
from harness.evidence.jsonio import sha256_hex
from harness.meter.cost import Cost
from harness.providers.base import Exchange
from harness.providers.registry import API_SHAPES
from harness.records.attempt import Attempt, raw_form, validate_attempt
from harness.records.plan import Plan, PlanCell
from harness.records.plan import read_plan as _read_plan
from harness.records.usage import TokenUsage

__all__ = ["attempt_from_exchange", "error_attempt", "never_sent", "read_plan"]

"""A plan line as read back (the same type as planned; `line` says where it was read)."""
PathArg = str | os.PathLike[str]


def read_plan(path: PathArg) -> Plan:
    """Read a plan file strictly; any problem is the refusal `plan_invalid` naming its line."""
    return _read_plan(path, api_shapes=API_SHAPES)


def _record(
    request: PlanCell,
    attempt_no: int,
    *,
    started: float,
    ended: float,
    latency_s: float,
    http_status: int | None,
    response_raw: bytes | None,
    response_sha256: str | None,
    provider_request_id: str | None,
    model_snapshot: str | None,
    finish_reason: str | None,
    usage: TokenUsage | None,
    cost: Cost,
    outcome: str,
    text: str | None = None,
    error_code: str | None = None,
    error_message: str | None = None,
    sent: bool | None = None,
) -> dict[str, Any]:
    record = Attempt(
        run_id=request.run_id, attempt=attempt_no, request_sha256=request.request_sha256, outcome=outcome,
        started=started, ended=ended, latency_s=latency_s, http_status=http_status,
        response_raw=None if response_raw is None else raw_form(response_raw), response_sha256=response_sha256,
        provider_request_id=provider_request_id, model_snapshot=model_snapshot, finish_reason=finish_reason,
        tokens=None if usage is None else usage.to_json(), usage_unknown=usage is None,
        cost_usd="unknown" if cost.total is None else cost.total, cost_status=cost.status,
        text=text, error_code=error_code, error_message=error_message, sent=sent,
    ).to_json()
    validate_attempt(record, None)
    return record


def never_sent(exchange: Exchange) -> bool:
    """Whether the transport failed before the request left (refused, DNS, TLS): it costs $0."""
    return exchange.meta.get("sent") is False


def attempt_from_exchange(
    plan_request: PlanCell, attempt_no: int, exchange: Exchange, cost: Cost
) -> dict[str, Any]:
    """The record of one exchange: delivered when the adapter parsed it as usable, else an error.

    Args:
        plan_request: the plan's cell the request was sent for.
        attempt_no: the attempt number (1-based) the schedule asked for.
        exchange: what the transport returned; its body must be the plan's exact bytes.
        cost: `meter(exchange.parsed.usage, price)` (unknown stays "unknown"); a request that
            never left (`never_sent`) is recorded `"sent": false` at exactly $0 whatever `cost` says.

    Raises:
        Refusal: `attempt_request_changed` when the body sent is not the plan's;
            `attempt_invalid` when the record would not pass `validate_attempt`.
    """
    sent = exchange.request
    if sent.body_sha256 != plan_request.request_sha256 or sha256_hex(sent.body) != sent.body_sha256:
        raise RunRefusal(
            Code.ATTEMPT_REQUEST_CHANGED,
            f"run {plan_request.run_id}: the body sent ({sha256_hex(sent.body)}) is not the plan's "
            f"({plan_request.request_sha256})",
            run_id=plan_request.run_id,
        )
    parsed = exchange.parsed
    came_back = exchange.status is not None or bool(exchange.raw_response)
    unsent = never_sent(exchange) and not came_back and not parsed.ok
    usage = TokenUsage() if unsent else parsed.usage
    if unsent:
        cost = Cost(0.0)
    if parsed.ok:
        outcome: dict[str, Any] = {"outcome": "delivered", "text": parsed.text}
    else:
        code = str(parsed.error_code)
        outcome = {"outcome": "error", "error_code": code, "error_message": parsed.error_message or code}
    return _record(
        plan_request, attempt_no, started=exchange.started, ended=exchange.ended,
        latency_s=exchange.latency_s, http_status=exchange.status,
        response_raw=exchange.raw_response if came_back else None,
        response_sha256=exchange.response_sha256 if came_back else None,
        provider_request_id=parsed.request_id, model_snapshot=parsed.model_snapshot,
        finish_reason=parsed.finish_reason, usage=usage, cost=cost, sent=False if unsent else None, **outcome,
    )


def error_attempt(
    plan_request: PlanCell,
    attempt_no: int,
    *,
    error_code: str,
    error_message: str,
    started: float,
    ended: float,
    cost: Cost,
    usage: TokenUsage | None = None,
    http_status: int | None = None,
    response_raw: bytes | None = None,
    provider_request_id: str | None = None,
    model_snapshot: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """An error record made without an exchange (e.g. `AttemptDeadline`, `budget_stop`).

    Args:
        error_code: one of `ATTEMPT_ERROR_CODES`.
        error_message: what happened, for a person.
        started, ended: epoch seconds; latency is their difference.
        cost: the spend known so far (`Cost(None, status="usage_unknown")` when unknown).
        usage: the tokens known so far, or None (unknown).
        response_raw: whatever bytes came back, if anything (None: nothing).

    Raises:
        Refusal: `attempt_invalid` when the record would not pass `validate_attempt`.
    """
    return _record(
        plan_request, attempt_no, started=started, ended=ended, latency_s=ended - started,
        http_status=http_status, response_raw=response_raw,
        response_sha256=None if response_raw is None else sha256_hex(response_raw),
        provider_request_id=provider_request_id, model_snapshot=model_snapshot,
        finish_reason=finish_reason, usage=usage, cost=cost,
        outcome="error", error_code=error_code, error_message=error_message,
    )
