"""The proxy's relay: one client exchange forwarded upstream and recorded in the wire log.

The manual: docs/models.md.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

import httpx

from harness.errors import Refusal
from harness.evidence.clock import Clock
from harness.meter.allowance import (
    BUDGET_STOP_STATUS,
    AllowanceLedger,
    budget_stop_body,
    worst_case,
)
from harness.meter.exchange import (
    SECRET_QUERY_KEYS,
    api_shape_for_path,
    model_from_request,
    redact_url,
    request_streams,
)
from harness.meter.wire import BUDGET_STOP, WireLog, exchange_cost
from harness.providers.registry import free_path

__all__ = ["CREDENTIAL_HEADERS", "HOP_BY_HOP", "MAX_REQUEST_BYTES", "ProxyServer", "UnixProxyServer"]

HOP_BY_HOP: Final = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
CREDENTIAL_HEADERS: Final = frozenset({
    "authorization", "x-api-key", "x-goog-api-key", "api-key", "proxy-authorization", "cookie",
})
"""Headers whose values are credentials: forwarded (except proxy ones), never recorded, and
scrubbed from any recorded bytes that echo them."""
MAX_REQUEST_BYTES: Final = 64 * 1024 * 1024


def _error_body(message: str, code: str) -> bytes:
    """An OpenAI-shaped error body, which every OpenAI-compatible client can read."""
    return json.dumps({"error": {"message": message, "type": "proxy_error", "code": code}}).encode("utf-8")


class ProxyServer(ThreadingHTTPServer):
    """The loopback TCP proxy: the wire log, the upstream client, and the tally of what it recorded."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self, address: tuple[str, int], upstream: str, wire: WireLog, client: httpx.Client, base_head: str,
        ledger: AllowanceLedger | None = None,
    ) -> None:
        self.upstream_origin = upstream
        self.ledger = ledger
        """The attempt's allowance, when it has one: requests that would cross it get a budget stop."""
        self.base_head = base_head
        """The head the proxy's first line must chain onto: the log's head at start (the seed's hash if new)."""
        self.wire = wire
        self.client = client
        self.clock = Clock()
        self.cond = threading.Condition()
        self.inflight = 0
        self.closing = False
        self.exchanges = 0
        self.failures = 0
        self.write_lock = threading.Lock()
        self.wire_lines = 0
        self.wire_head: str | None = None
        self.wire_interleaved = 0
        self.conns: set[socket.socket] = set()
        super().__init__(address, _Handler)

    @contextlib.contextmanager
    def busy(self) -> Iterator[bool]:
        """Count an exchange in flight; yields False when the proxy is closing."""
        with self.cond:
            if self.closing:
                yield False
                return
            self.inflight += 1
        try:
            yield True
        finally:
            with self.cond:
                self.inflight -= 1
                self.cond.notify_all()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line on stderr instead of socketserver's traceback."""
        exc = sys.exc_info()[1]
        sys.stderr.write(f"proctor wire proxy: a connection failed: {type(exc).__name__}\n")

    def record(self, **kwargs: Any) -> dict[str, Any] | None:
        """Append one wire record and return it; on failure count it and say so on stderr (never a secret).

        What the proxy wrote is kept in memory (`wire_lines`, `wire_head`), and
        an append that did not chain onto the proxy's own previous line (for the
        first, onto the log's head when the proxy started) counts in
        `wire_interleaved`: someone else wrote to the log in between. The log's
        folder may be writable by the client (a dispatched worker), so the file
        alone cannot say what the proxy recorded.
        """
        with self.write_lock:  # appends are serialized by the log anyway; this pairs each with its head
            try:
                written = self.wire.append_raw(via="proxy", **kwargs)
            except (Refusal, OSError) as exc:
                with self.cond:
                    self.failures += 1
                sys.stderr.write(f"proctor wire proxy: could not record an exchange: {exc}\n")
                return None
            expected_prev = self.wire_head if self.wire_head is not None else self.base_head
            with self.cond:
                if written.get("prev") != expected_prev:
                    self.wire_interleaved += 1
                self.wire_lines = self.wire.appended
                self.wire_head = self.wire.appended_head
                self.exchanges += 1
        return written


class UnixProxyServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The same proxy on a Unix socket: every exchange is handled, recorded and counted by `core`."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, path: str, core: ProxyServer) -> None:
        self.core = core
        super().__init__(path, _Handler)

    def __getattr__(self, name: str) -> Any:  # upstream, wire, client, clock, busy, record, conns, ...
        return getattr(self.core, name)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.core.handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyServer
    _ticket: int | None = None
    """The allowance hold of the exchange in progress (None: no allowance, or settled)."""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the wire log is the record."""

    def setup(self) -> None:
        super().setup()
        with self.server.cond:
            self.server.conns.add(self.connection)

    def finish(self) -> None:
        with self.server.cond:
            self.server.conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    # ---- the request

    def _local_error(self, status: int, message: str, code: str, body: bytes | None = None) -> None:
        body = _error_body(message, code) if body is None else body
        with contextlib.suppress(OSError):  # the client may have gone already
            self.send_response_only(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_REQUEST_BYTES:
                    return None
                parts.append(self.rfile.read(size))
                self.rfile.readline(8)
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_REQUEST_BYTES:
            return None
        return self.rfile.read(length) if length else b""

    def _upstream_headers(self) -> list[tuple[str, str]]:
        listed = {t.strip().lower() for t in self.headers.get("Connection", "").split(",")}
        drop = HOP_BY_HOP | listed | {"host", "content-length", "accept-encoding", "expect"}
        out = [(k, v) for k, v in self.headers.items() if k.lower() not in drop]
        out.append(("Accept-Encoding", "identity"))
        return out

    def _secrets(self) -> list[str]:
        """The credential values this request carries (headers and `?key=`-style query values)."""
        found: list[str] = []
        for key, value in self.headers.items():
            if key.lower() in CREDENTIAL_HEADERS:
                found.append(value.strip())
                found.extend(part for part in value.split() if len(part) >= 8)
        query = urlsplit(self.path).query
        found.extend(v for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() in SECRET_QUERY_KEYS)
        return found

    def _forward(self) -> None:
        with self.server.busy() as open_:
            if not open_:
                self.close_connection = True
                self._local_error(503, "the metering proxy is shutting down", "proxy_closing")
                return
            if not self.path.startswith("/"):
                self.close_connection = True
                self._local_error(400, "only origin-form request paths are proxied", "proxy_bad_path")
                return
            try:
                body = self._read_body()
            except ValueError:
                body = None
            if body is None:
                self.close_connection = True
                self._local_error(413, f"request body over {MAX_REQUEST_BYTES} bytes or malformed", "proxy_bad_body")
                return
            self._exchange(body)

    def _record(self, **kwargs: Any) -> dict[str, Any] | None:
        """Record through the server; an exchange holding part of the allowance is settled at once
        (before a whole response is delivered, so the client's next request sees it settled)."""
        written = self.server.record(**kwargs)
        ledger, ticket = self.server.ledger, self._ticket
        if ledger is not None and ticket is not None:
            self._ticket = None
            cost = None if written is None else exchange_cost(written, ledger.allowance.pricing, ledger.allowance.keys)
            ledger.settle(ticket, cost)
        return written

    def _exchange(self, body: bytes) -> None:
        ledger = self.server.ledger
        method, path = self.command, self.path
        billable = method not in ("GET", "HEAD", "OPTIONS") and not free_path(urlsplit(path).path.rstrip("/"))
        if ledger is None or not billable:
            self._send_upstream(body)
            return
        shape = api_shape_for_path(method, path)
        worst, _basis = worst_case(ledger.allowance, shape, model_from_request(path, body), body)
        ticket, remaining = ledger.admit(worst)
        if ticket is None:
            self._budget_stop(body, worst, remaining)
            return
        self._ticket = ticket
        try:
            self._send_upstream(body)
        finally:
            if self._ticket is not None:  # never recorded (the handler failed): count its worst case
                self._ticket = None
                ledger.settle(ticket, None)

    def _budget_stop(self, body: bytes, worst: float, remaining: float) -> None:
        """Answer 402 `budget_stop` without sending anything upstream, and log it as not sent ($0)."""
        srv = self.server
        method, path = self.command, self.path
        url = srv.upstream_origin + path
        shape = api_shape_for_path(method, path)
        answer = budget_stop_body(worst, remaining)
        now = srv.clock.now()
        srv.record(api_shape=shape, model=model_from_request(path, body), url=url, request_body=body, method=method,
                   secrets=self._secrets(), status=BUDGET_STOP_STATUS, response_raw=answer, started=now, ended=now,
                   latency_s=0.0, stream=False, error_code=BUDGET_STOP)  # fmt: skip
        self._local_error(BUDGET_STOP_STATUS, "", BUDGET_STOP, body=answer)

    def _send_upstream(self, body: bytes) -> None:
        srv = self.server
        method, path = self.command, self.path
        url = srv.upstream_origin + path
        shape = api_shape_for_path(method, path)
        model = model_from_request(path, body)
        asked_stream = request_streams(shape, url, body)
        meta: dict[str, Any] = {
            "api_shape": shape, "model": model, "url": url, "request_body": body, "method": method,
            "secrets": self._secrets(),
        }
        started, t0 = srv.clock.now(), time.monotonic()
        try:
            request = srv.client.build_request(method, url, headers=self._upstream_headers(), content=body)
            response = srv.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            timeout = isinstance(exc, httpx.TimeoutException)
            ended, latency = srv.clock.now(), time.monotonic() - t0
            self._record(**meta, status=None, response_raw=b"", started=started, ended=ended, latency_s=latency,
                       stream=asked_stream, error_code="timeout" if timeout else "transport")
            message = f"upstream {redact_url(url)} {'timed out' if timeout else 'unreachable'}: {type(exc).__name__}"
            self._local_error(504 if timeout else 502, message, "upstream_timeout" if timeout else "upstream_unreachable")
            return
        try:
            ctype = response.headers.get("content-type", "").lower()
            no_body = method == "HEAD" or response.status_code in (204, 304) or response.status_code < 200
            if not no_body and (asked_stream or ctype.startswith("text/event-stream")):
                self._relay_stream(response, meta, started, t0)
            else:
                self._relay_whole(response, meta, started, t0, no_body, asked_stream)
        finally:
            response.close()

    def _send_head(self, response: httpx.Response, *, length: int | None, chunked: bool, keep_length: bool) -> None:
        self.send_response_only(response.status_code, response.reason_phrase or None)
        listed = {t.strip().lower() for t in response.headers.get("connection", "").split(",")}
        for raw_key, raw_value in response.headers.raw:
            key = raw_key.decode("latin-1")
            low = key.lower()
            if low in HOP_BY_HOP or low in listed or (low == "content-length" and not keep_length):
                continue
            self.send_header(key, raw_value.decode("latin-1"))
        if length is not None:
            self.send_header("Content-Length", str(length))
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _relay_whole(
        self, response: httpx.Response, meta: dict[str, Any], started: float, t0: float, no_body: bool, stream: bool
    ) -> None:
        srv = self.server
        error: str | None = None
        parts: list[bytes] = []
        try:
            if not no_body:
                parts.extend(response.iter_raw())
        except httpx.HTTPError as exc:
            error = "timeout" if isinstance(exc, httpx.TimeoutException) else "transport"
        raw = b"".join(parts)
        ended, latency = srv.clock.now(), time.monotonic() - t0
        recorded = self._record(**meta, status=response.status_code, response_raw=raw, started=started, ended=ended,
                              latency_s=latency, stream=stream, response_headers=dict(response.headers),
                              error_code=error)
        if error is not None:
            self.close_connection = True
            self._local_error(502, "the upstream response broke off", "upstream_broken")
            return
        if not recorded:
            self._local_error(502, "the metering proxy could not record this exchange", "wire_record_failed")
            return
        with contextlib.suppress(OSError):  # the client may have gone; the exchange is recorded
            if no_body:
                self._send_head(response, length=None, chunked=False, keep_length=self.command == "HEAD")
                return
            self._send_head(response, length=len(raw), chunked=False, keep_length=False)
            self.wfile.write(raw)

    def _relay_stream(self, response: httpx.Response, meta: dict[str, Any], started: float, t0: float) -> None:
        srv = self.server
        chunked = self.request_version == "HTTP/1.1"
        if not chunked:
            self.close_connection = True  # HTTP/1.0: the end of the body is the end of the connection
        parts: list[bytes] = []
        error: str | None = None
        client_ok = True
        try:
            self._send_head(response, length=None, chunked=chunked, keep_length=False)
        except OSError:
            client_ok, error = False, "transport"
        try:
            for chunk in response.iter_raw():
                if not chunk:
                    continue
                parts.append(chunk)
                if not client_ok:
                    break  # the client went away: stop reading (the provider may still bill)
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                except OSError:
                    client_ok, error = False, "transport"
                    break
        except httpx.HTTPError as exc:
            error = "timeout" if isinstance(exc, httpx.TimeoutException) else "transport"
        if client_ok and error is None and chunked:
            with contextlib.suppress(OSError):
                self.wfile.write(b"0\r\n\r\n")
        if error is not None:
            self.close_connection = True
        ended, latency = srv.clock.now(), time.monotonic() - t0
        self._record(**meta, status=response.status_code, response_raw=b"".join(parts), started=started, ended=ended,
                   latency_s=latency, stream=True, response_headers=dict(response.headers), error_code=error)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward
