"""The one HTTP transport every adapter's request goes through (httpx, sync and async).

What it promises:

- The body goes out byte for byte (`content=request.body`); nothing rewrites it.
- No retries, ever (a retry would be an attempt nobody recorded), and no
  redirects (`follow_redirects=False`: a 3xx comes back as data).
- `trust_env=False`: no proxy variables and no `.netrc` credentials sneak in.
- `Accept-Encoding: identity`, so the bytes kept are the bytes sent back.
- Network trouble never raises: it comes back as an `Exchange` with status
  None and `error_code` `timeout` (any httpx timeout, including waiting for
  a pooled connection) or `transport` (any other transport failure).
- The credential is put in its header at send time and nowhere else, and
  scrubbed (`harness.providers.credentials`) from everything the `Exchange`
  carries: the raw body (redacted, then hashed; `meta["credential_redacted"]`
  says so), headers, parsed fields and error messages.

`timeout_s` applies to each phase (connect, write, each read, pool wait),
as httpx does; an attempt deadline belongs to the runner. `started` is the
wall clock before the request is built; `ended` adds the monotonic time the
call took, so a clock step never makes a latency negative.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from types import TracebackType
from typing import Any, Final

import httpx

from harness import __version__
from harness.errors import Refusal
from harness.evidence.jsonio import sha256_hex
from harness.providers.base import Exchange, ProviderRequest
from harness.providers.common import failure, truncate
from harness.providers.credentials import check_credential, redact_raw, scrub, scrub_parsed
from harness.providers.registry import adapter_for

__all__ = ["Transport"]

_DEFAULT_HEADERS: Final = {"accept-encoding": "identity", "user-agent": f"proctor/{__version__}"}


def _headers(request: ProviderRequest, credential: str | None) -> dict[str, str]:
    headers = dict(request.headers)
    if request.credential_header is not None and credential is not None:
        headers[request.credential_header] = request.credential_prefix + credential
    return headers


def _received(
    request: ProviderRequest,
    response: httpx.Response,
    raw: bytes,
    started: float,
    ended: float,
    secret: str | None,
) -> Exchange:
    """The Exchange for a response that arrived, scrubbed of the credential."""
    meta: dict[str, Any] = {"http_version": response.http_version}
    raw, redacted = redact_raw(raw, secret)
    if redacted:
        meta["credential_redacted"] = True
    headers = {str(scrub(k, secret)): str(scrub(v, secret)) for k, v in response.headers.items()}
    parsed = adapter_for(request.api_shape).parse_response(response.status_code, headers, raw)
    return Exchange(
        request=request,
        status=response.status_code,
        raw_response=raw,
        response_sha256=sha256_hex(raw),
        response_headers=headers,
        started=started,
        ended=ended,
        parsed=scrub_parsed(parsed, secret),
        meta=meta,
    )


def _failed(
    request: ProviderRequest,
    exc: Exception,
    started: float,
    ended: float,
    status_seen: int | None,
    secret: str | None,
) -> Exchange:
    """The Exchange for a failure before a whole response arrived: status None, no body."""
    if isinstance(exc, httpx.TimeoutException):
        code = "timeout"
    elif isinstance(exc, httpx.DecodingError):  # the server compressed a body it then mangled
        code = "malformed_response"
    else:
        code = "transport"
    message = scrub(f"POST {request.url}: {type(exc).__name__}: {exc}", secret) or ""
    meta: dict[str, Any] = {"exception": type(exc).__name__}
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


# Failures that are the network's, not the program's: httpx.TransportError covers
# connect/read/write errors, protocol errors and timeouts; DecodingError is a body
# the server mangled; InvalidURL is a URL httpx cannot send to.
_NETWORK_ERRORS: Final = (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL)


class Transport:
    """One pooled HTTP client (sync and async) that sends exact requests and never retries.

    Args:
        timeout_s: seconds allowed for each phase of a request (connect, write,
            each read, waiting for a pooled connection).
        max_connections: most connections open at once (per client: sync and
            async each have one pool).
    """

    def __init__(self, timeout_s: float = 600, *, max_connections: int = 100) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise Refusal("transport_invalid", f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise Refusal("transport_invalid", f"max_connections must be an integer >= 1, got {max_connections!r}")
        self.timeout_s = float(timeout_s)
        self.max_connections = max_connections
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None

    def _options(self) -> dict[str, Any]:
        return {
            "timeout": httpx.Timeout(self.timeout_s),
            "follow_redirects": False,
            "trust_env": False,
            "headers": _DEFAULT_HEADERS,
        }

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                transport = httpx.HTTPTransport(retries=0, limits=self._limits)
                self._client = httpx.Client(transport=transport, **self._options())
            return self._client

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aloop is not loop:  # a pool cannot outlive its event loop
            transport = httpx.AsyncHTTPTransport(retries=0, limits=self._limits)
            self._aclient = httpx.AsyncClient(transport=transport, **self._options())
            self._aloop = loop
        return self._aclient

    def send(self, request: ProviderRequest, credential: str | None) -> Exchange:
        """Send `request` once and return what came back, or the transport failure, as data."""
        adapter_for(request.api_shape)
        check_credential(credential)
        client = self._sync_client()
        status_seen: int | None = None
        clock = _Clock()
        try:
            outgoing = client.build_request("POST", request.url, content=request.body, headers=_headers(request, credential))
            response = client.send(outgoing, stream=True)
            status_seen = response.status_code
            try:
                raw = response.read()
            finally:
                response.close()
        except _NETWORK_ERRORS as exc:
            return _failed(request, exc, clock.started, clock.ended(), status_seen, credential)
        return _received(request, response, raw, clock.started, clock.ended(), credential)

    async def asend(self, request: ProviderRequest, credential: str | None) -> Exchange:
        """`send` for asyncio: same request bytes, same Exchange."""
        adapter_for(request.api_shape)
        check_credential(credential)
        client = self._async_client()
        status_seen: int | None = None
        clock = _Clock()
        try:
            outgoing = client.build_request("POST", request.url, content=request.body, headers=_headers(request, credential))
            response = await client.send(outgoing, stream=True)
            status_seen = response.status_code
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
        except _NETWORK_ERRORS as exc:
            return _failed(request, exc, clock.started, clock.ended(), status_seen, credential)
        return _received(request, response, raw, clock.started, clock.ended(), credential)

    def close(self) -> None:
        """Close the sync client's connections (a later `send` opens a new pool)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close both clients' connections."""
        client, self._aclient, self._aloop = self._aclient, None, None
        if client is not None:
            await client.aclose()
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
