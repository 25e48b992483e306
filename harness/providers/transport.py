"""The one HTTP transport every adapter's request goes through (sync and async).

The manual: docs/models.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Final

import h11
import httpx

from harness._version import __version__
from harness.errors import Code, ProviderRefusal
from harness.evidence.jsonio import sha256_hex
from harness.providers.base import Exchange, ProviderRequest
from harness.providers.common import failure, truncate
from harness.providers.credentials import check_credential, redact_raw, scrub, scrub_parsed
from harness.providers.registry import adapter_for

__all__ = ["Transport"]

# What httpx.Client sent (its defaults, then ours), in its order and spelling.
_DEFAULT_HEADERS: Final = {
    "Accept": "*/*", "Connection": "keep-alive", "accept-encoding": "identity", "user-agent": f"proctor/{__version__}",
}
# Failures that are the network's, not the program's: httpx.TransportError covers
# connect/read/write errors, protocol errors and timeouts; DecodingError is a body
# the server mangled; InvalidURL is a URL httpx cannot send to.
_NETWORK_ERRORS: Final = (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL)
# Failures before a byte of the request was written: the provider never saw it, so it costs nothing.
# Connecting (DNS, refused, unreachable, the TLS handshake: httpcore and `_AsyncConnection._connect`
# raise ConnectError or ConnectTimeout), a URL that cannot be sent to, no free connection in time.
# A failure after that (writing, reading, a cut connection) may have been billed: "sent".
_NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL,
                    httpx.PoolTimeout)
_HEADS_KEPT: Final = 4096  # request heads' parts kept for reuse (`Transport._head`); more clears them and starts again
_KEEPALIVE_S: Final = 5.0  # httpx's keep-alive expiry: an idle connection older than this is not reused


def _headers(request: ProviderRequest, credential: str | None) -> httpx.Headers:
    headers = httpx.Headers(_DEFAULT_HEADERS)
    headers.update(request.headers)  # case-insensitive: the adapter's value wins
    if request.credential_header is not None and credential is not None:
        headers[request.credential_header] = request.credential_prefix + credential
    return headers


def _received(
    request: ProviderRequest, status: int, http_version: str, response_headers: httpx.Headers, raw: bytes,
    started: float, ended: float, secret: str | None,
) -> Exchange:
    """The Exchange for a response that arrived (`raw`: its body, decoded), scrubbed of the credential."""
    meta: dict[str, Any] = {"http_version": http_version}
    raw, redacted = redact_raw(raw, secret)
    if redacted:
        meta["credential_redacted"] = True
    headers = {str(scrub(k, secret)): str(scrub(v, secret)) for k, v in response_headers.items()}
    parsed = adapter_for(request.api_shape).parse_response(status, headers, raw)
    return Exchange(
        request=request,
        status=status,
        raw_response=raw,
        response_sha256=sha256_hex(raw),
        response_headers=headers,
        started=started,
        ended=ended,
        parsed=scrub_parsed(parsed, secret),
        meta=meta,
    )


def _failed(
    request: ProviderRequest, exc: Exception, started: float, ended: float, status_seen: int | None, secret: str | None
) -> Exchange:
    """The Exchange for a failure before a whole response arrived: status None, no body.

    `meta["sent"]` is False when the request never left (`_NOT_SENT`), else True.
    """
    if isinstance(exc, httpx.TimeoutException):
        code = "timeout"
    elif isinstance(exc, httpx.DecodingError):  # the server compressed a body it then mangled
        code = "malformed_response"
    else:
        code = "transport"
    message = scrub(f"POST {request.url}: {type(exc).__name__}: {exc}", secret) or ""
    meta: dict[str, Any] = {"exception": type(exc).__name__, "sent": not isinstance(exc, _NOT_SENT)}
    if status_seen is not None:
        meta["status_before_failure"] = status_seen
    return Exchange(
        request=request,
        status=None,
        raw_response=b"",
        response_sha256=sha256_hex(b""),
        response_headers={},
        started=started,
        ended=ended,
        parsed=failure(code, truncate(message)),
        meta=meta,
    )


class _Clock:
    """Wall-clock start (`time.time()`) and an end that is never before it (monotonic duration)."""

    def __init__(self) -> None:
        self.started = time.time()
        self._t0 = time.perf_counter()

    def ended(self) -> float:
        return self.started + (time.perf_counter() - self._t0)


def _hung_up(streams: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> bool:
    """Whether an idle connection has anything to read (the server's hang-up, as httpcore checks),
    asking the socket itself: the event loop may not have read it yet."""
    sock = streams[1].get_extra_info("socket")
    if streams[0].at_eof() or sock is None or sock.fileno() < 0:
        return True
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([sock], [], [], 0)[0])
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


class _AsyncConnection:
    """One HTTP/1.1 connection on asyncio streams, spoken through h11 with httpcore's
    exception mapping; any failure closes it, a later request opens a new one."""

    def __init__(self, tls: Callable[[], ssl.SSLContext]) -> None:
        self._tls = tls  # asked for only by an https connection (loading the certificate store: ~25 ms of CPU)
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._h11 = h11.Connection(h11.CLIENT)
        self._origin: tuple[bytes, bytes, int | None] = (b"", b"", None)
        self._idle_since = 0.0

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    @contextlib.contextmanager
    def _failing(self, timeout: type[httpx.TimeoutException], error: type[httpx.TransportError]) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            self.close()
            for kind, mapped in (
                (TimeoutError, timeout),
                (h11.RemoteProtocolError, httpx.RemoteProtocolError),
                (h11.LocalProtocolError, httpx.LocalProtocolError),
                (OSError, error),  # ssl.SSLError too
            ):
                if isinstance(exc, kind):
                    raise mapped("timed out" if kind is TimeoutError else str(exc)) from None
            raise

    async def _connect(self, url: httpx.URL, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        origin, streams = (url.raw_scheme, url.raw_host, url.port), self._streams
        fresh = time.monotonic() - self._idle_since < _KEEPALIVE_S
        if streams and origin == self._origin and self._h11.our_state is h11.IDLE and fresh and not _hung_up(streams):
            return streams
        self.close()
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}")
        host = url.raw_host.decode("ascii")
        with self._failing(httpx.ConnectTimeout, httpx.ConnectError):
            async with asyncio.timeout(timeout):
                streams = await asyncio.open_connection(host, url.port or (443 if url.scheme == "https" else 80))
            self._streams = streams
            if url.scheme == "https":
                async with asyncio.timeout(timeout):
                    await streams[1].start_tls(self._tls(), server_hostname=host)
        self._origin, self._h11 = origin, h11.Connection(h11.CLIENT, max_incomplete_event_size=100 * 1024)
        return streams

    async def _event(self, reader: asyncio.StreamReader, timeout: float) -> Any:
        with self._failing(httpx.ReadTimeout, httpx.ReadError):
            while (event := self._h11.next_event()) is h11.NEED_DATA:
                async with asyncio.timeout(timeout):
                    data = await reader.read(64 * 1024)
                if not data and self._h11.their_state is h11.SEND_RESPONSE:
                    raise h11.RemoteProtocolError("Server disconnected without sending a response.")
                self._h11.receive_data(data)
        return event

    async def send(self, url: httpx.URL, head: h11.Request, body: bytes, timeout: float) -> h11.Response:
        """Send `head` and `body` to `url`; the response's head (its body is read by `read_body`)."""
        reader, writer = await self._connect(url, timeout)
        with self._failing(httpx.WriteTimeout, httpx.WriteError):
            writer.write(b"".join(self._h11.send(e) or b"" for e in (head, h11.Data(data=body), h11.EndOfMessage())))
            with contextlib.suppress(ConnectionError):  # as httpcore: read the answer of a server that hung up
                async with asyncio.timeout(timeout):
                    await writer.drain()
        event = await self._event(reader, timeout)
        while isinstance(event, h11.InformationalResponse):
            event = await self._event(reader, timeout)
        if not isinstance(event, h11.Response):
            self.close()
            raise httpx.RemoteProtocolError(f"expected a response, got {type(event).__name__}")
        return event

    async def read_body(self, timeout: float) -> bytes:
        """The response's whole body as it came (not decoded); the connection is then free for reuse, or closed."""
        assert self._streams is not None
        reader, chunks = self._streams[0], []
        try:
            while isinstance(event := await self._event(reader, timeout), h11.Data):
                chunks.append(event.data)
        finally:  # read to the end (else the connection cannot be reused)
            if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
                self._h11.start_next_cycle()
                self._idle_since = time.monotonic()
            else:
                self.close()
        return b"".join(chunks)


def _decoded(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[httpx.Headers, bytes]:
    """The response's headers and its body decoded as httpx decodes it: by its Content-Encoding (none,
    `identity`, or what httpx supports; a mangled body raises httpx.DecodingError)."""
    parsed = httpx.Headers(headers)
    encoding = parsed.get("content-encoding")
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return parsed, body
    response = httpx.Response(status, headers=headers, stream=httpx.ByteStream(body))
    return response.headers, response.read()


class _AsyncPool:
    """One event loop's connections, each lent to one request at a time: waiters are served
    in arrival order (asyncio.Semaphore), the most recently returned (warmest) connection first."""

    def __init__(self, size: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._permits = asyncio.Semaphore(size)
        self._idle: list[_AsyncConnection] = []  # a stack
        self._all: list[_AsyncConnection] = []

    async def take(self, timeout: float, tls: Callable[[], ssl.SSLContext]) -> _AsyncConnection:
        try:
            async with asyncio.timeout(timeout):
                await self._permits.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("timed out waiting for a free connection") from None
        if not self._idle:
            self._all.append(_AsyncConnection(tls))
            return self._all[-1]
        return self._idle.pop()

    def give(self, connection: _AsyncConnection) -> None:
        self._idle.append(connection)
        self._permits.release()

    async def close(self) -> None:
        for connection in self._all:
            connection.close()
        await asyncio.sleep(0)  # the event loop hangs them up


class Transport:
    """Pooled HTTP connections (sync and async) that send exact requests and never retry.

    Args:
        timeout_s: seconds allowed for each phase of a request (connect, TLS handshake,
            write, each read, waiting for a free connection).
        max_connections: most connections open at once (sync and async each have this many).
        uds: send (sync `send` only) through this Unix socket instead of the URL's host and port:
            a sandboxed worker reaches the metering proxy this way (`harness.workers.sandbox`).
    """

    def __init__(self, timeout_s: float = 600, *, max_connections: int = 100, uds: str | None = None) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ProviderRefusal(Code.TRANSPORT_INVALID, f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ProviderRefusal(Code.TRANSPORT_INVALID, f"max_connections must be an integer >= 1, got {max_connections!r}")
        self.timeout_s = float(timeout_s)
        self.max_connections = max_connections
        self.uds = uds
        self._timeout = httpx.Timeout(self.timeout_s).as_dict()
        self._lock = threading.Lock()
        self._verify: ssl.SSLContext | None = None  # one certificate store (~20 ms to load) for all
        self._pool: httpx.HTTPTransport | None = None
        self._apool: _AsyncPool | None = None
        # `_head`'s URL, method, raw headers and where Content-Length is, by what makes them
        self._heads: dict[tuple[Any, ...], tuple[httpx.URL, str, list[tuple[bytes, bytes]], int]] = {}

    def _tls(self) -> ssl.SSLContext:
        with self._lock:
            if self._verify is None:
                self._verify = httpx.create_ssl_context()
                self._verify.set_alpn_protocols(["http/1.1"])
            return self._verify

    def _outgoing(self, request: ProviderRequest, credential: str | None) -> httpx.Request:
        headers, timeout = _headers(request, credential), {"timeout": self._timeout}
        return httpx.Request("POST", request.url, content=request.body, headers=headers, extensions=timeout)

    def _head(self, request: ProviderRequest, credential: str | None) -> tuple[httpx.URL, h11.Request]:
        """The URL and the HTTP/1.1 request head `_outgoing` makes. The URL and headers are made by httpx
        once per URL, headers and credential and kept; each request then gets its own Content-Length
        in the same place (h11 checks every head it is given)."""
        key = (request.url, request.headers, request.credential_header, request.credential_prefix, credential)
        made = self._heads.get(key)
        if made is None:
            out = self._outgoing(request, credential)
            raw = list(out.headers.raw)
            at = next((i for i, (k, _) in enumerate(raw) if k.lower() == b"content-length"), None)
            if at is None or raw[at][1] != str(len(request.body)).encode("ascii"):  # not by the body's length
                return out.url, h11.Request(method=out.method, target=out.url.raw_path, headers=raw)
            if len(self._heads) >= _HEADS_KEPT:
                self._heads.clear()
            made = self._heads[key] = (out.url, out.method, raw, at)
        url, method, raw, at = made
        headers = raw.copy()
        headers[at] = (raw[at][0], str(len(request.body)).encode("ascii"))
        return url, h11.Request(method=method, target=url.raw_path, headers=headers)

    def send(self, request: ProviderRequest, credential: str | None) -> Exchange:
        """Send `request` once and return what came back, or the transport failure, as data."""
        adapter_for(request.api_shape)
        check_credential(credential)
        tls = self._tls()
        with self._lock:
            if self._pool is None:
                limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
                self._pool = httpx.HTTPTransport(verify=tls, retries=0, limits=limits, uds=self.uds)
            pool = self._pool
        status_seen: int | None = None
        clock = _Clock()
        try:
            response = pool.handle_request(self._outgoing(request, credential))
            status_seen = response.status_code
            try:
                raw = response.read()
            finally:
                response.close()
        except _NETWORK_ERRORS as exc:
            return _failed(request, exc, clock.started, clock.ended(), status_seen, credential)
        return _received(request, response.status_code, response.http_version, response.headers, raw, clock.started,
                         clock.ended(), credential)

    async def asend(self, request: ProviderRequest, credential: str | None) -> Exchange:
        """`send` for asyncio: same request bytes, same Exchange."""
        if self.uds is not None:
            raise ProviderRefusal(Code.TRANSPORT_INVALID, "a Unix-socket transport sends with `send` only")
        adapter_for(request.api_shape)
        check_credential(credential)
        if self._apool is None or self._apool.loop is not asyncio.get_running_loop():  # bound to its loop
            self._apool = _AsyncPool(self.max_connections)
        pool, tls = self._apool, self._tls
        status_seen: int | None = None
        clock = _Clock()
        try:
            connection = await pool.take(self.timeout_s, tls)
            try:
                url, head = self._head(request, credential)
                answer = await connection.send(url, head, request.body, self.timeout_s)
                status_seen = answer.status_code
                body = await connection.read_body(self.timeout_s)
            finally:
                pool.give(connection)
            headers, raw = _decoded(answer.status_code, answer.headers.raw_items(), body)
        except _NETWORK_ERRORS as exc:
            return _failed(request, exc, clock.started, clock.ended(), status_seen, credential)
        version = "HTTP/" + answer.http_version.decode("ascii")
        return _received(request, answer.status_code, version, headers, raw, clock.started, clock.ended(), credential)

    def close(self) -> None:
        """Close the sync connections (a later `send` opens new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def aclose(self) -> None:
        """Close every connection, async and sync (a later call opens new ones)."""
        pool, self._apool = self._apool, None
        if pool is not None:
            await pool.close()
        self.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
