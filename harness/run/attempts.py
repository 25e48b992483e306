"""The plan as a runner reads it, and the immutable `model-attempt.v1` records.

The plan (`read_plan`) is canonical JSONL: a `plan-header.v1` line, then one
`plan-request.v1` line per cell (see `PlanRequest`). The reader is strict:
header first, known kinds, every request field present with its type and
nothing else, unique run ids, the header's count, and the sha256 of each
prompt and request body. Any problem is `plan_invalid` naming the line.

An attempt is one request sent for one run id. Its record is appended to the
chained attempts log of the study's stage (seed `attempts_seed`) and never
rewritten. Fields of every record:

    kind                "model-attempt.v1"
    run_id, attempt     the plan's run id; the attempt number, 1-based and contiguous
    request_sha256      the sha256 of the exact body sent: always the plan's
    outcome             "delivered" (a usable response) or "error"
    started, ended      epoch seconds (never-backwards clock); latency_s (>= 0)
    http_status         the HTTP status, or null when no response arrived
    response_raw        the raw response: its text when strict UTF-8, else
                        {"base64": ...}; null only for an error where nothing came back
    response_sha256     sha256 of the raw response's bytes (null with response_raw)
    provider_request_id, model_snapshot, finish_reason   as the provider said (or null)
    tokens              {input, cached_input, cache_write, output, reasoning} or null
    usage_unknown       true exactly when tokens is null
    cost_usd            a finite non-negative number, or "unknown" (never 0 for unknown)
    cost_status         "metered" with a number; "usage_unknown"/"price_unknown" with "unknown"

A delivered record adds `text` (the parsed answer, null when the response held
none). An error record adds `error_code` and `error_message` and never carries
`text`: it cannot be mistaken for an answer. Error codes are the adapters'
`ERROR_CODES` plus the harness's own `HARNESS_ERROR_CODES`:

    AttemptDeadline     the runner abandoned the attempt at the registered deadline
    budget_stop         the hard spending ceiling was crossed while it was under way
    harness_error       the harness itself failed during the attempt
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes, loads_strict, read_bytes, sha256_hex
from harness.meter.cost import COST_STATUSES, Cost
from harness.providers.base import ERROR_CODES, Exchange
from harness.providers.registry import API_SHAPES
from harness.records.plan import PLAN_REQUEST_KIND, PlanCell
from harness.records.usage import CATEGORIES, TokenUsage

__all__ = [
    "ATTEMPTS_SEED_PREFIX",
    "ATTEMPT_ERROR_CODES",
    "ATTEMPT_KIND",
    "HARNESS_ERROR_CODES",
    "PLAN_HEADER_KIND",
    "PLAN_REQUEST_KIND",
    "Plan",
    "PlanRequest",
    "attempt_from_exchange",
    "attempts_seed",
    "decode_response_raw",
    "error_attempt",
    "read_plan",
    "validate_attempt",
]

ATTEMPT_KIND: Final = "model-attempt.v1"
PLAN_HEADER_KIND: Final = "plan-header.v1"
ATTEMPTS_SEED_PREFIX: Final = "proctor-attempts:"
HARNESS_ERROR_CODES: Final = ("AttemptDeadline", "budget_stop", "harness_error")
ATTEMPT_ERROR_CODES: Final = ERROR_CODES + HARNESS_ERROR_CODES
PLAN_SCOPES: Final = ("pilot", "matrix-once", "full")
PLAN_MAX_BYTES: Final = 512 * 1024 * 1024
"""Largest plan read (prompts and bodies of every cell; far above any registered study)."""

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_CHAIN_KEYS: Final = frozenset({"prev", "seed"})
_COMMON: Final = (
    "kind", "run_id", "attempt", "request_sha256", "outcome", "started", "ended", "latency_s",
    "http_status", "response_raw", "response_sha256", "provider_request_id", "model_snapshot",
    "finish_reason", "tokens", "usage_unknown", "cost_usd", "cost_status",
)
_FIELDS: Final = {
    "delivered": frozenset((*_COMMON, "text")),
    "error": frozenset((*_COMMON, "error_code", "error_message")),
}

PathArg = str | os.PathLike[str]


def attempts_seed(study: str, part: str) -> str:
    """The seed of the attempts log of `study`'s stage (or, for a stageless plan, its scope)."""
    return f"{ATTEMPTS_SEED_PREFIX}{study}:{part}"


# --------------------------------------------------------------------------
# Field checks shared by the plan reader and the attempt validator


class _Fields:
    """Typed reads of one JSON object; a problem is `code` naming the line."""

    def __init__(self, obj: Mapping[str, Any], line: int | None, path: str | None, code: str) -> None:
        self.obj, self.line, self.path, self.code = obj, line, path, code

    def bad(self, message: str, code: str | None = None) -> Refusal:
        details: dict[str, Any] = {} if self.line is None else {"line": self.line}
        where = "" if self.line is None else f"line {self.line}: "
        return Refusal(code or self.code, where + message, self.path, **details)

    def keys(self, required: frozenset[str], *, extra_ok: bool = False, ignore: frozenset[str] = frozenset()) -> None:
        keys = set(self.obj) - ignore
        missing, extra = sorted(required - keys), sorted(keys - required)
        if missing:
            raise self.bad(f"missing {', '.join(missing)}")
        if extra and not extra_ok:
            raise self.bad(f"unknown field {', '.join(extra)}")

    def string(self, key: str, *, nullable: bool = False, empty_ok: bool = True) -> str | None:
        value = self.obj[key]
        if value is None and nullable:
            return None
        if not isinstance(value, str) or (not empty_ok and not value):
            kind = "a string" if empty_ok else "a non-empty string"
            raise self.bad(f"{key} must be {kind}{' or null' if nullable else ''}")
        return value

    def text(self, key: str) -> str:
        value = self.string(key, empty_ok=False)
        assert value is not None
        return value

    def integer(self, key: str, *, minimum: int, nullable: bool = False) -> int | None:
        value = self.obj[key]
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.bad(f"{key} must be an integer >= {minimum}{' or null' if nullable else ''}")
        return value

    def count(self, key: str, *, minimum: int = 0) -> int:
        value = self.integer(key, minimum=minimum)
        assert value is not None
        return value

    def number(self, key: str) -> float:
        value = self.obj[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(f"{key} must be a number")
        if not math.isfinite(value) or value < 0:
            raise self.bad(f"{key} must be finite and not negative")
        return float(value)

    def sha(self, key: str, *, nullable: bool = False) -> str | None:
        value = self.obj[key]
        if value is None and nullable:
            return None
        if not isinstance(value, str) or _HEX64.fullmatch(value) is None:
            raise self.bad(f"{key} must be a lowercase sha256 hex digest")
        return value

    def utf8(self, key: str, value: str) -> bytes:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise self.bad(f"{key} holds a lone surrogate and has no UTF-8 bytes") from None


# --------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class PlanRequest(PlanCell):
    """A plan line as read back: the planned cell and the 1-based line it was read from."""

    line: int


_REQUEST_FIELDS: Final = frozenset(
    ("kind", *(f for f in PlanRequest.__dataclass_fields__ if f != "line"))
)
_HEADER_FIELDS: Final = frozenset(("kind", "study", "scope", "seed", "design_sha256", "requests"))


@dataclass(frozen=True)
class Plan:
    """A plan read strictly: `sha256` is of exactly the bytes read; `header` is line 1 as written."""

    path: str
    sha256: str
    header: Mapping[str, Any]
    requests: tuple[PlanRequest, ...]

    @property
    def study(self) -> str:
        return str(self.header["study"])

    @property
    def scope(self) -> str:
        return str(self.header["scope"])

    @cached_property
    def by_run_id(self) -> dict[str, PlanRequest]:
        """The requests by run id."""
        return {r.run_id: r for r in self.requests}

    @cached_property
    def stages(self) -> tuple[str | None, ...]:
        """The stages the requests belong to, in plan order of first appearance."""
        return tuple(dict.fromkeys(r.stage for r in self.requests))

    def attempts_seed(self, stage: str | None = None) -> str:
        """The attempts log seed: of `stage`, else of the plan's only stage, else of its scope."""
        if stage is None and len(self.stages) == 1 and self.stages[0] is not None:
            stage = self.stages[0]
        return attempts_seed(self.study, self.scope if stage is None else stage)


def _plan_line(raw: bytes, lineno: int, path: str) -> dict[str, Any]:
    def bad(message: str) -> Refusal:
        return Refusal("plan_invalid", f"line {lineno}: {message}", path, line=lineno)

    try:
        obj = loads_strict(raw, path=path, expect_object=False)
    except Refusal as exc:
        raise bad(f"{exc.code}: {exc.message}") from None
    if not isinstance(obj, dict):
        raise bad(f"a JSON {type(obj).__name__}, not an object")
    try:
        canonical = canonical_bytes(obj)
    except Refusal as exc:
        raise bad(exc.message) from None
    if canonical != raw:
        raise bad("not in canonical form (sorted keys, compact separators, minimal escapes)")
    return obj


def _plan_header(obj: dict[str, Any], path: str) -> dict[str, Any]:
    f = _Fields(obj, 1, path, code="plan_invalid")
    if obj.get("kind") != PLAN_HEADER_KIND:
        raise f.bad(f"the first line must be a {PLAN_HEADER_KIND} header, found kind {obj.get('kind')!r}")
    f.keys(_HEADER_FIELDS, extra_ok=True)  # the plan may say more about itself
    f.text("study")
    if obj["scope"] not in PLAN_SCOPES:
        raise f.bad(f"scope must be one of {', '.join(PLAN_SCOPES)}")
    if isinstance(obj["seed"], bool) or not isinstance(obj["seed"], int):
        raise f.bad("seed must be an integer")
    f.sha("design_sha256")
    f.count("requests")
    return obj


def _plan_request(obj: dict[str, Any], lineno: int, path: str, study: str) -> PlanRequest:
    f = _Fields(obj, lineno, path, code="plan_invalid")
    if obj.get("kind") != PLAN_REQUEST_KIND:
        raise f.bad(f"expected a {PLAN_REQUEST_KIND} record, found kind {obj.get('kind')!r}")
    f.keys(_REQUEST_FIELDS)
    if f.text("study") != study:
        raise f.bad(f"study {obj['study']!r} is not the header's {study!r}")
    if f.text("api_shape") not in API_SHAPES:
        raise f.bad(f"unknown api_shape {obj['api_shape']!r}")
    prompt, body = f.string("prompt"), f.string("request_body")
    assert prompt is not None and body is not None
    for key, value in (("prompt", prompt), ("request", body)):
        if sha256_hex(f.utf8(key, value)) != f.sha(f"{key}_sha256"):
            raise f.bad(f"{key}_sha256 is not the sha256 of the {key}'s UTF-8 bytes")
    return PlanRequest(
        run_id=f.text("run_id"), study=study, stage=f.string("stage", nullable=True, empty_ok=False),
        system=f.text("system"), provider=f.text("provider"), model=f.text("model"),
        api_model=f.text("api_model"), api_shape=obj["api_shape"], setting=f.text("setting"),
        item=f.text("item"), arm=f.text("arm"), repeat=f.count("repeat"), lane=f.count("lane"),
        lane_position=f.count("lane_position"), arm_position=f.count("arm_position"),
        prompt=prompt, prompt_sha256=obj["prompt_sha256"], request_body=body,
        request_sha256=obj["request_sha256"], line=lineno,
    )


def read_plan(path: PathArg) -> Plan:
    """Read a plan file strictly; any problem is the refusal `plan_invalid` naming its line."""
    p = os.fspath(path)
    raw = read_bytes(p, max_bytes=PLAN_MAX_BYTES)
    if not raw:
        raise Refusal("plan_invalid", "line 1: the plan is empty (no header)", p, line=1)
    lines = raw.split(b"\n")
    if lines[-1]:
        n = len(lines)
        raise Refusal("plan_invalid", f"line {n}: the last line has no newline (torn)", p, line=n)
    lines.pop()
    header = _plan_header(_plan_line(lines[0], 1, p), p)
    requests: list[PlanRequest] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        request = _plan_request(_plan_line(line, lineno, p), lineno, p, header["study"])
        if request.run_id in first_line:
            raise Refusal(
                "plan_invalid",
                f"line {lineno}: run id {request.run_id!r} repeats line {first_line[request.run_id]}",
                p, line=lineno,
            )
        first_line[request.run_id] = lineno
        requests.append(request)
    if header["requests"] != len(requests):
        raise Refusal(
            "plan_invalid",
            f"line 1: the header counts {header['requests']} requests, the plan holds {len(requests)}",
            p, line=1,
        )
    return Plan(p, sha256_hex(raw), header, tuple(requests))


# --------------------------------------------------------------------------
# Attempt records


def _raw_form(data: bytes) -> str | dict[str, str]:
    """Raw bytes as recorded: the text when strict UTF-8, else {"base64": ...}."""
    try:
        return data.decode("utf-8", "strict")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def decode_response_raw(value: Any) -> bytes:
    """The bytes a recorded `response_raw` stands for; ValueError unless it is one canonical form."""
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("response_raw holds a lone surrogate") from None
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            data = base64.b64decode(value["base64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"response_raw is not valid base64: {exc}") from None
        if base64.b64encode(data).decode("ascii") != value["base64"]:
            raise ValueError("response_raw's base64 is not in canonical form")
        if isinstance(_raw_form(data), str):
            raise ValueError("response_raw is UTF-8 text written as base64 (write it as text)")
        return data
    raise ValueError('response_raw must be a string or {"base64": ...}')


def validate_attempt(record: Any, line: int | None, *, path: str | None = None) -> None:
    """Check one `model-attempt.v1` record; a `Refusal` names `line` when given.

    Codes: `attempt_invalid` (shape, types, cost and outcome rules) and
    `attempt_response_hash_mismatch` (`response_sha256` is not the sha256 of
    the bytes `response_raw` stands for). `prev` and `seed`, written by the
    chained log, are allowed.
    """
    if not isinstance(record, Mapping):
        raise _Fields({}, line, path, code="attempt_invalid").bad(f"a {type(record).__name__}, not an object")
    f = _Fields(record, line, path, code="attempt_invalid")
    if record.get("kind") != ATTEMPT_KIND:
        raise f.bad(f"kind must be {ATTEMPT_KIND!r}, found {record.get('kind')!r}")
    outcome = record.get("outcome")
    if not isinstance(outcome, str) or outcome not in _FIELDS:
        raise f.bad(f'outcome must be "delivered" or "error", found {outcome!r}')
    if outcome == "error" and "text" in record:
        raise f.bad("an error record must not carry text (it would look like an answer)")
    f.keys(_FIELDS[outcome], ignore=_CHAIN_KEYS)
    f.text("run_id")
    f.count("attempt", minimum=1)
    f.sha("request_sha256")
    started, ended = f.number("started"), f.number("ended")
    if ended < started:
        raise f.bad("ended is before started")
    f.number("latency_s")
    status = f.integer("http_status", minimum=100, nullable=True)
    if status is not None and status > 599:
        raise f.bad("http_status must be an HTTP status (100-599) or null")
    for key in ("provider_request_id", "model_snapshot", "finish_reason"):
        f.string(key, nullable=True)
    _check_usage_and_cost(f)
    if outcome == "delivered":
        if status is None or not 200 <= status < 300:
            raise f.bad("a delivered response needs a 2xx http_status")
        if record["response_raw"] is None:
            raise f.bad("a delivered record needs its response_raw")
        f.string("text", nullable=True)
    else:
        if record["error_code"] not in ATTEMPT_ERROR_CODES:
            raise f.bad(f"unknown error_code {record['error_code']!r}")
        f.string("error_message")
    raw, digest = record["response_raw"], f.sha("response_sha256", nullable=True)
    if (raw is None) != (digest is None):
        raise f.bad("response_raw and response_sha256 must both be null or both set")
    if raw is not None:
        try:
            data = decode_response_raw(raw)
        except ValueError as exc:
            raise f.bad(str(exc)) from None
        if sha256_hex(data) != digest:
            raise f.bad(
                f"response_sha256 {digest} is not the sha256 of response_raw ({sha256_hex(data)})",
                "attempt_response_hash_mismatch",
            )


def _check_usage_and_cost(f: _Fields) -> None:
    tokens, unknown = f.obj["tokens"], f.obj["usage_unknown"]
    if tokens is not None:
        if not isinstance(tokens, dict) or set(tokens) != set(CATEGORIES):
            raise f.bad(f"tokens must be null or an object of exactly {', '.join(CATEGORIES)}")
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in tokens.values()):
            raise f.bad("token counts must be integers >= 0")
    if not isinstance(unknown, bool) or unknown != (tokens is None):
        raise f.bad("usage_unknown must be a boolean, true exactly when tokens is null")
    cost, status = f.obj["cost_usd"], f.obj["cost_status"]
    if status not in COST_STATUSES:
        raise f.bad(f"cost_status must be one of {', '.join(COST_STATUSES)}")
    if cost == "unknown":
        if status == "metered":
            raise f.bad('cost_usd "unknown" needs a cost_status saying why')
    else:
        f.number("cost_usd")
        if status != "metered":
            raise f.bad(f'a {status} cost must be "unknown", never a number')
    if (status == "usage_unknown") != unknown:
        raise f.bad("cost_status usage_unknown goes exactly with unknown usage")


def _record(
    request: PlanRequest,
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
) -> dict[str, Any]:
    return {
        "kind": ATTEMPT_KIND,
        "run_id": request.run_id,
        "attempt": attempt_no,
        "request_sha256": request.request_sha256,
        "started": started,
        "ended": ended,
        "latency_s": latency_s,
        "http_status": http_status,
        "response_raw": None if response_raw is None else _raw_form(response_raw),
        "response_sha256": response_sha256,
        "provider_request_id": provider_request_id,
        "model_snapshot": model_snapshot,
        "finish_reason": finish_reason,
        "tokens": None if usage is None else usage.to_json(),
        "usage_unknown": usage is None,
        "cost_usd": "unknown" if cost.total is None else cost.total,
        "cost_status": cost.status,
    }


def attempt_from_exchange(
    plan_request: PlanRequest, attempt_no: int, exchange: Exchange, cost: Cost
) -> dict[str, Any]:
    """The record of one exchange: delivered when the adapter parsed it as usable, else an error.

    Args:
        plan_request: the plan's cell the request was sent for.
        attempt_no: the attempt number (1-based) the schedule asked for.
        exchange: what the transport returned; its body must be the plan's exact bytes.
        cost: `meter(exchange.parsed.usage, price)` (unknown stays "unknown").

    Raises:
        Refusal: `attempt_request_changed` when the body sent is not the plan's;
            `attempt_invalid` when the record would not pass `validate_attempt`.
    """
    sent = exchange.request
    if sent.body_sha256 != plan_request.request_sha256 or sha256_hex(sent.body) != sent.body_sha256:
        raise Refusal(
            "attempt_request_changed",
            f"run {plan_request.run_id}: the body sent ({sha256_hex(sent.body)}) is not the plan's "
            f"({plan_request.request_sha256})",
            run_id=plan_request.run_id,
        )
    parsed = exchange.parsed
    came_back = exchange.status is not None or bool(exchange.raw_response)
    record = _record(
        plan_request, attempt_no, started=exchange.started, ended=exchange.ended,
        latency_s=exchange.latency_s, http_status=exchange.status,
        response_raw=exchange.raw_response if came_back else None,
        response_sha256=exchange.response_sha256 if came_back else None,
        provider_request_id=parsed.request_id, model_snapshot=parsed.model_snapshot,
        finish_reason=parsed.finish_reason, usage=parsed.usage, cost=cost,
    )
    if parsed.ok:
        record.update(outcome="delivered", text=parsed.text)
    else:
        code = str(parsed.error_code)
        record.update(outcome="error", error_code=code, error_message=parsed.error_message or code)
    validate_attempt(record, None)
    return record


def error_attempt(
    plan_request: PlanRequest,
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
    record = _record(
        plan_request, attempt_no, started=started, ended=ended, latency_s=ended - started,
        http_status=http_status, response_raw=response_raw,
        response_sha256=None if response_raw is None else sha256_hex(response_raw),
        provider_request_id=provider_request_id, model_snapshot=model_snapshot,
        finish_reason=finish_reason, usage=usage, cost=cost,
    )
    record.update(outcome="error", error_code=error_code, error_message=error_message)
    validate_attempt(record, None)
    return record
