"""Reading a raw response the way the wire log does: one JSON object, or a stream of them.

A stream is server-sent events, or one streamed JSON array (Gemini without
`alt=sse`). Its usage is known only when the stream itself reports it, and
any malformed event makes the whole stream's usage unknown: each adapter's
`describe_stream` says which events carry what.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.errors import Refusal
from harness.evidence.jsonio import loads_strict
from harness.providers.base import Described

__all__ = ["body_asks_stream", "fold_stream", "json_object", "stream_docs"]


def json_object(raw: bytes) -> dict[str, Any] | None:
    """`raw` as a strict JSON object, or None."""
    try:
        value = loads_strict(raw)
    except Refusal:
        return None
    return value if isinstance(value, dict) else None


def body_asks_stream(body: bytes) -> bool:
    """True when a JSON request body says `"stream": true`."""
    doc = json_object(body)
    return doc is not None and doc.get("stream") is True


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


def stream_docs(raw: bytes) -> list[dict[str, Any]] | None:
    """The JSON objects a stream carried, in order; None when any is malformed."""
    try:
        text = raw.decode("utf-8", "strict")
    except UnicodeDecodeError:
        return None
    if text.lstrip().startswith("["):  # one JSON array, streamed
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


def fold_stream(
    docs: list[dict[str, Any]],
    describe: Callable[[Mapping[str, Any]], Described],
    *,
    usage_key: str,
    body_of: Callable[[dict[str, Any]], Any] = lambda doc: doc,
) -> Described:
    """A stream whose events each look like a whole response (`body_of` an event):
    the last snapshot, request id and finish reason seen, and the usage of the
    last body carrying `usage_key`."""
    usage = finish = snapshot = request_id = None
    for doc in docs:
        body = body_of(doc)
        if not isinstance(body, dict):
            continue
        described = describe(body)
        snapshot = described.model_snapshot or snapshot
        request_id = described.request_id or request_id
        finish = described.finish_reason or finish
        if body.get(usage_key) is not None:
            usage = described.usage
    return Described(usage, finish, snapshot, request_id, True)
