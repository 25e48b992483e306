"""OpenAI Chat Completions, which every OpenAI-compatible server speaks (vLLM, llama.cpp, Ollama, ...).

The manual: docs/models.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

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
    url_base,
    valid_settings,
)
from harness.providers.provider import Provider
from harness.records.usage import TokenUsage

__all__ = ["OpenAIChat"]


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


class OpenAIChat(Provider):
    """OpenAI Chat Completions (docs/models.md)."""

    API_SHAPE = "openai_chat"
    MAX_TOKENS_KEYS = (("max_completion_tokens",), ("max_tokens",))
    PATH_SUFFIXES = ("/chat/completions",)
    REASONING_EFFORTS: ClassVar[tuple[str, ...]] = ("none", "minimal", "low", "medium", "high", "xhigh")

    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        """The exact Chat Completions request for one user message."""
        s = valid_settings(self.API_SHAPE, settings, max_temperature=2.0)
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
            if s.reasoning_effort not in self.REASONING_EFFORTS:
                efforts = ", ".join(self.REASONING_EFFORTS)
                raise refuse_unsupported(self.API_SHAPE, "reasoning_effort", f"one of {efforts}")
            body["reasoning_effort"] = s.reasoning_effort
        url = f"{url_base(base_url)}/chat/completions"
        return make_request(self.API_SHAPE, model, url, body, (), "Authorization", "Bearer ")

    def is_error(self, body: Any, obj: Mapping[str, Any]) -> bool:
        """An `error` object without `choices`."""
        del body
        return obj.get("error") is not None and "choices" not in obj

    def parse_body(self, body: Mapping[str, Any], request_id: str | None, model: str | None) -> ParsedResponse:
        """The first choice's message text and finish reason; a refusal or `content_filter` is an error."""
        usage = self.parse_usage(body)
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
        if isinstance(refusal, str) and refusal:
            filtered: str | None = f"refusal: {refusal}"
        else:
            filtered = "finish_reason content_filter" if finish == "content_filter" else None
        return answer(text, finish, model, request_id, usage, filtered=filtered)

    def parse_usage(self, body: Any) -> TokenUsage | None:
        """`usage`: prompt tokens (cached among them) and completion tokens (reasoning among them)."""
        usage = u.get(body, "usage")
        return u.split(
            u.count(u.get(usage, "prompt_tokens")),
            u.optional(usage, "prompt_tokens_details", "cached_tokens"),
            u.count(u.get(usage, "completion_tokens")),
            u.optional(usage, "completion_tokens_details", "reasoning_tokens"),
        )

    def describe(self, doc: Mapping[str, Any]) -> Described:
        """Usage, finish reason, model snapshot and request id of a decoded response body."""
        choice = first(doc.get("choices"))
        finish = str_or_none(choice.get("finish_reason")) if isinstance(choice, dict) else None
        return Described(self.parse_usage(doc), finish, str_or_none(doc.get("model")), str_or_none(doc.get("id")), True)
