"""`Provider`: one API shape and everything about it, as one class; the registry holds an instance of each.

A subclass names its shape and endpoint, builds the exact request, reads a
successful body, its usage and what the wire log sees; everything else is a
default written once here and overridden only where a shape differs.

The manual: docs/models.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from harness.providers.base import Described, GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.common import decode_json, failure, header, lower_headers, string_or_none
from harness.providers.errors import classify_error, error_response
from harness.providers.streams import body_asks_stream, fold_stream
from harness.records.usage import TokenUsage

__all__ = ["Provider"]


class Provider(ABC):
    """An API shape: its request, response, errors, usage, streams and URL paths (docs/models.md).

    Subclass, set `API_SHAPE` and `PATH_SUFFIXES`, write the abstract methods,
    and `harness.providers.registry.register` an instance.
    """

    API_SHAPE: ClassVar[str]
    """The API shape this provider speaks (its name in the catalog, the wire log and every record)."""
    PATH_SUFFIXES: ClassVar[tuple[str, ...]]
    """The endpoints it serves, by request path suffix."""
    FREE_PATH_SUFFIXES: ClassVar[tuple[str, ...]] = ()
    """Endpoints that are never billed (token counting), by path suffix."""
    USAGE_KEY: ClassVar[str] = "usage"
    """The body key that carries usage, in a response and in each streamed chunk."""
    MAX_TOKENS_KEYS: ClassVar[tuple[tuple[str, ...], ...]] = ()
    """Where a request body caps its output tokens (key paths, first found wins): the metering
    proxy's worst case of a request (docs/models.md, "Budgets inside an attempt")."""

    @abstractmethod
    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        """The exact request (body bytes and their sha256) for one user message."""

    @abstractmethod
    def parse_body(self, body: Mapping[str, Any], request_id: str | None, model: str | None) -> ParsedResponse:
        """What a successful JSON-object body says (`parse_response` has ruled out errors and non-JSON)."""

    @abstractmethod
    def parse_usage(self, body: Any) -> TokenUsage | None:
        """The usage in a decoded response body, or None when unknown."""

    @abstractmethod
    def describe(self, doc: Mapping[str, Any]) -> Described:
        """What a decoded (non-streamed) response body says about itself."""

    def parse_response(self, status: int, headers: Mapping[str, str], raw: bytes) -> ParsedResponse:
        """What a raw response says, or its stable `error_code`; never raises."""
        body, why = decode_json(raw)
        obj = body if isinstance(body, Mapping) else {}
        request_id, model = self.response_ids(obj, lower_headers(headers))
        if not 200 <= status < 300 or self.is_error(body, obj):
            return error_response(
                status,
                raw if why else body,
                classify=self.classify_error,
                usage_of=self.parse_usage,
                request_id=request_id,
                model_snapshot=model,
            )
        if why is not None:
            return failure("malformed_response", why, request_id=request_id)
        if not isinstance(body, Mapping):
            return failure("malformed_response", "response body is not a JSON object", request_id=request_id)
        return self.parse_body(body, request_id, model)

    def response_ids(self, obj: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """(request id, model snapshot) of a response: the body's `id`, else `x-request-id`; the body's `model`."""
        return string_or_none(obj.get("id")) or header(headers, "x-request-id"), string_or_none(obj.get("model"))

    def is_error(self, body: Any, obj: Mapping[str, Any]) -> bool:
        """Whether a 2xx response's decoded body (`obj`: it, or {} when not an object) is an error anyway."""
        del body, obj
        return False

    def classify_error(self, status: int, body: Any) -> tuple[str, str]:
        """(stable error code, short message) for an error response (`harness.providers.errors`)."""
        return classify_error(status, body)

    def describe_stream(self, docs: list[dict[str, Any]]) -> Described:
        """A stream's chunks, each like a whole response: the usage of the last one carrying `USAGE_KEY`."""
        return fold_stream(docs, self.describe, usage_key=self.USAGE_KEY)

    def serves_path(self, path: str) -> bool:
        """Whether a request path (no query, no trailing slash) is this shape's endpoint."""
        return path.endswith(self.PATH_SUFFIXES)

    def request_streams(self, url: str, body: bytes) -> bool:
        """Whether the request asks for a streamed response: its body says `"stream": true`."""
        del url
        return body_asks_stream(body)

    def max_output_tokens(self, body: Mapping[str, Any]) -> int | None:
        """The output-token cap a request body declares (`MAX_TOKENS_KEYS`), or None when it declares none."""
        for keys in self.MAX_TOKENS_KEYS:
            value: Any = body
            for key in keys:
                value = value.get(key) if isinstance(value, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return None

    def model_from_path(self, path: str) -> str | None:
        """The model the URL path names: none by default (it is in the body)."""
        del path
        return None
