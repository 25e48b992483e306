"""What a raw provider exchange says about itself, derived only from its bytes.

The manual: docs/models.md.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from harness.errors import Refusal
from harness.evidence.jsonio import loads_strict
from harness.meter.usage import API_SHAPES, TokenUsage, usage_from_response

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

_GEMINI_MODEL: Final = re.compile(r"/models/([^/:]+):(?:stream)?[Gg]enerate[Cc]ontent$")


@dataclass(frozen=True)
class Described:
    """Usage (None: unknown), finish reason, returned model snapshot and request id of a response."""

    usage: TokenUsage | None
    finish_reason: str | None = None
    model_snapshot: str | None = None
    request_id: str | None = None
    json_ok: bool = False


def api_shape_for_path(method: str, path: str) -> str:
    """The API shape a request path speaks, or "unknown" (only POSTs are provider exchanges)."""
    p = urlsplit(path).path.rstrip("/")
    if method.upper() != "POST":
        return "unknown"
    if p.endswith("/chat/completions"):
        return "openai_chat"
    if p.endswith("/responses"):
        return "openai_responses"
    if p.endswith("/messages"):
        return "anthropic_messages"
    if p.endswith(":generateContent") or p.endswith(":streamGenerateContent"):
        return "gemini_generate"
    return "unknown"


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = loads_strict(raw)
    except Refusal:
        return None
    return value if isinstance(value, dict) else None


def model_from_request(path: str, body: bytes) -> str | None:
    """The model a request names: the body's `model`, else a Gemini `/models/<m>:...` path."""
    doc = _json_object(body)
    if doc is not None and isinstance(doc.get("model"), str):
        return str(doc["model"])
    found = _GEMINI_MODEL.search(urlsplit(path).path)
    return found.group(1) if found else None


def request_streams(api_shape: str, url: str, body: bytes) -> bool:
    """True when the request asks for a streamed response."""
    if api_shape == "gemini_generate":
        return urlsplit(url).path.endswith(":streamGenerateContent")
    doc = _json_object(body)
    return doc is not None and doc.get("stream") is True


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


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else None


def _finish(api_shape: str, doc: Mapping[str, Any]) -> str | None:
    if api_shape == "openai_chat":
        choice = _first(doc.get("choices"))
        return _str(choice.get("finish_reason")) if isinstance(choice, dict) else None
    if api_shape == "openai_responses":
        details = doc.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            return str(details["reason"])
        return _str(doc.get("status"))
    if api_shape == "anthropic_messages":
        return _str(doc.get("stop_reason"))
    candidate = _first(doc.get("candidates"))
    return _str(candidate.get("finishReason")) if isinstance(candidate, dict) else None


def _identity(api_shape: str, doc: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(model snapshot, request id) a response body reports."""
    if api_shape == "gemini_generate":
        return _str(doc.get("modelVersion")), _str(doc.get("responseId"))
    return _str(doc.get("model")), _str(doc.get("id"))


def _sse_data(text: str) -> list[str]:
    """The data payloads of server-sent events (multi-line data joined with newlines)."""
    events: list[str] = []
    data: list[str] = []
    for line in text.splitlines():
        if not line:
            if data:
                events.append("\n".join(data))
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        events.append("\n".join(data))
    return [e for e in events if e.strip() != "[DONE]"]


def _stream_docs(raw: bytes) -> list[dict[str, Any]] | None:
    """The JSON objects a stream carried, in order; None when any is malformed."""
    try:
        text = raw.decode("utf-8", "strict")
    except UnicodeDecodeError:
        return None
    if text.lstrip().startswith("["):  # Gemini without alt=sse: one JSON array, streamed
        try:
            value = loads_strict(text.encode("utf-8"), expect_object=False)
        except Refusal:
            return None
        items = value if isinstance(value, list) else None
    else:
        items = []
        for payload in _sse_data(text):
            try:
                items.append(loads_strict(payload.encode("utf-8"), expect_object=False))
            except Refusal:
                return None
    if items is None or not all(isinstance(item, dict) for item in items):
        return None
    return items


def _describe_stream(api_shape: str, raw: bytes) -> Described:
    docs = _stream_docs(raw)
    if docs is None:
        return Described(None)
    usage: TokenUsage | None = None
    finish = snapshot = request_id = None
    if api_shape == "anthropic_messages":
        merged: dict[str, Any] | None = None
        saw_delta = False
        for doc in docs:
            if doc.get("type") == "message_start" and isinstance(doc.get("message"), dict):
                message = doc["message"]
                snapshot, request_id = _identity(api_shape, message)
                if isinstance(message.get("usage"), dict):
                    merged = dict(message["usage"])
            elif doc.get("type") == "message_delta" and merged is not None:
                if isinstance(doc.get("usage"), dict):
                    merged.update(doc["usage"])
                    saw_delta = True
                delta = doc.get("delta")
                if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                    finish = str(delta["stop_reason"])
        if saw_delta:
            usage = usage_from_response(api_shape, {"usage": merged})
        return Described(usage, finish, snapshot, request_id, True)
    for doc in docs:
        body = doc.get("response") if api_shape == "openai_responses" else doc
        if not isinstance(body, dict):
            continue
        snap, rid = _identity(api_shape, body)
        snapshot, request_id = snap or snapshot, rid or request_id
        finish = _finish(api_shape, body) or finish
        key = "usageMetadata" if api_shape == "gemini_generate" else "usage"
        if body.get(key) is not None:
            usage = usage_from_response(api_shape, body)
    return Described(usage, finish, snapshot, request_id, True)


def describe_response(
    api_shape: str, raw: bytes, *, stream: bool = False, content_encoding: str | None = None
) -> Described:
    """Usage and identity of a raw response body of `api_shape` ("unknown" describes nothing)."""
    if api_shape not in API_SHAPES:
        return Described(None)
    body = decode_content(raw, content_encoding)
    if body is None:
        return Described(None)
    if stream:
        return _describe_stream(api_shape, body)
    doc = _json_object(body)
    if doc is None:
        return Described(None)
    snapshot, request_id = _identity(api_shape, doc)
    return Described(usage_from_response(api_shape, doc), _finish(api_shape, doc), snapshot, request_id, True)
