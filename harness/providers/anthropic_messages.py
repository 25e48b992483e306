"""The Anthropic Messages API.

The manual: docs/models.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from harness.meter.usage import usage_from_response
from harness.providers.base import GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.common import (
    check_model,
    decode_json,
    failure,
    header,
    lower_headers,
    make_request,
    refuse_unsupported,
    string_or_none,
    url_base,
    valid_settings,
)
from harness.providers.errors import error_response

__all__ = ["ANTHROPIC_VERSION", "API_SHAPE", "DEFAULT_MAX_TOKENS", "EFFORTS", "build_request", "parse_response"]

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
        return error_response(API_SHAPE, status, raw if why else body, request_id=request_id, model_snapshot=model)
    if why is not None:
        return failure("malformed_response", why, request_id=request_id)
    if not isinstance(body, Mapping):
        return failure("malformed_response", "response body is not a JSON object", request_id=request_id)
    content = body.get("content")
    finish = body.get("stop_reason")
    usage = usage_from_response(API_SHAPE, body)
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
