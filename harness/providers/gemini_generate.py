"""The Gemini API's generateContent method.

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
    make_request,
    refuse_unsupported,
    string_or_none,
    url_base,
    valid_settings,
)
from harness.providers.errors import error_response

__all__ = ["API_SHAPE", "FILTER_REASONS", "THINKING_BUDGETS", "build_request", "parse_response"]

API_SHAPE: Final = "gemini_generate"
THINKING_BUDGETS: Final = {"none": 0, "low": 1024, "medium": 8192, "high": 24576}
FILTER_REASONS: Final = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)


def build_request(model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
    """The exact generateContent request for one user turn."""
    s = valid_settings(API_SHAPE, settings, max_temperature=2.0)
    check_model(model, forbid="/?#%")
    body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    if s.system is not None:
        body["systemInstruction"] = {"parts": [{"text": s.system}]}
    config: dict[str, Any] = {}
    if s.max_output_tokens is not None:
        config["maxOutputTokens"] = s.max_output_tokens
    if s.temperature is not None:
        config["temperature"] = s.temperature
    if s.top_p is not None:
        config["topP"] = s.top_p
    if s.seed is not None:
        config["seed"] = s.seed
    if s.reasoning_effort is not None:
        if s.reasoning_effort not in THINKING_BUDGETS:
            raise refuse_unsupported(
                API_SHAPE, "reasoning_effort", f"mapped to a thinking budget only for {', '.join(THINKING_BUDGETS)}"
            )
        config["thinkingConfig"] = {"thinkingBudget": THINKING_BUDGETS[s.reasoning_effort]}
    if config:
        body["generationConfig"] = config
    url = f"{url_base(base_url)}/models/{model}:generateContent"
    return make_request(API_SHAPE, model, url, body, (), "x-goog-api-key")


def _text(candidate: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(joined non-thought text parts or None, whether the content was readable)."""
    content = candidate.get("content")
    if content is None:
        return None, True  # a filtered or empty candidate carries no content
    if not isinstance(content, Mapping):
        return None, False
    parts = content.get("parts")
    if parts is None:
        return None, True  # e.g. MAX_TOKENS reached while thinking
    if not isinstance(parts, list):
        return None, False
    texts: list[str] = []
    for part in parts:
        if not isinstance(part, Mapping):
            return None, False
        if "text" in part:
            if not isinstance(part["text"], str):
                return None, False
            if part.get("thought") is not True:
                texts.append(part["text"])
    return ("".join(texts) if texts else None), True


def parse_response(status: int, headers: Mapping[str, str], raw: bytes) -> ParsedResponse:
    """Read a raw generateContent response; errors come back as data, never raised."""
    del headers  # Gemini's request id and model version are in the body
    body, why = decode_json(raw)
    obj = body if isinstance(body, Mapping) else {}
    request_id = string_or_none(obj.get("responseId"))
    model = string_or_none(obj.get("modelVersion"))
    wrapped = isinstance(body, list) and bool(body) and isinstance(body[0], Mapping) and "error" in body[0]
    is_error = obj.get("error") is not None or wrapped
    if not 200 <= status < 300 or is_error:
        return error_response(API_SHAPE, status, raw if why else body, request_id=request_id, model_snapshot=model)
    if why is not None:
        return failure("malformed_response", why, request_id=request_id)
    if not isinstance(body, Mapping):
        return failure("malformed_response", "response body is not a JSON object", request_id=request_id)
    usage = usage_from_response(API_SHAPE, body)
    candidates = body.get("candidates")
    if not candidates:
        feedback = body.get("promptFeedback")
        blocked = feedback.get("blockReason") if isinstance(feedback, Mapping) else None
        if isinstance(blocked, str) and blocked:
            return failure(
                "content_filter",
                f"prompt blocked: {blocked}",
                finish_reason=blocked,
                model_snapshot=model,
                request_id=request_id,
                usage=usage,
            )
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], Mapping):
        return failure("malformed_response", "response has no candidates", request_id=request_id, usage=usage)
    finish = candidates[0].get("finishReason")
    text, readable = _text(candidates[0])
    if not readable or not (finish is None or isinstance(finish, str)):
        return failure(
            "malformed_response",
            "candidates[0] has no readable content or finishReason",
            request_id=request_id,
            model_snapshot=model,
            usage=usage,
        )
    if finish in FILTER_REASONS:
        return failure(
            "content_filter",
            f"finishReason {finish}",
            text=text,
            finish_reason=finish,
            model_snapshot=model,
            request_id=request_id,
            usage=usage,
        )
    return ParsedResponse(text=text, finish_reason=finish, model_snapshot=model, request_id=request_id, usage=usage)
