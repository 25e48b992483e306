"""The OpenAI Responses API.

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
    make_request,
    refuse_unsupported,
    str_or_none,
    url_base,
    valid_settings,
)
from harness.providers.provider import Provider
from harness.providers.streams import fold_stream
from harness.records.usage import TokenUsage

__all__ = ["OpenAIResponses"]


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


class OpenAIResponses(Provider):
    """The OpenAI Responses API (docs/models.md)."""

    API_SHAPE = "openai_responses"
    MAX_TOKENS_KEYS = (("max_output_tokens",),)
    PATH_SUFFIXES = ("/responses",)
    REASONING_EFFORTS: ClassVar[tuple[str, ...]] = ("none", "minimal", "low", "medium", "high", "xhigh")

    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        """The exact Responses request for one user message."""
        s = valid_settings(self.API_SHAPE, settings, max_temperature=2.0)
        if s.seed is not None:
            raise refuse_unsupported(self.API_SHAPE, "seed", "the Responses API takes no seed")
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
            if s.reasoning_effort not in self.REASONING_EFFORTS:
                efforts = ", ".join(self.REASONING_EFFORTS)
                raise refuse_unsupported(self.API_SHAPE, "reasoning_effort", f"one of {efforts}")
            body["reasoning"] = {"effort": s.reasoning_effort}
        url = f"{url_base(base_url)}/responses"
        return make_request(self.API_SHAPE, model, url, body, (), "Authorization", "Bearer ")

    def is_error(self, body: Any, obj: Mapping[str, Any]) -> bool:
        """An `error` object without `output`, or with `status` failed."""
        del body
        return obj.get("error") is not None and ("output" not in obj or obj.get("status") == "failed")

    def parse_body(self, body: Mapping[str, Any], request_id: str | None, model: str | None) -> ParsedResponse:
        """The output messages' text; `status` (or why it is incomplete) as the finish reason."""
        state = body.get("status")
        output = body.get("output")
        usage = self.parse_usage(body)
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
        if refusal is not None:
            filtered: str | None = f"refusal: {refusal}"
        else:
            filtered = "incomplete: content_filter" if finish == "content_filter" else None
        return answer(text, finish, model, request_id, usage, filtered=filtered)

    def parse_usage(self, body: Any) -> TokenUsage | None:
        """`usage`: input tokens (cached among them) and output tokens (reasoning among them)."""
        usage = u.get(body, "usage")
        return u.split(
            u.count(u.get(usage, "input_tokens")),
            u.optional(usage, "input_tokens_details", "cached_tokens"),
            u.count(u.get(usage, "output_tokens")),
            u.optional(usage, "output_tokens_details", "reasoning_tokens"),
        )

    def describe(self, doc: Mapping[str, Any]) -> Described:
        """Usage, finish reason (`incomplete_details.reason`, else `status`), model snapshot and request id."""
        details = doc.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            finish: str | None = str(details["reason"])
        else:
            finish = str_or_none(doc.get("status"))
        return Described(self.parse_usage(doc), finish, str_or_none(doc.get("model")), str_or_none(doc.get("id")), True)

    def describe_stream(self, docs: list[dict[str, Any]]) -> Described:
        """A stream's events: each event's `response` object; usage from the last one carrying it."""
        return fold_stream(docs, self.describe, usage_key="usage", body_of=lambda doc: doc.get("response"))
