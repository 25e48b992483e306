"""One stable classification of provider error responses into `ERROR_CODES`.

The mapping, in the order the rules are tried (the first that matches wins):

1. content_filter: a content-policy code (`content_filter`,
   `content_policy_violation`, `invalid_prompt`, Azure's
   `ResponsibleAIPolicyViolation`) or policy wording, on a 2xx/4xx.
2. billing: HTTP 402; Anthropic `billing_error`; OpenAI
   `billing_hard_limit_reached`/`billing_not_active`; wording such as "credit
   balance is too low" (Anthropic sends that as a 400) or "enable billing".
3. quota: OpenAI `insufficient_quota`, or the adapter's own `quota_rule`
   (Gemini's: `RESOURCE_EXHAUSTED` when the exhausted quota is a daily one).
   A quota does not come back by waiting a minute; a rate limit does.
4. auth: HTTP 401/403; `authentication_error`, `permission_error`,
   `invalid_api_key`, Gemini `API_KEY_INVALID` (Gemini sends that as a 400).
5. rate_limited: HTTP 429 (Gemini's per-minute `RESOURCE_EXHAUSTED` too).
6. server_error: HTTP 5xx, Anthropic 529 `overloaded_error`, HTTP 408 (the
   server gave up waiting: not the request's fault), error codes such as
   `server_error`/`api_error`/`INTERNAL`/`UNAVAILABLE`.
7. context_length: HTTP 413 (the request is too large to be accepted at all),
   or a 4xx whose code or wording says the prompt does not fit the context
   (`context_length_exceeded`, "prompt is too long", "exceeds the maximum
   number of tokens", "maximum context length", llama.cpp's
   `exceed_context_size_error`).
8. bad_request: any other 4xx, and 3xx (redirects are never followed, so the
   configured URL is wrong).
9. server_error: anything else (including an error body inside a 2xx).

A 2xx body that carries an error object with a numeric HTTP code (OpenRouter,
Gemini) is classified as if that code had been the status.

Messages are at most 500 characters and key-like tokens (`sk-...`,
`AIza...`) are masked; the transport also scrubs the exact credential.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from harness.providers.base import ParsedResponse
from harness.providers.common import failure, truncate
from harness.records.usage import TokenUsage

__all__ = ["QuotaRule", "classify_error", "error_response", "mask_keys"]

QuotaRule = Callable[[set[str], str], bool]
"""An adapter's extra quota test: (lower-cased codes and types, lower-cased body text) -> is a quota."""

_CONTENT_CODES: Final = frozenset(
    {"content_filter", "content_policy_violation", "invalid_prompt", "responsibleaipolicyviolation"}
)
_CONTENT_WORDS: Final = (
    "content management policy",
    "flagged as potentially violating",
    "violating our usage policy",
    "content_policy",
)
_BILLING_CODES: Final = frozenset({"billing_error", "billing_hard_limit_reached", "billing_not_active"})
_BILLING_WORDS: Final = (
    "credit balance is too low",
    "insufficient balance",
    "insufficient credits",
    "enable billing",
    "payment required",
)
_QUOTA_CODES: Final = frozenset({"insufficient_quota"})
_AUTH_CODES: Final = frozenset(
    {
        "authentication_error",
        "permission_error",
        "invalid_api_key",
        "api_key_invalid",
        "unauthenticated",
        "permission_denied",
    }
)
_AUTH_WORDS: Final = ("api key not valid", "invalid api key", "incorrect api key", "invalid x-api-key")
_RATE_CODES: Final = frozenset({"rate_limit_exceeded", "rate_limit_error", "resource_exhausted"})
_SERVER_CODES: Final = frozenset(
    {"server_error", "api_error", "overloaded_error", "internal", "internal_error", "unavailable", "deadline_exceeded"}
)
_CONTEXT_CODES: Final = frozenset({"context_length_exceeded", "exceed_context_size_error", "request_too_large"})
_CONTEXT_WORDS: Final = (
    "context_length_exceeded",
    "prompt is too long",
    "exceeds the maximum number of tokens",
    "maximum context length",
    "context length exceeded",
    "exceed context limit",
    "exceeds the available context size",
    "exceeds the context window",
)
_KEYLIKE = re.compile(r"\b(sk-[A-Za-z0-9_\-]{6})[A-Za-z0-9_\-*]{2,}|\b(AIza)[0-9A-Za-z_\-]{20,}")


def mask_keys(text: str) -> str:
    """`text` with API-key-like tokens cut to a short prefix (defence in depth: never a whole key)."""
    return _KEYLIKE.sub(lambda m: f"{m.group(1) or m.group(2)}[masked]", text)


def _error_object(body: Any) -> Any:
    """The error object inside an error body, whatever the vendor nests it in."""
    if isinstance(body, list) and body:  # Gemini sometimes wraps the error in a one-element array
        body = body[0]
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, (Mapping, str)):
            return inner
    return body


def _fields(body: Any) -> tuple[str, set[str], int | None, str]:
    """(message, lower-cased codes and types, embedded numeric code, lower-cased text to search)."""
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        return " ".join(body.split()), set(), None, body.lower()
    err = _error_object(body)
    marks: set[str] = set()
    numeric: int | None = None
    message = ""
    if isinstance(err, str):
        message = err
    elif isinstance(err, Mapping):
        for key in ("type", "code", "status"):
            value = err.get(key)
            if isinstance(value, str):
                marks.add(value.lower())
            elif isinstance(value, int) and not isinstance(value, bool):
                numeric = value
        details = err.get("details")
        for detail in details if isinstance(details, list) else ():
            if isinstance(detail, Mapping) and isinstance(detail.get("reason"), str):
                marks.add(detail["reason"].lower())
        inner = err.get("innererror")
        if isinstance(inner, Mapping) and isinstance(inner.get("code"), str):
            marks.add(inner["code"].lower())
        for key in ("message", "detail"):
            if isinstance(err.get(key), str):
                message = err[key]
                break
    if isinstance(body, Mapping) and body.get("type") == "error" and isinstance(err, Mapping):
        marks.add("anthropic_error")
    try:
        blob = json.dumps(body, ensure_ascii=False, default=str).lower()
    except (TypeError, ValueError):  # a value JSON cannot hold: search the repr instead
        blob = repr(body).lower()
    return " ".join(message.split()), marks, numeric, blob


def _code(status: int, marks: set[str], blob: str, quota_rule: QuotaRule | None) -> str:
    if status < 500 and status not in (401, 403, 429) and (
        marks & _CONTENT_CODES or any(w in blob for w in _CONTENT_WORDS)
    ):
        return "content_filter"
    if status == 402 or marks & _BILLING_CODES or any(w in blob for w in _BILLING_WORDS):
        return "billing"
    if marks & _QUOTA_CODES or (quota_rule is not None and quota_rule(marks, blob)):
        return "quota"
    if status in (401, 403) or (status < 500 and (marks & _AUTH_CODES or any(w in blob for w in _AUTH_WORDS))):
        return "auth"
    if status == 429 or marks & _RATE_CODES:
        return "rate_limited"
    if status >= 500 or status == 408 or marks & _SERVER_CODES:
        return "server_error"
    if status == 413 or (
        400 <= status < 500 and (marks & _CONTEXT_CODES or any(w in blob for w in _CONTEXT_WORDS))
    ):
        return "context_length"
    if 300 <= status < 500:
        return "bad_request"
    return "server_error"


def classify_error(status: int, body: Any, *, quota_rule: QuotaRule | None = None) -> tuple[str, str]:
    """The stable error code and a short message for an error response.

    Args:
        status: the HTTP status.
        body: the decoded JSON body, or the raw bytes/text when it was not JSON.
        quota_rule: the adapter's own quota test (vendor details differ), if any.

    Returns:
        `(error_code, message)`: a code from `ERROR_CODES` and at most 500
        characters saying what the provider said.
    """
    message, marks, numeric, blob = _fields(body)
    effective = status
    if 200 <= status < 300 and numeric is not None and 400 <= numeric < 600:
        effective = numeric
    code = _code(effective, marks, blob, quota_rule)
    kinds = sorted(m for m in marks if m != "anthropic_error")
    head = f"HTTP {status}" + (f" ({', '.join(kinds)})" if kinds else "")
    if not message:
        message = "error body without a message" if isinstance(body, Mapping) else "no JSON error body"
    return code, truncate(mask_keys(f"{head}: {message}"))


def error_response(
    status: int,
    body: Any,
    *,
    classify: Callable[[int, Any], tuple[str, str]],
    usage_of: Callable[[Any], TokenUsage | None],
    request_id: str | None = None,
    model_snapshot: str | None = None,
) -> ParsedResponse:
    """A `ParsedResponse` for an error response, classified and its usage read by the adapter's own
    hooks (usage kept when the body still reports it)."""
    code, message = classify(status, body)
    usage = usage_of(body) if isinstance(body, Mapping) else None
    return failure(code, message, request_id=request_id, model_snapshot=model_snapshot, usage=usage)
