"""Token usage, as the meter sees it: the recorded type and the per-shape parser, by their new homes.

`TokenUsage` and `CATEGORIES` live in `harness.records.usage`; each API shape's
usage parser lives in its adapter, found through `harness.providers.registry`.
This module only re-exports them, so older imports keep working.
"""

from __future__ import annotations

from harness.providers.registry import API_SHAPES, usage_from_response
from harness.records.usage import CATEGORIES, TokenUsage

__all__ = ["API_SHAPES", "CATEGORIES", "TokenUsage", "usage_from_response"]
