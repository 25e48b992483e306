"""Pieces the four adapters share: checking settings, making the exact request, reading a body.

Every adapter builds its body as a plain dict and hands it to `make_request`,
which writes it as canonical JSON (sorted keys, compact separators, UTF-8) so
the same inputs always give the same bytes and the same sha256.

The manual: docs/models.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from harness.errors import Code, ProviderRefusal, Refusal
from harness.evidence.jsonio import canonical_bytes, loads_strict, sha256_hex
from harness.providers.base import GenerationSettings, ParsedResponse, ProviderRequest
from harness.records.usage import TokenUsage

__all__ = [
    "MAX_MESSAGE",
    "answer",
    "check_model",
    "decode_json",
    "failure",
    "first",
    "header",
    "lower_headers",
    "make_request",
    "refuse_unsupported",
    "str_or_none",
    "string_or_none",
    "truncate",
    "url_base",
    "valid_settings",
]

MAX_MESSAGE: Final = 500
"""Longest error message an adapter returns, in characters."""

_MODEL_ID = re.compile(r"[^\s\x00-\x1f\x7f]+")


def truncate(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` cut to at most `limit` characters, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def url_base(base_url: str) -> str:
    """The base URL without a trailing slash; refuses anything that is not http(s)."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ProviderRefusal(Code.BASE_URL_INVALID, f"base URL must start with http:// or https://: {base_url!r}")
    if _MODEL_ID.fullmatch(base_url) is None or "?" in base_url or "#" in base_url:
        raise ProviderRefusal(Code.BASE_URL_INVALID, "base URL has whitespace, control characters, a query or a fragment")
    return base_url.rstrip("/")


def check_model(model: str, *, forbid: str = "") -> str:
    """A model id: non-empty, no whitespace or control characters, none of `forbid`."""
    if not isinstance(model, str) or _MODEL_ID.fullmatch(model) is None or any(c in model for c in forbid):
        raise ProviderRefusal(Code.MODEL_ID_INVALID, f"model id cannot be sent: {model!r}")
    return model


def refuse_unsupported(api_shape: str, setting: str, why: str) -> Refusal:
    """The refusal for a setting this API shape cannot carry."""
    return ProviderRefusal(Code.SETTING_UNSUPPORTED, f"{api_shape} cannot send {setting}: {why}", setting=setting)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def valid_settings(api_shape: str, s: GenerationSettings, *, max_temperature: float) -> GenerationSettings:
    """Check the types and ranges every API shape shares; returns `s` unchanged."""
    if s.max_output_tokens is not None and (
        isinstance(s.max_output_tokens, bool) or not isinstance(s.max_output_tokens, int) or s.max_output_tokens < 1
    ):
        raise refuse_unsupported(api_shape, "max_output_tokens", "must be an integer >= 1")
    if s.temperature is not None and not (_number(s.temperature) and 0 <= s.temperature <= max_temperature):
        raise refuse_unsupported(api_shape, "temperature", f"must be a number in [0, {max_temperature:g}]")
    if s.top_p is not None and not (_number(s.top_p) and 0 <= s.top_p <= 1):
        raise refuse_unsupported(api_shape, "top_p", "must be a number in [0, 1]")
    if s.seed is not None and (isinstance(s.seed, bool) or not isinstance(s.seed, int)):
        raise refuse_unsupported(api_shape, "seed", "must be an integer")
    if s.reasoning_effort is not None and not isinstance(s.reasoning_effort, str):
        raise refuse_unsupported(api_shape, "reasoning_effort", "must be a string")
    if s.system is not None and not isinstance(s.system, str):
        raise refuse_unsupported(api_shape, "system", "must be a string")
    return s


def make_request(
    api_shape: str,
    model: str,
    url: str,
    body: dict[str, Any],
    headers: tuple[tuple[str, str], ...],
    credential_header: str,
    credential_prefix: str = "",
) -> ProviderRequest:
    """The exact request: `body` as canonical JSON bytes and their sha256."""
    data = canonical_bytes(body)
    return ProviderRequest(
        api_shape=api_shape,
        model=model,
        url=url,
        body=data,
        body_sha256=sha256_hex(data),
        headers=(("content-type", "application/json"), *headers),
        credential_header=credential_header,
        credential_prefix=credential_prefix,
    )


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers with lower-cased names (HTTP names are case-insensitive); non-strings are dropped."""
    try:
        items = list(headers.items())
    except Exception:  # not a mapping after all: no headers
        return {}
    return {k.lower(): v for k, v in items if isinstance(k, str) and isinstance(v, str)}


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value from lower-cased `headers`, or None when absent or empty."""
    value = headers.get(name)
    return value or None


def decode_json(raw: bytes) -> tuple[Any, str | None]:
    """(the decoded body, None), or (None, why it is not strict JSON)."""
    if not isinstance(raw, (bytes, bytearray)):
        return None, "response body is not bytes"
    if not raw:
        return None, "empty response body"
    try:
        return loads_strict(bytes(raw), expect_object=False), None
    except Refusal as exc:
        return None, truncate(f"response body is not strict JSON ({exc.code}: {exc.message})")


def string_or_none(value: Any) -> str | None:
    """`value` when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def str_or_none(value: Any) -> str | None:
    """`value` when it is a string (even empty), else None: how the wire log reads a field."""
    return value if isinstance(value, str) else None


def first(value: Any) -> Any:
    """The first item of a non-empty list, else None."""
    return value[0] if isinstance(value, list) and value else None


def failure(
    code: str,
    message: str,
    *,
    text: str | None = None,
    finish_reason: str | None = None,
    model_snapshot: str | None = None,
    request_id: str | None = None,
    usage: TokenUsage | None = None,
) -> ParsedResponse:
    """A response that cannot be used, with its stable error code and a short message."""
    return ParsedResponse(
        text=text,
        finish_reason=finish_reason,
        model_snapshot=model_snapshot,
        request_id=request_id,
        usage=usage,
        error_code=code,
        error_message=truncate(message),
    )


def answer(
    text: str | None,
    finish_reason: str | None,
    model_snapshot: str | None,
    request_id: str | None,
    usage: TokenUsage | None,
    *,
    filtered: str | None = None,
) -> ParsedResponse:
    """A response's answer; with `filtered` (why) a `content_filter` failure that keeps text and usage."""
    if filtered is None:
        return ParsedResponse(text, finish_reason, model_snapshot, request_id, usage)
    return failure(
        "content_filter",
        filtered,
        text=text,
        finish_reason=finish_reason,
        model_snapshot=model_snapshot,
        request_id=request_id,
        usage=usage,
    )
