"""The Anthropic Messages API.

Request: `POST {base_url}/messages`, `x-api-key: <key>`,
`anthropic-version: 2023-06-01`, canonical JSON with exactly these fields:

- `model`, `messages`: one user message with the prompt; `system` (a
  string) only when `settings.system` is set.
- `max_tokens`: always sent, because the Messages API requires it; from
  `max_output_tokens`, else `DEFAULT_MAX_TOKENS` (1024). A preregistration
  that cares should set it.
- `temperature` (0..1 here), `top_p` (0..1): only when set. (Some newer
  models refuse both together; that 400 is the provider's answer.)
- `output_config: {"effort": ...}` from `reasoning_effort`: Anthropic's own
  effort parameter (`low`, `medium`, `high`, `xhigh`, `max`), which governs
  how many tokens the model spends. It does not switch extended thinking on
  (no `thinking` block is sent: a thinking budget is a token count, and an
  effort word has no published translation into one). Other words, such as
  `none` or `minimal`, are refused; models without effort support answer
  400 (`bad_request`).
- `seed` is refused (`setting_unsupported`): the Messages API has no seed.

Response: text is every `text` content block, joined (thinking blocks are
not the answer). The finish reason is the provider's own `stop_reason`;
`refusal` is `content_filter`. The request id is the `request-id` header,
else the body's `id` (or `request_id` on an error body).

Metering (the wire log's view, from the bytes alone): the path ends in
`/messages`; usage is `usage.input_tokens` (fresh), `cache_read_input_tokens`
(cached), `cache_creation_input_tokens` (cache writes) and `output_tokens`.
A stream's usage is `message_start`'s usage updated by the last
`message_delta` usage (a stream without a `message_delta` is unknown).
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
from harness.providers.streams import body_asks_stream
from harness.records.usage import TokenUsage

__all__ = [
    "ANTHROPIC_VERSION",
    "API_SHAPE",
    "DEFAULT_MAX_TOKENS",
    "EFFORTS",
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

API_SHAPE: Final = "anthropic_messages"
ANTHROPIC_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 1024
"""`max_tokens` sent when the settings leave it unset (the API requires one)."""
EFFORTS: Final = ("low", "medium", "high", "xhigh", "max")


def build_request(model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
    """The exact Messages request for one user message."""
    s = valid_settings(API_SHAPE, settings, max_temperature=1.0)
    if s.seed is not None:
        raise refuse_unsupported(API_SHAPE, "seed", "the Messages API takes no seed")
    max_tokens = DEFAULT_MAX_TOKENS if s.max_output_tokens is None else s.max_output_tokens
    body: dict[str, Any] = {
        "model": check_model(model),
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }
    if s.system is not None:
        body["system"] = s.system
    if s.temperature is not None:
        body["temperature"] = s.temperature
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.reasoning_effort is not None:
        if s.reasoning_effort not in EFFORTS:
            raise refuse_unsupported(
                API_SHAPE, "reasoning_effort", f"Anthropic's effort is one of {', '.join(EFFORTS)}"
            )
        body["output_config"] = {"effort": s.reasoning_effort}
    url = f"{url_base(base_url)}/messages"
    return make_request(API_SHAPE, model, url, body, (("anthropic-version", ANTHROPIC_VERSION),), "x-api-key")


def _text(content: list[Any]) -> tuple[str | None, bool]:
    """(joined text blocks or None when there are none, whether every block was readable)."""
    texts: list[str] = []
    for block in content:
        if not isinstance(block, Mapping):
            return None, False
        if block.get("type") == "text":
            if not isinstance(block.get("text"), str):
                return None, False
            texts.append(block["text"])
    return ("".join(texts) if texts else None), True


def parse_response(status: int, headers: Mapping[str, str], raw: bytes) -> ParsedResponse:
    """Read a raw Messages response; errors come back as data, never raised."""
    h = lower_headers(headers)
    body, why = decode_json(raw)
    obj = body if isinstance(body, Mapping) else {}
    request_id = header(h, "request-id") or string_or_none(obj.get("id")) or string_or_none(obj.get("request_id"))
    model = string_or_none(obj.get("model"))
    if not 200 <= status < 300 or obj.get("type") == "error":
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
    content = body.get("content")
    finish = body.get("stop_reason")
    usage = parse_usage(body)
    text, readable = _text(content) if isinstance(content, list) else (None, False)
    if not readable or not (finish is None or isinstance(finish, str)):
        return failure(
            "malformed_response",
            "response has no readable content list or stop_reason",
            request_id=request_id,
            model_snapshot=model,
            usage=usage,
        )
    if finish == "refusal":
        return failure(
            "content_filter",
            "stop_reason refusal",
            text=text,
            finish_reason=finish,
            model_snapshot=model,
            request_id=request_id,
            usage=usage,
        )
    return ParsedResponse(text=text, finish_reason=finish, model_snapshot=model, request_id=request_id, usage=usage)


# ---- metering: what the wire log reads from an exchange of this shape

FREE_PATH_SUFFIXES: Final[tuple[str, ...]] = ("/count_tokens",)
"""Token-counting endpoints (`/messages/count_tokens`): free, so never metered."""


def parse_usage(body: Any) -> TokenUsage | None:
    """The usage in a decoded response body, or None when unknown."""
    usage = u.get(body, "usage")
    fresh, out = u.count(u.get(usage, "input_tokens")), u.count(u.get(usage, "output_tokens"))
    read, write = u.optional(usage, "cache_read_input_tokens"), u.optional(usage, "cache_creation_input_tokens")
    if fresh is None or out is None or read is None or write is None:
        return None
    return TokenUsage(input=fresh, cached_input=read, cache_write=write, output=out)


def classify_error(status: int, body: Any) -> tuple[str, str]:
    """The stable error code and a short message for an error response (`harness.providers.errors`)."""
    return classify(status, body)


def describe(doc: Mapping[str, Any]) -> Described:
    """Usage, finish reason (`stop_reason`), model snapshot and request id of a decoded response body."""
    snapshot, request_id = str_or_none(doc.get("model")), str_or_none(doc.get("id"))
    return Described(parse_usage(doc), str_or_none(doc.get("stop_reason")), snapshot, request_id, True)


def describe_stream(docs: list[dict[str, Any]]) -> Described:
    """A stream's events: `message_start` then `message_delta` updates (usage unknown without one)."""
    merged: dict[str, Any] | None = None
    saw_delta = False
    finish = snapshot = request_id = None
    for doc in docs:
        if doc.get("type") == "message_start" and isinstance(doc.get("message"), dict):
            message = doc["message"]
            snapshot, request_id = str_or_none(message.get("model")), str_or_none(message.get("id"))
            if isinstance(message.get("usage"), dict):
                merged = dict(message["usage"])
        elif doc.get("type") == "message_delta" and merged is not None:
            if isinstance(doc.get("usage"), dict):
                merged.update(doc["usage"])
                saw_delta = True
            delta = doc.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                finish = str(delta["stop_reason"])
    usage = parse_usage({"usage": merged}) if saw_delta else None
    return Described(usage, finish, snapshot, request_id, True)


def serves_path(path: str) -> bool:
    """Whether a request path (no query, no trailing slash) is this shape's endpoint."""
    return path.endswith("/messages")


def request_streams(url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response."""
    del url
    return body_asks_stream(body)


def model_from_path(path: str) -> str | None:
    """The model a request path names: none (it is in the body)."""
    del path
    return None
