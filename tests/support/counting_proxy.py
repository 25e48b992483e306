"""An independent counting proxy for the crash tests: a loopback HTTP proxy process of the tests' own.

It sits between `proctor run` and the simulator, forwards each POST upstream, sends the
whole response back to the runner, and only then appends (and fsyncs) one JSON line:
the sha256 of the request body, the status, and the response's `usage` object. The
test prices the usage from the pricing table itself. It shares no code with the
runner's meter, wire log or proxy: what it counts is what the "provider" delivered.

Run: `python -m tests.support.counting_proxy --upstream URL --log FILE --ready FILE`.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["delivered", "main"]

_LOCK = threading.Lock()


def delivered(log: Path) -> list[dict[str, Any]]:
    """The proxy's lines: one per response it fully delivered (a torn last line is left out)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _handler(upstream: str, log: str) -> type[BaseHTTPRequestHandler]:
    target = urllib.parse.urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # the preflight's reachability probe: answered, never counted
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path  # the runner's base URL carries the upstream's path: forwarded as it came
            conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                status, reason = resp.status, resp.reason
                ctype = resp.getheader("Content-Type") or "application/json"
            finally:
                conn.close()
            self.send_response(status, reason)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            try:
                usage = json.loads(data).get("usage")
            except (ValueError, AttributeError):
                usage = None
            line = json.dumps({"request_sha256": hashlib.sha256(body).hexdigest(), "status": status,
                               "usage": usage}, sort_keys=True) + "\n"
            with _LOCK:
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode("utf-8"))
                    os.fsync(fd)
                finally:
                    os.close(fd)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--ready", required=True)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(args.upstream, args.log))
    server.daemon_threads = True
    url = f"http://127.0.0.1:{server.server_address[1]}{urllib.parse.urlsplit(args.upstream).path}"
    tmp = args.ready + ".tmp"
    Path(tmp).write_text(json.dumps({"url": url}), encoding="utf-8")
    os.replace(tmp, args.ready)
    server.serve_forever()


if __name__ == "__main__":
    main()
