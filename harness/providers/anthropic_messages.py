"""The Anthropic Messages API.

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
    header,
    make_request,
    refuse_unsupported,
    str_or_none,
    string_or_none,
    url_base,
    valid_settings,
)
from harness.providers.provider import Provider
from harness.records.usage import TokenUsage

__all__ = ["AnthropicMessages"]


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


class AnthropicMessages(Provider):
    """The Anthropic Messages API (docs/models.md)."""

    API_SHAPE = "anthropic_messages"
    MAX_TOKENS_KEYS = (("max_tokens",),)
    PATH_SUFFIXES = ("/messages",)
    FREE_PATH_SUFFIXES = ("/count_tokens",)  # `/messages/count_tokens`
    ANTHROPIC_VERSION: ClassVar[str] = "2023-06-01"
    DEFAULT_MAX_TOKENS: ClassVar[int] = 1024
    """`max_tokens` sent when the settings leave it unset (the API requires one)."""
    EFFORTS: ClassVar[tuple[str, ...]] = ("low", "medium", "high", "xhigh", "max")

    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        """The exact Messages request for one user message."""
        s = valid_settings(self.API_SHAPE, settings, max_temperature=1.0)
        if s.seed is not None:
            raise refuse_unsupported(self.API_SHAPE, "seed", "the Messages API takes no seed")
        max_tokens = self.DEFAULT_MAX_TOKENS if s.max_output_tokens is None else s.max_output_tokens
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
            if s.reasoning_effort not in self.EFFORTS:
                efforts = ", ".join(self.EFFORTS)
                raise refuse_unsupported(self.API_SHAPE, "reasoning_effort", f"Anthropic's effort is one of {efforts}")
            body["output_config"] = {"effort": s.reasoning_effort}
        url = f"{url_base(base_url)}/messages"
        headers = (("anthropic-version", self.ANTHROPIC_VERSION),)
        return make_request(self.API_SHAPE, model, url, body, headers, "x-api-key")

    def response_ids(self, obj: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """The `request-id` header, else the body's `id` or `request_id`; the body's `model`."""
        request_id = header(headers, "request-id") or string_or_none(obj.get("id")) or string_or_none(obj.get("request_id"))
        return request_id, string_or_none(obj.get("model"))

    def is_error(self, body: Any, obj: Mapping[str, Any]) -> bool:
        """A body of `type` error."""
        del body
        return obj.get("type") == "error"

    def parse_body(self, body: Mapping[str, Any], request_id: str | None, model: str | None) -> ParsedResponse:
        """The text content blocks, joined; `stop_reason` as the finish reason, refusal an error."""
        content = body.get("content")
        finish = body.get("stop_reason")
        usage = self.parse_usage(body)
        text, readable = _text(content) if isinstance(content, list) else (None, False)
        if not readable or not (finish is None or isinstance(finish, str)):
            return failure(
                "malformed_response",
                "response has no readable content list or stop_reason",
                request_id=request_id,
                model_snapshot=model,
                usage=usage,
            )
        filtered = "stop_reason refusal" if finish == "refusal" else None
        return answer(text, finish, model, request_id, usage, filtered=filtered)

    def parse_usage(self, body: Any) -> TokenUsage | None:
        """`usage`: fresh input, cache reads and writes, output (each apart)."""
        usage = u.get(body, "usage")
        fresh, out = u.count(u.get(usage, "input_tokens")), u.count(u.get(usage, "output_tokens"))
        read, write = u.optional(usage, "cache_read_input_tokens"), u.optional(usage, "cache_creation_input_tokens")
        if fresh is None or out is None or read is None or write is None:
            return None
        return TokenUsage(input=fresh, cached_input=read, cache_write=write, output=out)

    def describe(self, doc: Mapping[str, Any]) -> Described:
        """Usage, finish reason (`stop_reason`), model snapshot and request id of a decoded response body."""
        snapshot, request_id = str_or_none(doc.get("model")), str_or_none(doc.get("id"))
        return Described(self.parse_usage(doc), str_or_none(doc.get("stop_reason")), snapshot, request_id, True)

    def describe_stream(self, docs: list[dict[str, Any]]) -> Described:
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
        usage = self.parse_usage({"usage": merged}) if saw_delta else None
        return Described(usage, finish, snapshot, request_id, True)
