"""The wire log: one chained JSONL line per provider exchange, and metering from it.

The manual: docs/models.md.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.errors import Code, MeterRefusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.evidence.group import GroupLog, GroupWriter
from harness.evidence.jsonio import sha256_hex
from harness.meter.cost import Cost, meter, total_cost
from harness.meter.exchange import (
    decode_content,
    describe_response,
    error_code_for_status,
    redact_url,
    request_streams,
)
from harness.meter.pricing import PricingTable
from harness.providers.base import ERROR_CODES, Exchange
from harness.providers.registry import find_adapter, free_path
from harness.records.usage import CATEGORIES, TokenUsage

__all__ = [
    "SEED_PREFIX",
    "WIRE_ERROR_CODES",
    "WIRE_KIND",
    "WireLog",
    "WireRecord",
    "WireTotals",
    "decode_body",
    "encode_body",
    "exchange_cost",
    "exchange_error_code",
    "meter_wire",
    "read_wire",
    "wire_seed",
]

SEED_PREFIX: Final = "proctor-wire:"
WIRE_KIND: Final = "wire-exchange.v1"
VIAS: Final = ("direct", "proxy")
BUDGET_STOP: Final = "budget_stop"
"""The error code of an exchange the proxy answered itself (402) and never sent upstream (`harness.meter.allowance`)."""
WIRE_ERROR_CODES: Final = (*ERROR_CODES, BUDGET_STOP)
_FIELDS: Final = frozenset({
    "kind", "api_shape", "model", "method", "url", "request_body", "request_sha256", "status",
    "response_raw", "response_sha256", "content_encoding", "stream", "started", "ended", "latency_s",
    "request_id", "model_snapshot", "finish_reason", "usage", "usage_unknown", "error_code", "via",
    "redacted",
})
_MIN_SECRET: Final = 8
"""Shorter credential values are not scrubbed from bodies (they would match ordinary text)."""

PathArg = str | os.PathLike[str]


def wire_seed(name: str) -> str:
    """The seed of the wire log called `name`."""
    return f"{SEED_PREFIX}{name}"


def encode_body(data: bytes) -> str | dict[str, str]:
    """Bytes as recorded: the text when strict UTF-8, else {"base64": ...}."""
    try:
        return data.decode("utf-8", "strict")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def decode_body(value: Any) -> bytes:
    """The bytes a recorded body stands for; ValueError when it is neither form."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"bad base64: {exc}") from None
    raise ValueError("a body must be a string or {\"base64\": ...}")


@dataclass(frozen=True)
class WireRecord:
    """One verified exchange read back from a wire log (`line` is 1-based)."""

    line: int
    api_shape: str
    model: str | None
    method: str
    url: str
    request_body: bytes
    status: int | None
    response_raw: bytes
    content_encoding: str | None
    stream: bool
    started: float
    ended: float
    latency_s: float
    request_id: str | None
    model_snapshot: str | None
    finish_reason: str | None
    usage: TokenUsage | None
    error_code: str | None
    via: str
    redacted: bool = False

    @property
    def sent(self) -> bool:
        """False for a budget stop: the proxy answered the request itself and sent nothing upstream."""
        return self.error_code != BUDGET_STOP


def _scrub(data: bytes, secrets: Iterable[bytes]) -> tuple[bytes, bool]:
    """`data` with every secret replaced by REDACTED, and whether any was found."""
    hit = False
    for secret in secrets:
        if secret in data:
            data, hit = data.replace(secret, b"REDACTED"), True
    return data, hit


def _record(
    *, api_shape: str, model: str | None, method: str, url: str, request_body: bytes, status: int | None,
    response_raw: bytes, content_encoding: str | None, stream: bool, started: float, ended: float,
    latency_s: float, request_id: str | None, model_snapshot: str | None, finish_reason: str | None,
    usage: TokenUsage | None, error_code: str | None, via: str, redacted: bool = False,
) -> dict[str, Any]:
    if via not in VIAS:
        raise MeterRefusal(Code.WIRE_RECORD_INVALID, f"via must be one of {VIAS}, not {via!r}")
    if error_code is not None and error_code not in WIRE_ERROR_CODES:
        raise MeterRefusal(Code.WIRE_RECORD_INVALID, f"unknown error_code {error_code!r}")
    if error_code == BUDGET_STOP and (via != "proxy" or status != 402 or usage is not None):
        raise MeterRefusal(Code.WIRE_RECORD_INVALID, "a budget stop is the proxy's own 402, without usage")
    return {
        "kind": WIRE_KIND,
        "api_shape": api_shape if find_adapter(api_shape) is not None else "unknown",
        "model": model,
        "method": method.upper(),
        "url": redact_url(url),
        "request_body": encode_body(request_body),
        "request_sha256": sha256_hex(request_body),
        "status": status,
        "response_raw": encode_body(response_raw),
        "response_sha256": sha256_hex(response_raw),
        "content_encoding": content_encoding,
        "stream": stream,
        "started": started,
        "ended": ended,
        "latency_s": latency_s,
        "request_id": request_id,
        "model_snapshot": model_snapshot,
        "finish_reason": finish_reason,
        "usage": None if usage is None else usage.to_json(),
        "usage_unknown": usage is None,
        "error_code": error_code,
        "via": via,
        "redacted": redacted,
    }


def _header(headers: Mapping[str, str] | None, *names: str) -> str | None:
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    for name in names:
        if name in lower:
            return lower[name]
    return None


class WireLog:
    """The writer of the wire log at `path` named `name` (seed `proctor-wire:<name>`)."""

    def __init__(self, path: PathArg, name: str, *, group: GroupWriter | None = None) -> None:
        """`group`: stage the lines through a group-commit writer (durable once its ticket is)."""
        self.path = os.fspath(path)
        self.name = name
        self._log: ChainedLog | GroupLog = (ChainedLog(self.path, wire_seed(name)) if group is None
                                            else group.log(self.path, wire_seed(name)))

    def _append(self, record: dict[str, Any]) -> dict[str, Any]:
        if isinstance(self._log, GroupLog):
            return self._log.stage(record)
        return self._log.append(record)

    @property
    def appended(self) -> int:
        """Records this writer appended (counted in memory, not read back from the file)."""
        return self._log.appended

    @property
    def appended_head(self) -> str | None:
        """The sha256 of the last line this writer appended (None before the first)."""
        return self._log.appended_head

    def append_exchange(self, exchange: Exchange, via: str = "direct") -> dict[str, Any]:
        """Record an adapter's exchange; its `raw_response` is taken as the decoded body."""
        req = exchange.request
        stream = request_streams(req.api_shape, req.url, req.body)
        derived = describe_response(req.api_shape, exchange.raw_response, stream=stream)
        parsed = exchange.parsed
        return self._append(_record(
            api_shape=req.api_shape, model=req.model, method="POST", url=req.url, request_body=req.body,
            status=exchange.status, response_raw=exchange.raw_response, content_encoding=None, stream=stream,
            started=exchange.started, ended=exchange.ended, latency_s=exchange.latency_s,
            request_id=parsed.request_id or derived.request_id,
            model_snapshot=parsed.model_snapshot or derived.model_snapshot,
            finish_reason=parsed.finish_reason or derived.finish_reason,
            usage=derived.usage, error_code=parsed.error_code, via=via,
        ))

    def append_raw(
        self, api_shape: str, model: str | None, url: str, request_body: bytes, status: int | None,
        response_raw: bytes, started: float, ended: float, via: str = "proxy", *,
        method: str = "POST", stream: bool | None = None, latency_s: float | None = None,
        response_headers: Mapping[str, str] | None = None, error_code: str | None = None,
        secrets: Iterable[str] = (),
    ) -> dict[str, Any]:
        """Record an exchange seen as bytes (the proxy's form); usage is parsed from the body.

        Args:
            stream: whether the response was streamed (default: what the request asked for).
            response_headers: used only to read the request id and content coding; never recorded.
            error_code: the failure when there was no response (transport, timeout); otherwise
                derived from the status and body.
            secrets: credential values the client sent: scrubbed from everything recorded
                (an upstream may echo a key in an error body or a header).
        """
        hidden = sorted({x.encode("utf-8") for x in secrets if len(x) >= _MIN_SECRET}, key=len, reverse=True)
        request_body, hit_req = _scrub(request_body, hidden)
        response_raw, hit_resp = _scrub(response_raw, hidden)
        url_bytes, hit_url = _scrub(redact_url(url).encode("utf-8"), hidden)
        url = url_bytes.decode("utf-8")
        redacted = hit_req or hit_resp or hit_url
        if stream is None:
            stream = request_streams(api_shape, url, request_body)
        coding = _header(response_headers, "content-encoding")
        coding = None if coding is None or coding.strip().lower() in ("", "identity") else coding
        derived = describe_response(api_shape, response_raw, stream=stream, content_encoding=coding)
        if error_code is None:
            error_code = error_code_for_status(status)
        if error_code is None and find_adapter(api_shape) is not None and status is not None and not derived.json_ok:
            error_code = "malformed_response"
        request_id = _header(response_headers, "x-request-id", "request-id") or derived.request_id
        if request_id is not None:
            scrubbed, hit = _scrub(request_id.encode("utf-8", "surrogateescape"), hidden)
            request_id, redacted = scrubbed.decode("utf-8", "replace"), redacted or hit
        return self._append(_record(
            api_shape=api_shape, model=model, method=method, url=url, request_body=request_body,
            status=status, response_raw=response_raw, content_encoding=coding, stream=stream,
            started=started, ended=ended, latency_s=ended - started if latency_s is None else latency_s,
            request_id=request_id, model_snapshot=derived.model_snapshot, finish_reason=derived.finish_reason,
            usage=derived.usage, error_code=error_code, via=via, redacted=redacted,
        ))


# --- reading ---------------------------------------------------------------------------------


def _opt_str(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc[key]
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a string or null")
    return value


def _number(doc: Mapping[str, Any], key: str) -> float:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number")
    return float(value)


def _usage(value: Any) -> TokenUsage | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(CATEGORIES):
        raise ValueError(f"usage must have exactly the categories {CATEGORIES}")
    for c in CATEGORIES:
        if isinstance(value[c], bool) or not isinstance(value[c], int) or value[c] < 0:
            raise ValueError(f"usage.{c} must be a non-negative integer")
    return TokenUsage(**value)


def _parse_record(doc: dict[str, Any], line: int) -> WireRecord:
    keys = set(doc) - {"prev", "seed"}
    if keys != _FIELDS:
        missing, extra = sorted(_FIELDS - keys), sorted(keys - _FIELDS)
        raise ValueError(f"missing {missing}" if missing else f"unknown keys {extra}")
    if doc["kind"] != WIRE_KIND:
        raise ValueError(f"kind must be {WIRE_KIND!r}")
    shape = doc["api_shape"]
    if shape != "unknown" and find_adapter(shape) is None:
        raise ValueError(f"unknown api_shape {shape!r}")
    if doc["via"] not in VIAS:
        raise ValueError(f"via must be one of {VIAS}")
    status = doc["status"]
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
        raise ValueError("status must be an integer or null")
    for flag in ("stream", "usage_unknown", "redacted"):
        if not isinstance(doc[flag], bool):
            raise ValueError(f"{flag} must be a boolean")
    if not isinstance(doc["method"], str) or not isinstance(doc["url"], str):
        raise ValueError("method and url must be strings")
    error_code = _opt_str(doc, "error_code")
    if error_code is not None and error_code not in WIRE_ERROR_CODES:
        raise ValueError(f"unknown error_code {error_code!r}")
    if error_code == BUDGET_STOP and (doc["via"] != "proxy" or status != 402 or doc["usage"] is not None):
        raise ValueError("a budget stop must be the proxy's own 402, without usage")
    request_body, response_raw = decode_body(doc["request_body"]), decode_body(doc["response_raw"])
    if sha256_hex(request_body) != doc["request_sha256"]:
        raise ValueError("request_sha256 does not match request_body")
    if sha256_hex(response_raw) != doc["response_sha256"]:
        raise ValueError("response_sha256 does not match response_raw")
    usage = _usage(doc["usage"])
    if doc["usage_unknown"] != (usage is None):
        raise ValueError("usage_unknown disagrees with usage")
    coding = _opt_str(doc, "content_encoding")
    derived = describe_response(shape, response_raw, stream=doc["stream"], content_encoding=coding)
    if derived.usage != usage:
        raise ValueError("usage does not match what the raw response reports")
    return WireRecord(
        line, shape, _opt_str(doc, "model"), doc["method"], doc["url"], request_body, status, response_raw,
        coding, doc["stream"], _number(doc, "started"), _number(doc, "ended"), _number(doc, "latency_s"),
        _opt_str(doc, "request_id"), _opt_str(doc, "model_snapshot"), _opt_str(doc, "finish_reason"),
        usage, error_code, doc["via"], doc["redacted"],
    )


def read_wire(path: PathArg, name: str | None = None) -> list[WireRecord]:
    """Every record of a verified wire log (refuses a broken chain or an invalid record).

    With `name`, the log must carry seed `proctor-wire:<name>`; without, any wire seed.
    """
    p = os.fspath(path)
    docs = read_log(p, None if name is None else wire_seed(name))
    if docs and not str(docs[0].get("seed", "")).startswith(SEED_PREFIX):
        raise MeterRefusal(Code.WIRE_SEED_MISMATCH, f"not a wire log: seed {docs[0].get('seed')!r}", p, line=1)
    records = []
    for line, doc in enumerate(docs, start=1):
        if doc.get("event") == "log_repair":  # a recorded torn-tail repair, not an exchange
            continue
        try:
            records.append(_parse_record(doc, line))
        except (ValueError, TypeError, KeyError) as exc:
            raise MeterRefusal(Code.WIRE_RECORD_INVALID, f"line {line}: {exc}", p, line=line) from None
    return records


def exchange_error_code(rec: WireRecord) -> str | None:
    """The error code of one recorded exchange, read from its status and bytes by its shape's adapter exactly as
    a completion's response is (`Provider.parse_response`: the body, not the status alone). The record's own
    code where there is nothing for an adapter to read: a budget stop, no response (transport, timeout), an
    unknown shape, a streamed success, a content coding that does not decode. docs/models.md ("The wire log")."""
    adapter = find_adapter(rec.api_shape)
    if not rec.sent or rec.status is None or adapter is None or (rec.stream and 200 <= rec.status < 300):
        return rec.error_code
    raw = decode_content(rec.response_raw, rec.content_encoding)
    if raw is None:
        return rec.error_code
    return adapter.parse_response(rec.status, {}, raw).error_code


# --- metering --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WireTotals:
    """What a wire log meters to.

    Attributes:
        tokens: tokens by category summed over the exchanges whose usage is known.
        cost: the total (None when any metered exchange is unknown), with the known partial sum.
        metered: exchanges metered (known or unknown); `usage_unknown`/`price_unknown` count among them.
        errors_unbilled: refused requests (non-2xx) whose body reported no usage.
        budget_stops: requests the proxy stopped itself (never sent upstream, $0; not in `errors_unbilled`).
        not_metered: GET/HEAD/OPTIONS and token-counting requests.
        by_model: per model: requests, tokens and cost.
    """

    records: int
    metered: int
    tokens: TokenUsage
    cost: Cost
    errors_unbilled: int
    not_metered: int
    pricing_sha256: str
    by_model: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    budget_stops: int = 0

    @property
    def usage_unknown(self) -> int:
        return self.cost.usage_unknown

    @property
    def price_unknown(self) -> int:
        return self.cost.price_unknown

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "metered": self.metered,
            "tokens": self.tokens.to_json(),
            "cost": self.cost.to_json(),
            "usage_unknown": self.usage_unknown,
            "price_unknown": self.price_unknown,
            "errors_unbilled": self.errors_unbilled,
            "budget_stops": self.budget_stops,
            "not_metered": self.not_metered,
            "pricing_sha256": self.pricing_sha256,
            "by_model": {k: dict(v) for k, v in self.by_model.items()},
        }


def _disposition(rec: WireRecord) -> str:
    """"meter", "error" (refused, unbilled), "stop" (a budget stop: not sent) or "skip" (not a billable exchange)."""
    if not rec.sent:
        return "stop"
    if rec.api_shape == "unknown":
        path = rec.url.split("?", 1)[0].rstrip("/")
        if rec.method in ("GET", "HEAD", "OPTIONS") or free_path(path):
            return "skip"
        return "meter"
    if rec.status is not None and not 200 <= rec.status < 300 and rec.usage is None:
        return "error"
    return "meter"


def meter_wire(
    records: Iterable[WireRecord], pricing: PricingTable, keys: Mapping[str, str] | None = None
) -> WireTotals:
    """Meter verified wire records with `pricing`; `keys` maps a model to its pricing key (default: itself)."""
    items = list(records)
    mapping = keys or {}
    costs: list[Cost] = []
    per_model: dict[str, list[tuple[TokenUsage | None, Cost]]] = {}
    errors = skipped = stops = 0
    for rec in items:
        kind = _disposition(rec)
        if kind == "skip":
            skipped += 1
            continue
        if kind == "stop":
            stops += 1
            continue
        if kind == "error":
            errors += 1
            continue
        key = None if rec.model is None else mapping.get(rec.model, rec.model)
        cost = meter(rec.usage, pricing.get(key))
        costs.append(cost)
        per_model.setdefault(rec.model or "(unknown)", []).append((rec.usage, cost))
    tokens = sum((u for u, _ in (p for ps in per_model.values() for p in ps) if u is not None), TokenUsage())
    by_model = {
        model: {
            "pricing_key": None if model == "(unknown)" else mapping.get(model, model),
            "requests": len(pairs),
            "tokens": sum((u for u, _ in pairs if u is not None), TokenUsage()).to_json(),
            "cost": total_cost(c for _, c in pairs).to_json(),
        }
        for model, pairs in sorted(per_model.items())
    }
    return WireTotals(len(items), len(costs), tokens, total_cost(costs), errors, skipped, pricing.sha256, by_model,
                      stops)  # fmt: skip


def exchange_cost(written: Mapping[str, Any], pricing: PricingTable, keys: Mapping[str, str] | None = None) -> float | None:
    """What one record just appended (`WireLog.append_raw`'s line) meters to, as `meter_wire` would; None: unknown."""
    try:
        rec = _parse_record(dict(written), 0)
    except (ValueError, TypeError, KeyError):
        return None
    return meter_wire([rec], pricing, keys).cost.total

