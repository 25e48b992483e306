"""The simulator: an OpenAI Chat Completions server on loopback for simulated systems.

`proctor sim serve` answers `POST /v1/chat/completions` (and `GET /v1/models`)
for the systems named in a systems file, deciding every answer with the pure
functions of `sim_model`. It exists to rehearse pipelines and to test adapters
over real HTTP; it is never evidence about a model, and every response says so
(`x-proctor-provider: sim`, `system_fingerprint: proctor-sim`).

Inputs (read strictly here; every problem is a named refusal with the path):

- systems file: `{"systems": [{"name", "skill" in [0, 1], "latency_s":
  {"dist": "fixed", "value"} | {"dist": "lognormal", "median", "sigma"},
  "output_tokens"?: {"mean"}, "snapshot"?, "failures"?: {"rate_limited",
  "server_error", "timeout", "auth", "quota", "malformed"}}]}`; the bundled one
  holds sim-flash, sim-glm, sim-k3. Failure probabilities sum to at most 1 and
  are laid on one hash-derived draw: rate_limited (429), server_error (500),
  timeout (504 after 30 s), auth (401 `invalid_api_key`), quota (429
  `insufficient_quota`), malformed (200 whose body has no `choices`).
- answers file (JSONL): `{"match", "answer", "wrong"?: [...]}` per line; the
  item is the one whose `match` occurs in the last user message (longest wins).
- task folders: `<dir>/*/task.json`; match `task_id: <id>`, answer the `fix/`
  files in scope as edit-format blocks, wrong the unchanged `workspace/` ones.

The stdlib server keeps HTTP/1.1 connections alive and gives each its own
daemon thread, so a latency is a sleep that does not hold up other requests.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from harness.errors import Code, InputRefusal, ProviderRefusal, Refusal
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import canonical_line, loads_strict, read_bytes, read_json
from harness.providers.edit_format import render_files
from harness.providers.sim_model import (
    GENERIC_ANSWER,
    Item,
    Reply,
    SimService,
    SimSystem,
    error_reply,
    merge_items,
    parse_systems,
)

__all__ = [
    "BUNDLED_SYSTEMS",
    "build_service",
    "check_loopback",
    "latency_scale_from_env",
    "load_answers",
    "load_systems",
    "load_task_answers",
    "serve",
]

MAX_BODY: Final = 32 * 1024 * 1024
BUNDLED_SYSTEMS: Final = Path(__file__).resolve().parent.parent / "data" / "sim_systems.json"


def load_systems(path: str | os.PathLike[str]) -> dict[str, SimSystem]:
    """Read a systems file strictly: `{"systems": [...]}`; every problem a named refusal with the path."""
    where = os.fspath(path)
    return parse_systems(read_json(where, max_bytes=4 * 1024 * 1024).value, where)


# --- answers: a JSONL file, or the gated path's task folders ---------------------------


def load_answers(path: str | os.PathLike[str]) -> list[Item]:
    """Read `{"match", "answer", "wrong"?}` lines (strict JSON each); duplicate matches refused."""
    where = os.fspath(path)
    raw = read_bytes(where)
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    items: list[Item] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):

        def bad(message: str, code: Code = Code.SIM_ANSWERS_INVALID, at: int = number) -> Refusal:
            return Refusal(code, f"line {at}: {message}", where)

        try:
            doc = loads_strict(line, path=where)
        except Refusal as exc:
            raise bad(exc.message, exc.code) from None
        if set(doc) - {"match", "answer", "wrong"} or not {"match", "answer"} <= set(doc):
            raise bad('expected keys "match", "answer" and optionally "wrong"')
        match, answer, wrong = doc["match"], doc["answer"], doc.get("wrong", [GENERIC_ANSWER])
        if not isinstance(match, str) or not match or not isinstance(answer, str):
            raise bad("match must be a non-empty string and answer a string")
        if not isinstance(wrong, list) or not wrong or not all(isinstance(w, str) for w in wrong):
            raise bad("wrong must be a non-empty list of strings (or left out)")
        if answer in wrong:
            raise bad("a wrong answer equals the reference answer")
        if match in seen:
            raise bad(f"match {match!r} is given twice", Code.SIM_ANSWERS_DUPLICATE_MATCH)
        seen.add(match)
        items.append(Item(match, answer, tuple(wrong)))
    return items


def _plain_relative(rel: str) -> bool:
    return not rel.startswith("/") and all(part not in ("", ".", "..") for part in rel.split("/"))


def _scope_text(folder: str, rel: str) -> str | None:
    target = os.path.join(folder, *rel.split("/"))
    if not os.path.lexists(target):
        return None
    try:
        return read_bytes(target).decode("utf-8")
    except UnicodeDecodeError:
        raise ProviderRefusal(Code.SIM_TASK_INVALID, f"{rel} is not UTF-8 text", target) from None


def load_task_answers(folder: str | os.PathLike[str]) -> list[Item]:
    """Items from `<folder>/*/task.json`: match `task_id: <id>`, answer the fix/ files, wrong the given ones."""
    root = os.fspath(folder)
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        raise InputRefusal(Code.FOLDER_MISSING, "no such folder", root) from None
    except NotADirectoryError:
        raise InputRefusal(Code.NOT_A_FOLDER, "a file, not a folder of tasks", root) from None
    except PermissionError:
        raise InputRefusal(Code.FOLDER_UNREADABLE, "permission denied", root) from None
    items: list[Item] = []
    for name in names:
        task_dir = os.path.join(root, name)
        task_file = os.path.join(task_dir, "task.json")
        if not os.path.isdir(task_dir) or not os.path.lexists(task_file):
            continue
        doc = read_json(task_file, max_bytes=4 * 1024 * 1024).value
        task_id, scope = doc.get("task_id"), doc.get("scope")
        if not isinstance(task_id, str) or not task_id or "\n" in task_id:
            raise ProviderRefusal(Code.SIM_TASK_INVALID, "task_id must be a one-line string", task_file)
        plain = isinstance(scope, list) and all(isinstance(p, str) and _plain_relative(p) for p in scope)
        if not scope or not plain:
            raise ProviderRefusal(Code.SIM_TASK_INVALID, "scope must be a non-empty list of plain relative paths", task_file)
        fixed = {rel: _scope_text(os.path.join(task_dir, "fix"), rel) for rel in scope}
        missing = sorted(rel for rel, text in fixed.items() if text is None)
        if missing:
            raise ProviderRefusal(Code.SIM_TASK_INVALID, f"missing from fix/: {', '.join(missing)}", task_file)
        workspace = os.path.join(task_dir, "workspace")
        given = {rel: t for rel in scope if (t := _scope_text(workspace, rel)) is not None}
        wrong = render_files(given) if given else GENERIC_ANSWER
        answer = render_files({rel: text for rel, text in fixed.items() if text is not None})
        items.append(Item(f"task_id: {task_id}", answer, (wrong,)))
    if not items:
        raise ProviderRefusal(Code.SIM_TASKS_EMPTY, "no <name>/task.json in this folder", root)
    return items


def build_service(
    systems: str | os.PathLike[str] | None = None,
    *,
    answers: str | os.PathLike[str] | None = None,
    tasks: str | os.PathLike[str] | None = None,
    seed: int = 0,
    latency_scale: float | None = None,
) -> SimService:
    """A service from a systems file (default: the bundled one), an answers file and task folders.

    `latency_scale` None reads PROCTOR_SIM_LATENCY_SCALE.
    """
    loaded = load_systems(BUNDLED_SYSTEMS if systems is None else systems)
    items = merge_items(
        load_answers(answers) if answers is not None else [],
        load_task_answers(tasks) if tasks is not None else [],
    )
    scale = latency_scale_from_env() if latency_scale is None else latency_scale
    return SimService(loaded, items, seed=seed, latency_scale=scale)


# --- HTTP ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], service: SimService, family: socket.AddressFamily) -> None:
        self.address_family = family
        self.service = service
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (e.g. after its own timeout) is not the server's problem


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, reply: Reply, *, close: bool = False) -> None:
        data = json.dumps(reply.payload, ensure_ascii=False).encode("utf-8")
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-proctor-provider", "sim")
        headers = reply.headers or (("x-request-id", f"req-sim-{uuid.uuid4().hex[:24]}"),)
        for name, value in headers:
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._send(error_reply(404, f"Invalid URL ({self.command} {self.path})"))

    def do_GET(self) -> None:
        if self.path.split("?")[0].rstrip("/") == "/v1/models":
            self._send(Reply(200, self.server.service.models()))
        else:
            self._not_found()

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding") is not None:
            self._send(error_reply(400, "Send the body with a Content-Length, not chunked."), close=True)
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._send(error_reply(413 if length > MAX_BODY else 400, "Bad Content-Length."), close=True)
            return
        body = self.rfile.read(length)
        if self.path.split("?")[0] != "/v1/chat/completions":
            self._not_found()
            return
        reply = self.server.service.complete(body)
        if reply.delay_s > 0:
            time.sleep(reply.delay_s)
        self._send(reply)


# --- serving ------------------------------------------------------------------------


def check_loopback(host: str) -> socket.AddressFamily:
    """The address family for a loopback `host`; anything else is refused."""
    if host == "localhost":
        return socket.AF_INET
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None or not address.is_loopback:
        raise ProviderRefusal(Code.SIM_HOST_NOT_LOOPBACK, f"the simulator serves on loopback only, not {host!r}")
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


def latency_scale_from_env() -> float:
    """PROCTOR_SIM_LATENCY_SCALE: a finite, non-negative factor on every latency (default 1)."""
    raw = os.environ.get("PROCTOR_SIM_LATENCY_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not math.isfinite(scale) or scale < 0:
        raise ProviderRefusal(Code.SIM_LATENCY_SCALE_INVALID, f"PROCTOR_SIM_LATENCY_SCALE={raw!r} is not a number >= 0")
    return scale


def serve(
    service: SimService,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ready_file: str | None = None,
    on_ready: Callable[[dict[str, Any]], None] = lambda info: None,
) -> dict[str, Any]:
    """Serve in the foreground until SIGTERM or SIGINT; returns a summary.

    Once listening, writes `{"url", "pid", ...}` to `ready_file` atomically and
    passes the same object to `on_ready`.
    """
    family = check_loopback(host)
    if not 0 <= port <= 65535:
        raise ProviderRefusal(Code.SIM_PORT_UNAVAILABLE, f"port {port} is not in 0-65535")
    try:
        server = _Server((host, port), service, family)
    except OSError as exc:
        raise ProviderRefusal(Code.SIM_PORT_UNAVAILABLE, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = server.server_address[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    info = {
        "ok": True,
        "url": f"http://{shown}:{bound}/v1",
        "pid": os.getpid(),
        "port": bound,
        "systems": sorted(service.systems),
        "seed": service.seed,
        "latency_scale": service.latency_scale,
    }
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    try:
        if ready_file is not None:
            atomic_write(ready_file, canonical_line(info), mode=0o644)
        thread.start()
        on_ready(info)
        while not stop.wait(0.5):
            pass
    finally:
        if thread.is_alive():
            server.shutdown()
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return {"ok": True, "url": info["url"], "answered": service.answered}
