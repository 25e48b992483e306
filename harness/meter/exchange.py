"""What a raw provider exchange says about itself, derived only from its bytes.

The wire log and the proxy use these pure functions so that the usage written
with a record is re-derived, identically, when the record is read back:
metering trusts the raw response, not a field anyone could have edited.

Everything that depends on an API shape (its URL path, whether a request
streams, its usage and streamed usage, its finish reason) is asked of the
shape's adapter through `harness.providers.registry`; this module only
undoes content codings, frames streams and redacts URLs. Any malformed
stream event makes the whole stream's usage unknown.
"""


from __future__ import annotations

import zlib
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from harness.providers import registry
from harness.providers.base import Described
from harness.providers.streams import json_object, stream_docs

__all__ = [
    "SECRET_QUERY_KEYS",
    "Described",
    "api_shape_for_path",
    "describe_response",
    "error_code_for_status",
    "model_from_request",
    "redact_url",
    "request_streams",
]

SECRET_QUERY_KEYS: Final = frozenset({"key", "api_key", "apikey", "api-key", "access_token", "token"})
"""Query parameters that carry credentials (Gemini accepts `?key=`): redacted from recorded URLs."""


def api_shape_for_path(method: str, path: str) -> str:
    """The API shape a request path speaks, or "unknown" (only POSTs are provider exchanges)."""
    return registry.shape_for_path(method, path)


def model_from_request(path: str, body: bytes) -> str | None:
    """The model a request names: the body's `model`, else the one its URL path names."""
    return registry.model_from_request(path, body)


def request_streams(api_shape: str, url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response."""
    return registry.request_streams(api_shape, url, body)


def redact_url(url: str) -> str:
    """`url` without user info and with credential query values replaced by REDACTED."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    if not parts.query:
        return urlunsplit((parts.scheme, netloc, parts.path, "", parts.fragment))
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    clean = [(k, "REDACTED" if k.lower() in SECRET_QUERY_KEYS else v) for k, v in pairs]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(clean), parts.fragment))


def error_code_for_status(status: int | None) -> str | None:
    """A coarse `error_code` from the HTTP status alone (adapters classify bodies more finely)."""
    if status is None or 200 <= status < 300:
        return None
    if status in (401, 403):
        return "auth"
    if status == 402:
        return "billing"
    if status == 408:
        return "timeout"
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "server_error"
    return "bad_request"


def decode_content(raw: bytes, content_encoding: str | None) -> bytes | None:
    """The body without its content coding (gzip, deflate); None when it cannot be decoded."""
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("", "identity"):
        return raw
    try:
        if coding in ("gzip", "x-gzip"):
            return zlib.decompress(raw, 16 + zlib.MAX_WBITS)
        if coding == "deflate":
            try:
                return zlib.decompress(raw)
            except zlib.error:
                return zlib.decompress(raw, -zlib.MAX_WBITS)
    except zlib.error:
        return None
    return None


def describe_response(
    api_shape: str, raw: bytes, *, stream: bool = False, content_encoding: str | None = None
) -> Described:
    """Usage and identity of a raw response body of `api_shape` ("unknown" describes nothing)."""
    adapter = registry.find_adapter(api_shape)
    if adapter is None:
        return Described(None)
    body = decode_content(raw, content_encoding)
    if body is None:
        return Described(None)
    if stream:
        docs = stream_docs(body)
        return Described(None) if docs is None else adapter.describe_stream(docs)
    doc = json_object(body)
    return Described(None) if doc is None else adapter.describe(doc)
