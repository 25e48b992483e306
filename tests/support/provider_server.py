"""A loopback HTTP server that replays a recorded provider response and records what it received.

Used by the provider tests to run the adapters over real HTTP: it serves one
fixture's status, headers and body (optionally after a delay) to every POST,
and keeps the exact request bytes and headers that arrived.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ProviderServer", "Received", "Reply", "fixture_bytes", "load_fixture"]


def fixture_bytes(body: Any) -> bytes:
    """A fixture's body as sent: a string is the raw text (bad JSON, HTML), anything else JSON."""
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def load_fixture(path: Path) -> dict[str, Any]:
    """One recorded response: `{"status", "headers", "body", "expect", "note"}`."""
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


@dataclass
class Reply:
    """What the server answers: status, headers, body bytes, after `delay_s` seconds."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"{}"
    delay_s: float = 0.0


@dataclass
class Received:
    """One request as it arrived: method, path, headers in order, exact body bytes."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The value of header `name` (case-insensitive), or None."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive with Content-Length, like real providers
    disable_nagle_algorithm = True  # headers and body go in separate writes: no 40 ms delayed-ACK stall
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        owner = self.server.owner
        with owner.lock:
            owner.received.append(Received("POST", self.path, list(self.headers.items()), body))
            reply = owner.reply
        if reply.delay_s and owner.stopping.wait(reply.delay_s):
            return
        try:
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `received`, not a log."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ProviderServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up mid-request is expected in timeout tests; stay quiet."""


class ProviderServer:
    """A replaying provider on 127.0.0.1 at a free port, as a context manager."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.reply = Reply()
        self.received: list[Received] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        """The base URL, e.g. `http://127.0.0.1:41234`."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def serve(self, status: int, headers: dict[str, str], body: bytes, delay_s: float = 0.0) -> None:
        """Answer every following request with this status, headers and body."""
        with self.lock:
            self.reply = Reply(status, dict(headers), body, delay_s)

    def serve_fixture(self, fixture: dict[str, Any]) -> bytes:
        """Serve a recorded fixture; returns the body bytes served."""
        body = fixture_bytes(fixture["body"])
        self.serve(fixture["status"], fixture["headers"], body)
        return body

    def start(self) -> ProviderServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ProviderServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
