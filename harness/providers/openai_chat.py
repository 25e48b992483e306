"""OpenAI Chat Completions, which every OpenAI-compatible server speaks (vLLM, llama.cpp, Ollama, ...).

Request: `POST {base_url}/chat/completions`, `Authorization: Bearer <key>`,
canonical JSON with exactly these fields:

- `model`, `messages`: a system message only when `settings.system` is set,
  then one user message with the prompt.
- `max_tokens` from `max_output_tokens`: the field OpenAI-compatible servers
  (llama.cpp, vLLM, Ollama, DeepSeek, Together) all read. OpenAI's own
  reasoning models (o-series, gpt-5) refuse it and want
  `max_completion_tokens` (a 400 -> `bad_request`); use the Responses shape
  for those, or leave `max_output_tokens` unset.
- `temperature` (0..2), `top_p` (0..1), `seed`: only when set.
- `reasoning_effort`: passed through as OpenAI's own enum (`none`, `minimal`,
  `low`, `medium`, `high`, `xhigh`); the server decides which a model takes.

Response: text is `choices[0].message.content`; the finish reason is the
provider's own `finish_reason` string; `content_filter` or a `refusal` in the
message is `content_filter` (text and usage kept: the tokens were billed).
The request id is the body's `id`, else the `x-request-id` header.

Metering (the wire log's view, from the bytes alone): the path ends in
`/chat/completions`; usage is `usage.prompt_tokens` (of which
`prompt_tokens_details.cached_tokens` cached) and `completion_tokens` (of
which `completion_tokens_details.reasoning_tokens` reasoning). A stream
(`"stream": true`) reports usage in the last chunk carrying a non-null
`usage`, only when the client asked for it (`stream_options.include_usage`).
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
    first,
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

API_SHAPE: Final = "openai_chat"
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh")


def build_request(model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
    """The exact Chat Completions request for one user message."""
    s = valid_settings(API_SHAPE, settings, max_temperature=2.0)
    messages: list[dict[str, Any]] = []
    if s.system is not None:
        messages.append({"role": "system", "content": s.system})
    messages.append({"role": "user", "content": prompt})
    body: dict[str, Any] = {"model": check_model(model), "messages": messages}
    if s.max_output_tokens is not None:
        body["max_tokens"] = s.max_output_tokens
    if s.temperature is not None:
        body["temperature"] = s.temperature
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.seed is not None:
        body["seed"] = s.seed
    if s.reasoning_effort is not None:
        if s.reasoning_effort not in REASONING_EFFORTS:
            raise refuse_unsupported(API_SHAPE, "reasoning_effort", f"one of {', '.join(REASONING_EFFORTS)}")
        body["reasoning_effort"] = s.reasoning_effort
    url = f"{url_base(base_url)}/chat/completions"
    return make_request(API_SHAPE, model, url, body, (), "Authorization", "Bearer ")


def _text(content: Any) -> tuple[str | None, bool]:
    """(the message text, whether the content had a shape we can read)."""
    if content is None or isinstance(content, str):
        return content, True
    if isinstance(content, list):  # some compatible servers return content parts
        parts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping):
                return None, False
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    return None, False
                parts.append(part["text"])
        return "".join(parts), True
    return None, False


def parse_response(status: int, headers: Mapping[str, str], raw: bytes) -> ParsedResponse:
    """Read a raw Chat Completions response; errors come back as data, never raised."""
    h = lower_headers(headers)
    body, why = decode_json(raw)
    obj = body if isinstance(body, Mapping) else {}
    request_id = string_or_none(obj.get("id")) or header(h, "x-request-id")
    model = string_or_none(obj.get("model"))
    if not 200 <= status < 300 or (obj.get("error") is not None and "choices" not in obj):
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
    usage = parse_usage(body)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return failure(
            "malformed_response", "response has no choices", request_id=request_id, model_snapshot=model, usage=usage
        )
    choice = choices[0]
    message = choice.get("message")
    finish = choice.get("finish_reason")
    text, readable = _text(message.get("content")) if isinstance(message, Mapping) else (None, False)
    if not readable or not (finish is None or isinstance(finish, str)):
        return failure(
            "malformed_response",
            "choices[0] has no readable message or finish_reason",
            request_id=request_id,
            model_snapshot=model,
            usage=usage,
        )
    assert isinstance(message, Mapping)
    refusal = message.get("refusal")
    if finish == "content_filter" or (isinstance(refusal, str) and refusal):
        why_filtered = f"refusal: {refusal}" if isinstance(refusal, str) and refusal else "finish_reason content_filter"
        return failure(
            "content_filter",
            why_filtered,
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
        u.count(u.get(usage, "prompt_tokens")),
        u.optional(usage, "prompt_tokens_details", "cached_tokens"),
        u.count(u.get(usage, "completion_tokens")),
        u.optional(usage, "completion_tokens_details", "reasoning_tokens"),
    )


def classify_error(status: int, body: Any) -> tuple[str, str]:
    """The stable error code and a short message for an error response (`harness.providers.errors`)."""
    return classify(status, body)


def describe(doc: Mapping[str, Any]) -> Described:
    """Usage, finish reason, model snapshot and request id of a decoded response body."""
    choice = first(doc.get("choices"))
    finish = str_or_none(choice.get("finish_reason")) if isinstance(choice, dict) else None
    return Described(parse_usage(doc), finish, str_or_none(doc.get("model")), str_or_none(doc.get("id")), True)


def describe_stream(docs: list[dict[str, Any]]) -> Described:
    """A stream's chunks: the usage of the last chunk carrying a non-null `usage`."""
    return fold_stream(docs, describe, usage_key="usage")


def serves_path(path: str) -> bool:
    """Whether a request path (no query, no trailing slash) is this shape's endpoint."""
    return path.endswith("/chat/completions")


def request_streams(url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response."""
    del url
    return body_asks_stream(body)


def model_from_path(path: str) -> str | None:
    """The model a request path names: none (it is in the body)."""
    del path
    return None
