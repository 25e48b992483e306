"""The OpenAI Responses API.

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

__all__ = ["API_SHAPE", "REASONING_EFFORTS", "build_request", "parse_response"]

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
        return error_response(API_SHAPE, status, raw if why else body, request_id=request_id, model_snapshot=model)
    if why is not None:
        return failure("malformed_response", why, request_id=request_id)
    if not isinstance(body, Mapping):
        return failure("malformed_response", "response body is not a JSON object", request_id=request_id)
    output = body.get("output")
    usage = usage_from_response(API_SHAPE, body)
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
