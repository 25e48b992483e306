"""The Gemini API's generateContent method.

The manual: docs/models.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from harness.providers import usage as u
from harness.providers.base import Described, GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.common import (
    answer,
    check_model,
    failure,
    first,
    make_request,
    refuse_unsupported,
    str_or_none,
    string_or_none,
    url_base,
    valid_settings,
)
from harness.providers.errors import classify_error
from harness.providers.provider import Provider
from harness.records.usage import TokenUsage

__all__ = ["GeminiGenerate"]

_MODEL_PATH: Final = re.compile(r"/models/([^/:]+):(?:stream)?[Gg]enerate[Cc]ontent$")


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


def _quota(marks: set[str], blob: str) -> bool:
    """A `RESOURCE_EXHAUSTED` that waiting a minute does not cure."""
    if "resource_exhausted" not in marks:
        return False
    if "perday" in blob or "limit: 0" in blob:
        return True
    return "exceeded your current quota" in blob and "perminute" not in blob


class GeminiGenerate(Provider):
    """The Gemini API's generateContent (docs/models.md)."""

    API_SHAPE = "gemini_generate"
    MAX_TOKENS_KEYS = (("generationConfig", "maxOutputTokens"),)
    PATH_SUFFIXES = (":generateContent", ":streamGenerateContent")
    FREE_PATH_SUFFIXES = (":countTokens",)
    USAGE_KEY = "usageMetadata"
    THINKING_BUDGETS: ClassVar[Mapping[str, int]] = {"none": 0, "low": 1024, "medium": 8192, "high": 24576}
    FILTER_REASONS: ClassVar[frozenset[str]] = frozenset(
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

    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        """The exact generateContent request for one user turn."""
        s = valid_settings(self.API_SHAPE, settings, max_temperature=2.0)
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
            if s.reasoning_effort not in self.THINKING_BUDGETS:
                efforts = ", ".join(self.THINKING_BUDGETS)
                raise refuse_unsupported(
                    self.API_SHAPE, "reasoning_effort", f"mapped to a thinking budget only for {efforts}"
                )
            config["thinkingConfig"] = {"thinkingBudget": self.THINKING_BUDGETS[s.reasoning_effort]}
        if config:
            body["generationConfig"] = config
        url = f"{url_base(base_url)}/models/{model}:generateContent"
        return make_request(self.API_SHAPE, model, url, body, (), "x-goog-api-key")

    def response_ids(self, obj: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """The body's `responseId` and `modelVersion` (Gemini puts neither in a header)."""
        del headers
        return string_or_none(obj.get("responseId")), string_or_none(obj.get("modelVersion"))

    def is_error(self, body: Any, obj: Mapping[str, Any]) -> bool:
        """An `error` object, bare or wrapped in a one-element array."""
        wrapped = isinstance(body, list) and bool(body) and isinstance(body[0], Mapping) and "error" in body[0]
        return obj.get("error") is not None or wrapped

    def parse_body(self, body: Mapping[str, Any], request_id: str | None, model: str | None) -> ParsedResponse:
        """The first candidate's non-thought text; a blocked prompt or a filter `finishReason` is an error."""
        usage = self.parse_usage(body)
        candidates = body.get("candidates")
        if not candidates:
            feedback = body.get("promptFeedback")
            blocked = feedback.get("blockReason") if isinstance(feedback, Mapping) else None
            if isinstance(blocked, str) and blocked:
                return answer(None, blocked, model, request_id, usage, filtered=f"prompt blocked: {blocked}")
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
        filtered = f"finishReason {finish}" if finish in self.FILTER_REASONS else None
        return answer(text, finish, model, request_id, usage, filtered=filtered)

    def parse_usage(self, body: Any) -> TokenUsage | None:
        """`usageMetadata`: prompt tokens (cached among them), candidate and thought tokens apart."""
        usage = u.get(body, "usageMetadata")
        prompt = u.count(u.get(usage, "promptTokenCount"))
        cached = u.optional(usage, "cachedContentTokenCount")
        out = u.optional(usage, "candidatesTokenCount")  # absent when nothing was generated
        thoughts = u.optional(usage, "thoughtsTokenCount")
        if prompt is None or cached is None or out is None or thoughts is None or cached > prompt:
            return None
        return TokenUsage(input=prompt - cached, cached_input=cached, output=out, reasoning=thoughts)

    def classify_error(self, status: int, body: Any) -> tuple[str, str]:
        """The shared classification, with Gemini's quota rule (a daily `RESOURCE_EXHAUSTED`)."""
        return classify_error(status, body, quota_rule=_quota)

    def describe(self, doc: Mapping[str, Any]) -> Described:
        """Usage, finish reason, model snapshot (`modelVersion`) and request id (`responseId`)."""
        candidate = first(doc.get("candidates"))
        finish = str_or_none(candidate.get("finishReason")) if isinstance(candidate, dict) else None
        snapshot, request_id = str_or_none(doc.get("modelVersion")), str_or_none(doc.get("responseId"))
        return Described(self.parse_usage(doc), finish, snapshot, request_id, True)

    def request_streams(self, url: str, body: bytes) -> bool:
        """The stream method (`:streamGenerateContent`), whatever the body says."""
        del body
        return urlsplit(url).path.endswith(":streamGenerateContent")

    def model_from_path(self, path: str) -> str | None:
        """The model a `/models/<m>:generateContent` path names."""
        found = _MODEL_PATH.search(path)
        return found.group(1) if found else None
