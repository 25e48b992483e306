"""The OpenAI Responses API.

Request: `POST {base_url}/responses`, `Authorization: Bearer <key>`,
canonical JSON with exactly these fields:

- `model`, `input`: one user message with the prompt; `instructions` only
  when `settings.system` is set.
- `max_output_tokens`, `temperature` (0..2), `top_p` (0..1): only when set.
- `reasoning: {"effort": ...}` from `reasoning_effort` (OpenAI's enum:
  `none`, `minimal`, `low`, `medium`, `high`, `xhigh`).
- `seed` is refused (`setting_unsupported`): the Responses API has no seed.
- `store` is not sent, so the provider's default applies.

Response: text is every `output_text` part of every `message` item, joined.
The API has no finish reason; the provider's own strings stand in for it:
`incomplete_details.reason` when `status` is `incomplete` (e.g.
`max_output_tokens`, `content_filter`), else `status` (`completed`). A
`failed` status is classified from its `error` object. A `refusal` part or a
`content_filter` reason is `content_filter`. The request id is the body's
`id`, else the `x-request-id` header.

Metering (the wire log's view, from the bytes alone): the path ends in
`/responses`; usage is `usage.input_tokens` (of which
`input_tokens_details.cached_tokens` cached) and `output_tokens` (of which
`output_tokens_details.reasoning_tokens` reasoning). A stream reports usage
in the `response` object of the last event carrying one with usage
(`response.completed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from harness.providers import usage as u
from harness.providers.base import Described, GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.common import (
    check_model,
    decode_json,
    failure,
    header,
    lower_headers,
    make_request,
    refuse_unsupported,
    str_or_none,
    string_or_none,
    url_base,
    valid_settings,
)
from harness.providers.errors import classify_error as classify
from harness.providers.errors import error_response
from harness.providers.streams import body_asks_stream, fold_stream
from harness.records.usage import TokenUsage

__all__ = [
    "API_SHAPE",
    "FREE_PATH_SUFFIXES",
    "REASONING_EFFORTS",
    "build_request",
    "classify_error",
    "describe",
    "describe_stream",
    "model_from_path",
    "parse_response",
    "parse_usage",
    "request_streams",
    "serves_path",
]

API_SHAPE: Final = "openai_responses"
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh")


def build_request(model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
    """The exact Responses request for one user message."""
    s = valid_settings(API_SHAPE, settings, max_temperature=2.0)
    if s.seed is not None:
        raise refuse_unsupported(API_SHAPE, "seed", "the Responses API takes no seed")
    body: dict[str, Any] = {"model": check_model(model), "input": [{"role": "user", "content": prompt}]}
    if s.system is not None:
        body["instructions"] = s.system
    if s.max_output_tokens is not None:
        body["max_output_tokens"] = s.max_output_tokens
    if s.temperature is not None:
        body["temperature"] = s.temperature
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.reasoning_effort is not None:
        if s.reasoning_effort not in REASONING_EFFORTS:
            raise refuse_unsupported(API_SHAPE, "reasoning_effort", f"one of {', '.join(REASONING_EFFORTS)}")
        body["reasoning"] = {"effort": s.reasoning_effort}
    url = f"{url_base(base_url)}/responses"
    return make_request(API_SHAPE, model, url, body, (), "Authorization", "Bearer ")


def _read_output(output: list[Any]) -> tuple[str | None, str | None, bool]:
    """(joined output text, refusal text, whether every message item was readable)."""
    texts: list[str] = []
    refusals: list[str] = []
    for item in output:
        if not isinstance(item, Mapping):
            return None, None, False
        if item.get("type") != "message":
            continue  # reasoning summaries and other items are not the answer
        content = item.get("content")
        if not isinstance(content, list):
            return None, None, False
        for part in content:
            if not isinstance(part, Mapping):
                return None, None, False
            kind = part.get("type")
            if kind not in ("output_text", "refusal"):
                continue
            value = part.get("text" if kind == "output_text" else "refusal")
            if not isinstance(value, str):
                return None, None, False
            (texts if kind == "output_text" else refusals).append(value)
    return ("".join(texts) if texts else None), ("\n".join(refusals) if refusals else None), True


def parse_response(status: int, headers: Mapping[str, str], raw: bytes) -> ParsedResponse:
    """Read a raw Responses API response; errors come back as data, never raised."""
    h = lower_headers(headers)
    body, why = decode_json(raw)
    obj = body if isinstance(body, Mapping) else {}
    request_id = string_or_none(obj.get("id")) or header(h, "x-request-id")
    model = string_or_none(obj.get("model"))
    state = obj.get("status")
    if not 200 <= status < 300 or (obj.get("error") is not None and ("output" not in obj or state == "failed")):
        return error_response(
            status,
            raw if why else body,
            classify=classify_error,
            usage_of=parse_usage,
            request_id=request_id,
            model_snapshot=model,
        )
    if why is not None:
        return failure("malformed_response", why, request_id=request_id)
    if not isinstance(body, Mapping):
        return failure("malformed_response", "response body is not a JSON object", request_id=request_id)
    output = body.get("output")
    usage = parse_usage(body)
    text, refusal, readable = _read_output(output) if isinstance(output, list) else (None, None, False)
    details = body.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    finish = reason if state == "incomplete" and isinstance(reason, str) else state
    if not readable or not (finish is None or isinstance(finish, str)):
        return failure(
            "malformed_response",
            "response has no readable output list or status",
            request_id=request_id,
            model_snapshot=model,
            usage=usage,
        )
    if state == "failed":
        return failure("server_error", "status failed without an error object", request_id=request_id, usage=usage)
    if finish == "content_filter" or refusal is not None:
        return failure(
            "content_filter",
            f"refusal: {refusal}" if refusal is not None else "incomplete: content_filter",
            text=text,
            finish_reason=finish,
            model_snapshot=model,
            request_id=request_id,
            usage=usage,
        )
    return ParsedResponse(text=text, finish_reason=finish, model_snapshot=model, request_id=request_id, usage=usage)


# ---- metering: what the wire log reads from an exchange of this shape

FREE_PATH_SUFFIXES: Final[tuple[str, ...]] = ()


def parse_usage(body: Any) -> TokenUsage | None:
    """The usage in a decoded response body, or None when unknown."""
    usage = u.get(body, "usage")
    return u.split(
        u.count(u.get(usage, "input_tokens")),
        u.optional(usage, "input_tokens_details", "cached_tokens"),
        u.count(u.get(usage, "output_tokens")),
        u.optional(usage, "output_tokens_details", "reasoning_tokens"),
    )


def classify_error(status: int, body: Any) -> tuple[str, str]:
    """The stable error code and a short message for an error response (`harness.providers.errors`)."""
    return classify(status, body)


def describe(doc: Mapping[str, Any]) -> Described:
    """Usage, finish reason (`incomplete_details.reason`, else `status`), model snapshot and request id."""
    details = doc.get("incomplete_details")
    if isinstance(details, dict) and isinstance(details.get("reason"), str):
        finish: str | None = str(details["reason"])
    else:
        finish = str_or_none(doc.get("status"))
    return Described(parse_usage(doc), finish, str_or_none(doc.get("model")), str_or_none(doc.get("id")), True)


def describe_stream(docs: list[dict[str, Any]]) -> Described:
    """A stream's events: each event's `response` object; usage from the last one carrying it."""
    return fold_stream(docs, describe, usage_key="usage", body_of=lambda doc: doc.get("response"))


def serves_path(path: str) -> bool:
    """Whether a request path (no query, no trailing slash) is this shape's endpoint."""
    return path.endswith("/responses")


def request_streams(url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response."""
    del url
    return body_asks_stream(body)


def model_from_path(path: str) -> str | None:
    """The model a request path names: none (it is in the body)."""
    del path
    return None
