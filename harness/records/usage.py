"""Token usage by disjoint category: the usage recorded in wire logs and attempts.

- `input`: prompt tokens read at the full input price (not cached, not written to a cache)
- `cached_input`: prompt tokens read from a cache
- `cache_write`: prompt tokens written to a cache
- `output`: generated tokens that are not reasoning tokens
- `reasoning`: generated reasoning ("thinking") tokens

Usage that is missing or malformed is `None` (unknown), never zero. Each
provider adapter reads it from its own API shape (`harness.providers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["CATEGORIES", "TokenUsage"]

CATEGORIES: Final = ("input", "cached_input", "cache_write", "output", "reasoning")


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
