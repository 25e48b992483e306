"""The one list of API shapes: `adapter_for(shape)` is how everything else finds an adapter.

An adapter is a module that owns everything about its API shape (see
`Adapter`): the exact request, the parsed response, its error classification,
and what the wire log reads from an exchange (usage, streamed usage, finish
reason, the URL path that speaks it). Adding a shape is one module plus one
`register` line below; the meter and the catalog only ask this registry. No
adapter imports httpx: only `harness.providers.transport` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from harness.errors import Code, ProviderRefusal
from harness.providers import anthropic_messages, gemini_generate, openai_chat, openai_responses
from harness.providers.base import Described, GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.streams import body_asks_stream, json_object
from harness.records.usage import TokenUsage

__all__ = [
    "ADAPTERS",
    "API_SHAPES",
    "Adapter",
    "adapter_for",
    "api_shapes",
    "classify_error",
    "find_adapter",
    "free_path",
    "model_from_request",
    "register",
    "request_streams",
    "shape_for_path",
    "usage_from_response",
]


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

    def classify_error(self, status: int, body: Any) -> tuple[str, str]:
        """(stable error code, short message) for an error response."""
        ...

    def parse_usage(self, body: Any) -> TokenUsage | None:
        """The usage in a decoded response body, or None when unknown."""
        ...

    def describe(self, doc: Mapping[str, Any]) -> Described:
        """What a decoded (non-streamed) response body says about itself."""
        ...

    def describe_stream(self, docs: list[dict[str, Any]]) -> Described:
        """What a stream's decoded events say, usage only when the stream reports it."""
        ...

    def serves_path(self, path: str) -> bool:
        """Whether a request path (no query, no trailing slash) is this shape's endpoint."""
        ...

    def request_streams(self, url: str, body: bytes) -> bool:
        """Whether the request asks for a streamed response."""
        ...

    def model_from_path(self, path: str) -> str | None:
        """The model the URL path names, if this shape puts it there."""
        ...

    @property
    def FREE_PATH_SUFFIXES(self) -> tuple[str, ...]:
        """Endpoints of this provider that are never billed (token counting), by path suffix."""
        ...


ADAPTERS: Final[dict[str, Adapter]] = {}


def register(adapter: Adapter) -> Adapter:
    """Add an adapter under its `API_SHAPE` (a shape is registered once)."""
    if adapter.API_SHAPE in ADAPTERS or adapter.API_SHAPE == "unknown":
        raise ValueError(f"API shape {adapter.API_SHAPE!r} is already taken")
    ADAPTERS[adapter.API_SHAPE] = adapter
    return adapter


for _module in (openai_chat, openai_responses, anthropic_messages, gemini_generate):
    register(_module)

API_SHAPES: Final = tuple(ADAPTERS)
"""The built-in shapes, in registration order (`api_shapes()` includes any registered later)."""


def api_shapes() -> tuple[str, ...]:
    """Every registered shape, in registration order."""
    return tuple(ADAPTERS)


def find_adapter(api_shape: str) -> Adapter | None:
    """The adapter for `api_shape`, or None (e.g. for the wire log's "unknown")."""
    return ADAPTERS.get(api_shape) if isinstance(api_shape, str) else None


def adapter_for(api_shape: str) -> Adapter:
    """The adapter for `api_shape`, or the refusal `unknown_api_shape` naming the known ones."""
    found = find_adapter(api_shape)
    if found is None:
        known = ", ".join(sorted(ADAPTERS))
        raise ProviderRefusal(Code.UNKNOWN_API_SHAPE, f"no adapter for API shape {api_shape!r} (known: {known})")
    return found


def usage_from_response(api_shape: str, body: Any) -> TokenUsage | None:
    """The usage in a decoded response body of `api_shape`, or None when unknown."""
    found = find_adapter(api_shape)
    if found is None:
        raise ValueError(f"unknown API shape {api_shape!r}")
    return found.parse_usage(body)


def classify_error(api_shape: str, status: int, body: Any) -> tuple[str, str]:
    """The stable error code and a short message for an error response of `api_shape`."""
    return adapter_for(api_shape).classify_error(status, body)


def shape_for_path(method: str, path: str) -> str:
    """The API shape a request path speaks, or "unknown" (only POSTs are provider exchanges)."""
    if method.upper() != "POST":
        return "unknown"
    p = urlsplit(path).path.rstrip("/")
    return next((shape for shape, adapter in ADAPTERS.items() if adapter.serves_path(p)), "unknown")


def model_from_request(path: str, body: bytes) -> str | None:
    """The model a request names: the body's `model`, else the one its URL path names."""
    doc = json_object(body)
    if doc is not None and isinstance(doc.get("model"), str):
        return str(doc["model"])
    p = urlsplit(path).path
    return next((m for a in ADAPTERS.values() if (m := a.model_from_path(p)) is not None), None)


def free_path(path: str) -> bool:
    """Whether a request path (no query, no trailing slash) is an endpoint no provider bills."""
    return any(path.endswith(adapter.FREE_PATH_SUFFIXES) for adapter in ADAPTERS.values())


def request_streams(api_shape: str, url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response (an unknown shape: `"stream": true`)."""
    found = find_adapter(api_shape)
    return body_asks_stream(body) if found is None else found.request_streams(url, body)
