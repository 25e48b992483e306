"""The one list of API shapes: `adapter_for(shape)` is how everything else finds a shape's `Provider`.

The manual: docs/models.md.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from harness.errors import Code, ProviderRefusal
from harness.providers.anthropic_messages import AnthropicMessages
from harness.providers.gemini_generate import GeminiGenerate
from harness.providers.openai_chat import OpenAIChat
from harness.providers.openai_responses import OpenAIResponses
from harness.providers.provider import Provider
from harness.providers.streams import body_asks_stream, json_object
from harness.records.usage import TokenUsage

__all__ = [
    "ADAPTERS",
    "API_SHAPES",
    "adapter_for",
    "api_shapes",
    "classify_error",
    "find_adapter",
    "free_path",
    "max_output_tokens",
    "model_from_request",
    "register",
    "request_streams",
    "shape_for_path",
    "usage_from_response",
]


ADAPTERS: Final[dict[str, Provider]] = {}
"""Each registered shape's `Provider` instance, by `API_SHAPE`."""


def register(provider: Provider) -> Provider:
    """Add a provider under its `API_SHAPE` (a shape is registered once)."""
    if provider.API_SHAPE in ADAPTERS or provider.API_SHAPE == "unknown":
        raise ValueError(f"API shape {provider.API_SHAPE!r} is already taken")
    ADAPTERS[provider.API_SHAPE] = provider
    return provider


for _provider in (OpenAIChat(), OpenAIResponses(), AnthropicMessages(), GeminiGenerate()):
    register(_provider)

API_SHAPES: Final = tuple(ADAPTERS)
"""The built-in shapes, in registration order (`api_shapes()` includes any registered later)."""


def api_shapes() -> tuple[str, ...]:
    """Every registered shape, in registration order."""
    return tuple(ADAPTERS)


def find_adapter(api_shape: str) -> Provider | None:
    """The `Provider` for `api_shape`, or None (e.g. for the wire log's "unknown")."""
    return ADAPTERS.get(api_shape) if isinstance(api_shape, str) else None


def adapter_for(api_shape: str) -> Provider:
    """The `Provider` for `api_shape`, or the refusal `unknown_api_shape` naming the known ones."""
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


def max_output_tokens(api_shape: str, body: bytes) -> int | None:
    """The output-token cap a request body declares, or None (no cap, an unknown shape, not JSON)."""
    found = find_adapter(api_shape)
    doc = json_object(body)
    return None if found is None or doc is None else found.max_output_tokens(doc)
