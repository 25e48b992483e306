"""The adapters by API shape: `adapter_for(shape)` is how everything else finds one.

An adapter is a module with `API_SHAPE`, a pure `build_request` and a pure
`parse_response` (see `harness.providers.base`). No adapter imports httpx:
only `harness.providers.transport` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

from harness.errors import Code, ProviderRefusal
from harness.providers import anthropic_messages, gemini_generate, openai_chat, openai_responses
from harness.providers.base import GenerationSettings, ParsedResponse, ProviderRequest

__all__ = ["ADAPTERS", "Adapter", "adapter_for"]


class Adapter(Protocol):
    """What every adapter module provides."""

    @property
    def API_SHAPE(self) -> str:
        """The API shape this adapter speaks, e.g. `openai_chat`."""
        ...

    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        """The exact request (body bytes and their sha256) for one user message."""
        ...

    def parse_response(self, status: int, headers: Mapping[str, str], raw: bytes) -> ParsedResponse:
        """What a raw response says, or its stable `error_code`; never raises."""
        ...


ADAPTERS: Final[dict[str, Adapter]] = {
    openai_chat.API_SHAPE: openai_chat,
    openai_responses.API_SHAPE: openai_responses,
    anthropic_messages.API_SHAPE: anthropic_messages,
    gemini_generate.API_SHAPE: gemini_generate,
}


def adapter_for(api_shape: str) -> Adapter:
    """The adapter for `api_shape`, or the refusal `unknown_api_shape` naming the known ones."""
    try:
        return ADAPTERS[api_shape]
    except (KeyError, TypeError):
        known = ", ".join(sorted(ADAPTERS))
        raise ProviderRefusal(Code.UNKNOWN_API_SHAPE, f"no adapter for API shape {api_shape!r} (known: {known})") from None
