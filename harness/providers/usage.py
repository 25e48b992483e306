"""Reading token counts out of a decoded response body: the pieces every adapter's usage parser shares.

A count is a non-negative JSON integer (never a bool); an optional detail that
is absent counts 0, present but malformed makes the usage unknown (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.records.usage import TokenUsage

__all__ = ["count", "get", "optional", "split"]


def count(value: Any) -> int | None:
    """A token count: a non-negative JSON integer (never a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def get(obj: Any, *keys: str) -> Any:
    """`obj[k1][k2]...`, or None as soon as a level is not a mapping."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def optional(obj: Any, *keys: str) -> int | None:
    """An optional detail count: absent is 0, present but malformed is unknown (None)."""
    value = get(obj, *keys)
    if value is None:
        return 0
    return count(value)


def split(total_in: int | None, cached: int | None, total_out: int | None, reasoning: int | None) -> TokenUsage | None:
    """Usage where cached is part of the input and reasoning part of the output (OpenAI, Gemini)."""
    if total_in is None or cached is None or total_out is None or reasoning is None:
        return None
    if cached > total_in or reasoning > total_out:
        return None
    return TokenUsage(input=total_in - cached, cached_input=cached, output=total_out - reasoning, reasoning=reasoning)
