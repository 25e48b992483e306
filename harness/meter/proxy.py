"""The metering proxy: forwards a client's provider traffic and records every exchange.

The manual: docs/models.md.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from harness.errors import Code, InputRefusal, MeterRefusal, Refusal
from harness.evidence.chain_read import seed_hash, verify_log
from harness.evidence.fsutil import atomic_write
from harness.meter.allowance import Allowance, AllowanceLedger
from harness.meter.exchange import redact_url
from harness.meter.relay import ProxyServer, UnixProxyServer
from harness.meter.wire import WireLog, wire_seed

__all__ = ["ProxyHandle", "serve_proxy", "start_proxy"]

_DEFAULT_TIMEOUT_S: Final = 600.0
_CLOSE_WAIT_S: Final = 30.0


@dataclass
class ProxyHandle:
    """A running proxy: `url` is the base URL for clients (origin plus the upstream's path prefix)."""

    url: str
    origin: str
    port: int
    upstream: str
    out: str
    name: str
    _server: ProxyServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _closed: bool = field(default=False, repr=False)
    socket: str | None = None
    """The Unix socket the proxy also listens on (None: loopback TCP only)."""
    _unix: UnixProxyServer | None = field(default=None, repr=False)
    _unix_thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def exchanges(self) -> int:
        """Exchanges recorded so far."""
        return self._server.exchanges

    @property
    def budget_stops(self) -> int:
        """Requests answered with a budget stop (never sent upstream)."""
        return 0 if self._server.ledger is None else self._server.ledger.stops

    @property
    def failures(self) -> int:
        """Exchanges that could not be recorded."""
        return self._server.failures

    @property
    def wire_lines(self) -> int:
        """Lines the proxy appended to its wire log, counted in memory."""
        with self._server.cond:
            return self._server.wire_lines

    @property
    def wire_head(self) -> str | None:
        """The sha256 of the last line the proxy appended (None before its first)."""
        with self._server.cond:
            return self._server.wire_head

    @property
    def wire_interleaved(self) -> int:
        """Appends that found a line the proxy did not write at the end of its log."""
        with self._server.cond:
            return self._server.wire_interleaved

    def close(self, wait_s: float = _CLOSE_WAIT_S) -> dict[str, Any]:
        """Stop accepting, let exchanges in flight finish (up to `wait_s`), then close every connection."""
        srv = self._server
        if not self._closed:
            self._closed = True
            with srv.cond:
                srv.closing = True
            srv.shutdown()
            if self._unix is not None:
                self._unix.shutdown()
            deadline = time.monotonic() + wait_s
            with srv.cond:
                while srv.inflight and time.monotonic() < deadline:
                    srv.cond.wait(0.1)
                conns = list(srv.conns)
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            srv.server_close()
            self._thread.join(5)
            if self._unix is not None and self._unix_thread is not None:
                self._unix.server_close()
                self._unix_thread.join(5)
                with contextlib.suppress(OSError):
                    os.unlink(self._unix.server_address)  # type: ignore[arg-type]
            srv.client.close()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """What the proxy did, JSON-safe."""
        return {
            "url": self.url, "origin": self.origin, "port": self.port, "upstream": self.upstream,
            "out": self.out, "name": self.name, "seed": wire_seed(self.name), "socket": self.socket,
            "exchanges": self.exchanges, "record_failures": self.failures,
            "wire_lines": self.wire_lines, "wire_head": self.wire_head, "wire_interleaved": self.wire_interleaved,
            "budget_stops": self.budget_stops,
            "allowance": None if self._server.ledger is None else self._server.ledger.summary(),
        }

    def __enter__(self) -> ProxyHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_upstream(upstream: str) -> tuple[str, str]:
    """(origin, path prefix) of an upstream base URL, or a refusal."""
    parts = urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MeterRefusal(Code.PROXY_UPSTREAM_INVALID, f"upstream must be an http(s) URL, not {redact_url(upstream)!r}")
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise MeterRefusal(Code.PROXY_UPSTREAM_INVALID, "upstream must carry no user info, query or fragment (credentials go in headers)")
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


def _check_host(host: str) -> None:
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise MeterRefusal(Code.PROXY_NOT_LOOPBACK, f"the proxy listens on loopback only, not {host!r}")


def _check_out(out: str, name: str) -> str:
    """Refuse a missing folder or a damaged log; returns the head the proxy's first line will chain onto."""
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise InputRefusal(Code.FOLDER_MISSING, "the wire log's folder does not exist", out)
    if not os.path.lexists(out):
        return seed_hash(wire_seed(name))
    status = verify_log(out, wire_seed(name))
    if status.problem is not None:
        code = Code.LOG_TORN_TAIL if status.problem.kind == "torn_tail" else Code.LOG_BROKEN
        raise Refusal(code, status.problem.message, out, line=status.problem.line, kind=status.problem.kind)
    return status.head


def start_proxy(
    upstream: str, out: str | os.PathLike[str], port: int = 0, *, host: str = "127.0.0.1",
    name: str = "proxy", timeout_s: float = _DEFAULT_TIMEOUT_S, unix_socket: str | None = None,
    allowance: Allowance | None = None,
) -> ProxyHandle:
    """Start a metering proxy in a background thread; `close()` it when done.

    Args:
        upstream: the provider's base URL (e.g. `https://api.openai.com/v1`).
        out: the wire log to append to (created on the first exchange).
        port: the loopback port (0: any free port; read `ProxyHandle.port`).
        name: the wire log's name (its seed is `proctor-wire:<name>`).
        timeout_s: the upstream read/write timeout (generous: models think).
        unix_socket: also listen on this Unix socket path (its folder must exist; at most 107 bytes).
        allowance: what the attempt may still spend: a request whose worst case would cross it is
            answered 402 `budget_stop`, never sent upstream, and logged as not sent (docs/models.md).
    """
    if allowance is not None and not isinstance(allowance, Allowance):
        raise MeterRefusal(Code.ALLOWANCE_INVALID, "allowance must be an Allowance")
    origin, prefix = _check_upstream(upstream)
    _check_host(host)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise MeterRefusal(Code.PROXY_PORT_UNAVAILABLE, f"port {port!r} is not in 0-65535")
    out_path = os.fspath(out)
    base_head = _check_out(out_path, name)
    client = httpx.Client(
        timeout=httpx.Timeout(timeout_s, connect=30.0), follow_redirects=False, trust_env=False,
        limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
    )
    for default in ("user-agent", "accept"):  # send only what the client sent
        del client.headers[default]
    try:
        ledger = None if allowance is None else AllowanceLedger(allowance)
        server = ProxyServer((host, port), origin, WireLog(out_path, name), client, base_head, ledger)
    except OSError as exc:
        client.close()
        raise MeterRefusal(Code.PROXY_PORT_UNAVAILABLE, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    proxy_origin = f"http://{shown}:{bound}"
    unix: UnixProxyServer | None = None
    if unix_socket is not None:
        try:
            unix = UnixProxyServer(unix_socket, server)
            os.chmod(unix_socket, 0o600)
        except OSError as exc:
            server.server_close()
            client.close()
            raise MeterRefusal(Code.PROXY_PORT_UNAVAILABLE, f"cannot listen on {unix_socket}: {exc.strerror or exc}",
                          unix_socket) from None  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="proctor-wire-proxy", daemon=True)
    thread.start()
    unix_thread = None
    if unix is not None:
        unix_thread = threading.Thread(target=unix.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="proctor-wire-proxy-unix", daemon=True)  # fmt: skip
        unix_thread.start()
    return ProxyHandle(proxy_origin + prefix, proxy_origin, bound, upstream, out_path, name, server, thread,
                       socket=unix_socket, _unix=unix, _unix_thread=unix_thread)  # fmt: skip


def serve_proxy(
    upstream: str, out: str, port: int, *, host: str = "127.0.0.1", ready_file: str | None = None,
    name: str = "proxy", on_ready: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the proxy in the foreground until SIGTERM or SIGINT; returns its summary.

    `on_ready` is called with the ready information once the proxy listens
    (after the ready file, if any, was written).
    """
    if ready_file is not None and not os.path.isdir(os.path.dirname(os.path.abspath(ready_file))):
        raise InputRefusal(Code.FOLDER_MISSING, "the ready file's folder does not exist", ready_file)
    handle = start_proxy(upstream, out, port, host=host, name=name)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if ready_file is not None:
            ready = {**handle.summary(), "pid": os.getpid()}
            atomic_write(ready_file, (json.dumps(ready, sort_keys=True) + "\n").encode("utf-8"), mode=0o644)
        if on_ready is not None:
            on_ready({**handle.summary(), "pid": os.getpid()})
        while not stop.wait(0.2):
            pass
    finally:
        summary = handle.close()
        for sig, old in previous.items():
            signal.signal(sig, old)
    return {"ok": summary["record_failures"] == 0, **summary}
