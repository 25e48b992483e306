"""The attempt record (`model-attempt.v1`): one request sent, or abandoned, for one run id.

An attempt is appended to its stage's chained attempts log and never rewritten.
A delivered record adds `text`; an error record adds `error_code` and
`error_message` and never `text`. A run's attempt adds `rerun`. An error whose
request never left (connection refused, DNS or TLS failure: the transport's
`meta["sent"]` is False) adds `"sent": false` and costs exactly $0 with zero
tokens (`NOT_SENT_CODES`); without `sent` a request was sent. The record's
vocabulary (token categories, cost statuses, error codes) is declared here.
See docs/records.md.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code
from harness.evidence.jsonio import sha256_hex
from harness.records._shape import CHAIN_KEYS, Fields, refusal
from harness.records.usage import CATEGORIES
from harness.records.work import AttemptWork

__all__ = [
    "ATTEMPT_ERROR_CODES", "ATTEMPT_KIND", "COST_STATUSES", "HARNESS_ERROR_CODES", "NOT_SENT_CODES",
    "PROVIDER_ERROR_CODES", "TOKEN_CATEGORIES", "Attempt", "decode_response_raw", "raw_form", "validate_attempt",
    "validate_run_attempt",
]

ATTEMPT_KIND: Final = "model-attempt.v1"
TOKEN_CATEGORIES: Final = CATEGORIES
COST_STATUSES: Final = ("metered", "usage_unknown", "price_unknown")
PROVIDER_ERROR_CODES: Final = (
    "transport", "timeout", "rate_limited", "server_error", "auth", "billing", "quota", "bad_request",
    "context_length", "content_filter", "malformed_response",
)
"""The adapters' error codes (`harness.providers.base.ERROR_CODES`)."""
HARNESS_ERROR_CODES: Final = ("AttemptDeadline", "budget_stop", "harness_error", "runner_lost")
"""`runner_lost`: the runner died after an attempt's intent was written and before its outcome was;
resolved on resume (class provider, retried as a transport failure; docs/run.md)."""
ATTEMPT_ERROR_CODES: Final = PROVIDER_ERROR_CODES + HARNESS_ERROR_CODES
NOT_SENT_CODES: Final = ("transport", "timeout")
"""The error codes an attempt whose request never left (`"sent": false`) may carry."""

@dataclass(frozen=True)
class Attempt:
    """One `model-attempt.v1` record; `text` only when delivered, `error_*` only when an error."""

    run_id: str
    attempt: int
    request_sha256: str
    outcome: str
    started: float
    ended: float
    latency_s: float
    http_status: int | None
    response_raw: str | Mapping[str, str] | None
    response_sha256: str | None
    provider_request_id: str | None
    model_snapshot: str | None
    finish_reason: str | None
    tokens: Mapping[str, int] | None
    usage_unknown: bool
    cost_usd: float | str
    cost_status: str
    text: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    rerun: int | None = field(default=None)
    sent: bool | None = field(default=None)
    work: Mapping[str, Any] | None = field(default=None)
    """A repository-task attempt's work (`harness.records.work.AttemptWork`): the gated path's run in
    place of one HTTP response (no http_status, no response_raw). Absent from completion attempts."""

    def to_json(self) -> dict[str, Any]:
        """The record as written: `text` or `error_code`/`error_message` by outcome; `rerun` when set."""
        out: dict[str, Any] = {"kind": ATTEMPT_KIND}
        for name in _COMMON[1:]:
            value = getattr(self, name)
            out[name] = dict(value) if isinstance(value, Mapping) else value
        if self.outcome == "delivered":
            out["text"] = self.text
        else:
            out["error_code"], out["error_message"] = self.error_code, self.error_message
        if self.rerun is not None:
            out["rerun"] = self.rerun
        if self.sent is False:
            out["sent"] = False
        if self.work is not None:
            out["work"] = dict(self.work)
        return out

    @classmethod
    def from_json(cls, obj: Any, *, path: str | None = None, line: int | None = None,
                  reruns: int | None = None) -> Attempt:
        """A record checked strictly (`validate_attempt`; with `reruns`, `validate_run_attempt`)."""
        if reruns is None:
            validate_attempt(obj, line, path=path)
        else:
            validate_run_attempt(obj, line, reruns=reruns, path=path)
        body = {k: v for k, v in obj.items() if k not in CHAIN_KEYS and k != "kind"}
        return cls(**body)


_COMMON: Final = ("kind", *(n for n in Attempt.__dataclass_fields__
                            if n not in ("text", "error_code", "error_message", "rerun", "sent", "work")))
"""The keys of every attempt record (the fields of `Attempt` but those of one outcome, `rerun` and `sent`)."""
_FIELDS: Final = {
    "delivered": frozenset((*_COMMON, "text")),
    "error": frozenset((*_COMMON, "error_code", "error_message")),
}


def raw_form(data: bytes) -> str | dict[str, str]:
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
        if isinstance(raw_form(data), str):
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
        raise Fields({}, line, path, code=Code.ATTEMPT_INVALID).bad(f"a {type(record).__name__}, not an object")
    f = Fields(record, line, path, code=Code.ATTEMPT_INVALID)
    if record.get("kind") != ATTEMPT_KIND:
        raise f.bad(f"kind must be {ATTEMPT_KIND!r}, found {record.get('kind')!r}")
    outcome = record.get("outcome")
    if not isinstance(outcome, str) or outcome not in _FIELDS:
        raise f.bad(f'outcome must be "delivered" or "error", found {outcome!r}')
    if outcome == "error" and "text" in record:
        raise f.bad("an error record must not carry text (it would look like an answer)")
    f.keys(_FIELDS[outcome], ignore=CHAIN_KEYS | frozenset({"sent"} if outcome == "error" else ()) | {"work"})
    work = "work" in record
    if work:
        if not isinstance(record["work"], Mapping):
            raise f.bad("work must be an object")
        AttemptWork.from_json(record["work"], path=path, line=line)
        if record.get("http_status") is not None or record.get("response_raw") is not None or "sent" in record:
            raise f.bad("a repository-task attempt (work) has no http_status, response_raw or sent")
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
    if outcome == "delivered" and not work:
        if status is None or not 200 <= status < 300:
            raise f.bad("a delivered response needs a 2xx http_status")
        if record["response_raw"] is None:
            raise f.bad("a delivered record needs its response_raw")
    if outcome == "delivered":
        f.string("text", nullable=True)
    else:
        if record["error_code"] not in ATTEMPT_ERROR_CODES:
            raise f.bad(f"unknown error_code {record['error_code']!r}")
        f.string("error_message")
        if "sent" in record:
            _check_not_sent(f)
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
                Code.ATTEMPT_RESPONSE_HASH_MISMATCH,
            )


def _check_not_sent(f: Fields) -> None:
    """`"sent": false`: a transport failure before the request left, which costs exactly $0."""
    record = f.obj
    if record["sent"] is not False:
        raise f.bad('sent is written only as false (the request never left); a sent request has no "sent"')
    if record["error_code"] not in NOT_SENT_CODES:
        raise f.bad(f"an unsent request fails with {' or '.join(NOT_SENT_CODES)}, not {record['error_code']!r}")
    if record["http_status"] is not None or record["response_raw"] is not None:
        raise f.bad("an unsent request has no http_status and no response")
    tokens = record["tokens"]
    if (record["cost_status"] != "metered" or record["cost_usd"] != 0 or not isinstance(tokens, dict)
            or any(tokens.values())):
        raise f.bad("an unsent request costs exactly 0 (metered, zero tokens)")


def _check_usage_and_cost(f: Fields) -> None:
    tokens, unknown = f.obj["tokens"], f.obj["usage_unknown"]
    if tokens is not None:
        if not isinstance(tokens, dict) or set(tokens) != set(TOKEN_CATEGORIES):
            raise f.bad(f"tokens must be null or an object of exactly {', '.join(TOKEN_CATEGORIES)}")
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


def validate_run_attempt(record: Any, line: int | None, *, reruns: int, path: str | None = None) -> None:
    """A `model-attempt.v1` record of a run: `rerun` in 0..reruns, the rest as `validate_attempt`."""
    if isinstance(record, Mapping) and "rerun" in record:
        rerun = record["rerun"]
        if isinstance(rerun, bool) or not isinstance(rerun, int) or not 0 <= rerun <= reruns:
            raise refusal(Code.ATTEMPT_INVALID, f"rerun must be an integer 0..{reruns}", path, line)
        record = {k: v for k, v in record.items() if k != "rerun"}
    else:
        raise refusal(Code.ATTEMPT_INVALID, "missing rerun", path, line)
    validate_attempt(record, line, path=path)
