"""Token usage by category, read from a provider's response in its own API shape.

The categories are disjoint, so a cost is the sum of category x price:

- `input`: prompt tokens read at the full input price (not cached, not written to a cache)
- `cached_input`: prompt tokens read from a cache
- `cache_write`: prompt tokens written to a cache
- `output`: generated tokens that are not reasoning tokens
- `reasoning`: generated reasoning ("thinking") tokens

Usage that is missing or malformed is `None` (unknown), never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.records.attempt import TOKEN_CATEGORIES

__all__ = ["API_SHAPES", "CATEGORIES", "TokenUsage", "usage_from_response"]

API_SHAPES = ("openai_chat", "openai_responses", "anthropic_messages", "gemini_generate")
CATEGORIES = TOKEN_CATEGORIES  # the attempt record's token categories (harness.records.attempt)


@dataclass(frozen=True)
class TokenUsage:
    """Disjoint token counts by category."""

    input: int = 0
    cached_input: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0

    @property
    def total(self) -> int:
        return self.input + self.cached_input + self.cache_write + self.output + self.reasoning

    @property
    def prompt_tokens(self) -> int:
        """Every token of the prompt, whatever its cache state (what context tiers are priced on)."""
        return self.input + self.cached_input + self.cache_write

    def to_json(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CATEGORIES}

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(*(getattr(self, c) + getattr(other, c) for c in CATEGORIES))


def _count(value: Any) -> int | None:
    """A token count: a non-negative JSON integer (never a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _optional(obj: Any, *keys: str) -> int | None:
    """An optional detail count: absent is 0, present but malformed is unknown (None)."""
    value = _get(obj, *keys)
    if value is None:
        return 0
    return _count(value)


def _split(total_in: int | None, cached: int | None, total_out: int | None, reasoning: int | None) -> TokenUsage | None:
    """Usage where cached is part of the input and reasoning part of the output (OpenAI, Gemini)."""
    if None in (total_in, cached, total_out, reasoning):
        return None
    assert total_in is not None and cached is not None and total_out is not None and reasoning is not None
    if cached > total_in or reasoning > total_out:
        return None
    return TokenUsage(input=total_in - cached, cached_input=cached, output=total_out - reasoning, reasoning=reasoning)


def usage_from_response(api_shape: str, body: Any) -> TokenUsage | None:
    """The usage in a decoded response body of `api_shape`, or None when unknown."""
    if api_shape == "openai_chat":
        u = _get(body, "usage")
        return _split(
            _count(_get(u, "prompt_tokens")),
            _optional(u, "prompt_tokens_details", "cached_tokens"),
            _count(_get(u, "completion_tokens")),
            _optional(u, "completion_tokens_details", "reasoning_tokens"),
        )
    if api_shape == "openai_responses":
        u = _get(body, "usage")
        return _split(
            _count(_get(u, "input_tokens")),
            _optional(u, "input_tokens_details", "cached_tokens"),
            _count(_get(u, "output_tokens")),
            _optional(u, "output_tokens_details", "reasoning_tokens"),
        )
    if api_shape == "anthropic_messages":
        u = _get(body, "usage")
        fresh, out = _count(_get(u, "input_tokens")), _count(_get(u, "output_tokens"))
        read, write = _optional(u, "cache_read_input_tokens"), _optional(u, "cache_creation_input_tokens")
        if fresh is None or out is None or read is None or write is None:
            return None
        return TokenUsage(input=fresh, cached_input=read, cache_write=write, output=out)
    if api_shape == "gemini_generate":
        u = _get(body, "usageMetadata")
        prompt = _count(_get(u, "promptTokenCount"))
        cached = _optional(u, "cachedContentTokenCount")
        out = _optional(u, "candidatesTokenCount")  # absent when nothing was generated
        thoughts = _optional(u, "thoughtsTokenCount")
        if prompt is None or cached is None or out is None or thoughts is None or cached > prompt:
            return None
        return TokenUsage(input=prompt - cached, cached_input=cached, output=out, reasoning=thoughts)
    raise ValueError(f"unknown API shape {api_shape!r}")
