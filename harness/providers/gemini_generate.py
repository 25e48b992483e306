"""The Gemini API's generateContent method.

Request: `POST {base_url}/models/{model}:generateContent`,
`x-goog-api-key: <key>`, canonical JSON with exactly these fields:

- `contents`: one user turn with the prompt as one text part;
  `systemInstruction` only when `settings.system` is set. The model is in
  the URL, not the body (a bare id such as `gemini-2.5-flash`).
- `generationConfig`, only when something in it is set: `maxOutputTokens`,
  `temperature` (0..2), `topP` (0..1), `seed`, and
  `thinkingConfig.thinkingBudget` from `reasoning_effort`.
- The effort-to-budget table is the one Google publishes for its own
  OpenAI-compatible endpoint: `none` 0 (thinking off), `low` 1024,
  `medium` 8192, `high` 24576 tokens. Other words are refused. Models that
  take no budget, or cannot turn thinking off, answer 400 (`bad_request`).

Response: text is every text part of the first candidate that is not a
thought summary, joined. The finish reason is the provider's own
`finishReason`; `SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`,
`SPII` and the image filters are `content_filter`, and so is a prompt
blocked before any candidate (`promptFeedback.blockReason`, which then
stands as the finish reason). The request id is `responseId`; the model
snapshot is `modelVersion`.

Metering (the wire log's view, from the bytes alone): the path ends in
`:generateContent` or `:streamGenerateContent` (which streams) and names the
model (`/models/<m>:...`); usage is `usageMetadata.promptTokenCount` (of
which `cachedContentTokenCount` cached), `candidatesTokenCount` (absent when
nothing was generated) and `thoughtsTokenCount` (reasoning). A stream (SSE,
or one JSON array without `alt=sse`) reports usage in the last chunk
carrying `usageMetadata`. A `RESOURCE_EXHAUSTED` error is a quota (not a
rate limit) when the exhausted quota is a daily one (`PerDay`), has limit 0,
or says "exceeded your current quota" without naming a per-minute quota.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from harness.providers import usage as u
from harness.providers.base import Described, GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.common import (
    check_model,
    decode_json,
    failure,
    first,
    make_request,
    refuse_unsupported,
    str_or_none,
    string_or_none,
    url_base,
    valid_settings,
)
from harness.providers.errors import classify_error as classify
from harness.providers.errors import error_response
from harness.providers.streams import fold_stream
from harness.records.usage import TokenUsage

__all__ = [
    "API_SHAPE",
    "FILTER_REASONS",
    "FREE_PATH_SUFFIXES",
    "THINKING_BUDGETS",
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


# ---- metering: what the wire log reads from an exchange of this shape

FREE_PATH_SUFFIXES: Final[tuple[str, ...]] = (":countTokens",)
"""Token-counting endpoints (`:countTokens`): free, so never metered."""

_MODEL_PATH: Final = re.compile(r"/models/([^/:]+):(?:stream)?[Gg]enerate[Cc]ontent$")


def parse_usage(body: Any) -> TokenUsage | None:
    """The usage in a decoded response body, or None when unknown."""
    usage = u.get(body, "usageMetadata")
    prompt = u.count(u.get(usage, "promptTokenCount"))
    cached = u.optional(usage, "cachedContentTokenCount")
    out = u.optional(usage, "candidatesTokenCount")  # absent when nothing was generated
    thoughts = u.optional(usage, "thoughtsTokenCount")
    if prompt is None or cached is None or out is None or thoughts is None or cached > prompt:
        return None
    return TokenUsage(input=prompt - cached, cached_input=cached, output=out, reasoning=thoughts)


def _quota(marks: set[str], blob: str) -> bool:
    """A `RESOURCE_EXHAUSTED` that waiting a minute does not cure."""
    if "resource_exhausted" not in marks:
        return False
    if "perday" in blob or "limit: 0" in blob:
        return True
    return "exceeded your current quota" in blob and "perminute" not in blob


def classify_error(status: int, body: Any) -> tuple[str, str]:
    """The stable error code and a short message for an error response, with Gemini's quota rule."""
    return classify(status, body, quota_rule=_quota)


def describe(doc: Mapping[str, Any]) -> Described:
    """Usage, finish reason, model snapshot (`modelVersion`) and request id (`responseId`)."""
    candidate = first(doc.get("candidates"))
    finish = str_or_none(candidate.get("finishReason")) if isinstance(candidate, dict) else None
    snapshot, request_id = str_or_none(doc.get("modelVersion")), str_or_none(doc.get("responseId"))
    return Described(parse_usage(doc), finish, snapshot, request_id, True)


def describe_stream(docs: list[dict[str, Any]]) -> Described:
    """A stream's chunks: the usage of the last chunk carrying `usageMetadata`."""
    return fold_stream(docs, describe, usage_key="usageMetadata")


def serves_path(path: str) -> bool:
    """Whether a request path (no query, no trailing slash) is this shape's endpoint."""
    return path.endswith(":generateContent") or path.endswith(":streamGenerateContent")


def request_streams(url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response (the stream method, whatever the body)."""
    del body
    return urlsplit(url).path.endswith(":streamGenerateContent")


def model_from_path(path: str) -> str | None:
    """The model a `/models/<m>:generateContent` path names."""
    found = _MODEL_PATH.search(path)
    return found.group(1) if found else None
