"""The records every provider adapter builds and returns.

An adapter is two pure functions: `build_request(...)` makes the exact body
bytes (hashed) and the URL; `parse_response(status, headers, raw)` reads a raw
response into a `ParsedResponse`. Errors are data with a stable `error_code`,
never a bare exception, so a runner can classify them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from harness.records.attempt import PROVIDER_ERROR_CODES
from harness.records.usage import TokenUsage

__all__ = [
    "ERROR_CODES",
    "Described",
    "Exchange",
    "GenerationSettings",
    "ParsedResponse",
    "ProviderRequest",
]

ERROR_CODES: Final = PROVIDER_ERROR_CODES  # declared with the attempt record (harness.records.attempt)


@dataclass(frozen=True)
class GenerationSettings:
    """What a preregistration may fix about a request. None means "not sent": the provider's default."""

    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    reasoning_effort: str | None = None
    system: str | None = None


@dataclass(frozen=True)
class ProviderRequest:
    """An exact request: the body bytes as sent and their sha256. Credentials are never in it."""

    api_shape: str
    model: str
    url: str
    body: bytes
    body_sha256: str
    headers: tuple[tuple[str, str], ...]
    credential_header: str | None
    credential_prefix: str = ""

    def public_json(self) -> dict[str, Any]:
        """The request as logged: URL, non-secret headers, body sha256 (the body is logged separately)."""
        return {
            "api_shape": self.api_shape,
            "model": self.model,
            "url": self.url,
            "headers": dict(self.headers),
            "body_sha256": self.body_sha256,
        }


@dataclass(frozen=True)
class ParsedResponse:
    """What a raw response says, or why it cannot be used (`error_code`)."""

    text: str | None
    finish_reason: str | None
    model_snapshot: str | None
    request_id: str | None
    usage: TokenUsage | None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "model_snapshot": self.model_snapshot,
            "request_id": self.request_id,
            "usage": None if self.usage is None else self.usage.to_json(),
            "usage_unknown": self.usage is None,
            "error_code": self.error_code,
            "error_message": self.error_message,
        }


@dataclass(frozen=True)
class Described:
    """What a raw response body says about itself, read only from its bytes (the wire log's view):
    usage (None: unknown), finish reason, returned model snapshot, request id, and whether it was JSON."""

    usage: TokenUsage | None
    finish_reason: str | None = None
    model_snapshot: str | None = None
    request_id: str | None = None
    json_ok: bool = False


@dataclass(frozen=True)
class Exchange:
    """One request and what came back over the wire (or the transport failure), with times."""

    request: ProviderRequest
    status: int | None
    raw_response: bytes
    response_sha256: str
    response_headers: dict[str, str]
    started: float
    ended: float
    parsed: ParsedResponse
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        return self.ended - self.started
