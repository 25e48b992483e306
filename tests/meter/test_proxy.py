"""The metering proxy over real loopback HTTP: byte-identical relaying, a wire log that meters
to the same cost as the bodies themselves, no credential ever written, failures recorded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import verify_log
from harness.meter.cost import meter, total_cost
from harness.meter.pricing import Price, PricingTable, load_pricing
from harness.meter.proxy import start_proxy
from harness.meter.wire import meter_wire, read_wire
from harness.providers.registry import usage_from_response
from tests.support.cli import run_proctor
from tests.support.paths import REPO

SECRET = "sk-PLANTED-SECRET-4f1d9c"
CRED_HEADERS = {
    "Authorization": f"Bearer {SECRET}",
    "x-api-key": SECRET,
    "x-goog-api-key": SECRET,
    "api-key": SECRET,
}

# --- a canned upstream -------------------------------------------------------------------------


def openai_body(req: dict[str, Any]) -> dict[str, Any]:
    n = len(json.dumps(req.get("messages", [])))
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "model": f"{req.get('model')}-2025-01",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 1000 + n,
            "completion_tokens": 300,
            "total_tokens": 1300 + n,
            "prompt_tokens_details": {"cached_tokens": 200},
            "completion_tokens_details": {"reasoning_tokens": 100},
        },
    }


ANTHROPIC_BODY = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-x-2025",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 900, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 50, "output_tokens": 70},
}
GEMINI_BODY = {
    "candidates": [{"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP"}],
    "usageMetadata": {"promptTokenCount": 400, "candidatesTokenCount": 40, "thoughtsTokenCount": 12, "totalTokenCount": 452},
    "modelVersion": "gemini-x-001",
    "responseId": "resp-g1",
}
ERROR_429 = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}


@dataclass
class Upstream:
    url: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    released_in_time: bool | None = None


class _Canned(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json", extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-request-id", f"up-{self.path}")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.up.seen.append({"method": "GET", "path": self.path, "headers": dict(self.headers.items())})
        self._send(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.up.seen.append({"method": "POST", "path": self.path, "headers": dict(self.headers.items()), "body": body})
        path = self.path.split("?")[0]
        try:
            req = json.loads(body)
        except ValueError:
            req = {}
        if path == "/v1/chat/completions":
            if req.get("model") == "echo":  # a careless upstream quoting the key back
                quoted = json.dumps({"error": {"message": f"Incorrect API key provided: {self.headers.get('Authorization')}"}})
                self._send(401, quoted.encode())
            elif req.get("model") == "limited":
                self._send(429, json.dumps(ERROR_429).encode(), extra={"Retry-After": "7"})
            elif req.get("stream"):
                self._stream(req)
            else:
                self._send(200, json.dumps(openai_body(req)).encode())
        elif path == "/v1/messages":
            self._send(200, json.dumps(ANTHROPIC_BODY).encode())
        elif path.endswith(":generateContent"):
            self._send(200, json.dumps(GEMINI_BODY).encode())
        else:
            self._send(404, b'{"error": {"message": "no such path"}}')

    def _stream(self, req: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [
            {"id": "c1", "model": "m-2025", "choices": [{"index": 0, "delta": {"content": "o"}, "finish_reason": None}], "usage": None},
            {"id": "c1", "model": "m-2025", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None},
            {"id": "c1", "model": "m-2025", "choices": [], "usage": openai_body(req)["usage"]},
        ]
        events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
        for i, event in enumerate(events):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            if i == 0 and req.get("wait_for_client"):
                self.server.up.released_in_time = self.server.up.release.wait(60)
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.daemon_threads = True
    up = Upstream(f"http://127.0.0.1:{server.server_address[1]}")
    server.up = up  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield up
    server.shutdown()
    server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PRICING = PricingTable(
    {
        "gpt-x": Price("gpt-x", 2.0, 8.0, 0.5),
        "claude-x": Price("claude-x", 3.0, 15.0, 0.3, 3.75),
        "gemini-x": Price("gemini-x", 1.25, 10.0, 0.31),
    },
    "0" * 64,
)

REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("/v1/chat/completions", "openai_chat", {"model": "gpt-x", "messages": [{"role": "user", "content": "héllo"}]}),
    ("/v1/chat/completions", "openai_chat", {"model": "gpt-x", "messages": [{"role": "user", "content": "a longer prompt"}]}),
    ("/v1/messages", "anthropic_messages", {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1beta/models/gemini-x:generateContent", "gemini_generate", {"contents": [{"parts": [{"text": "hi"}]}]}),
    ("/v1/chat/completions", "openai_chat", {"model": "limited", "messages": []}),
]


def post(client: httpx.Client, base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(base + path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json", **CRED_HEADERS})


# --- tests ---------------------------------------------------------------------------------------


def test_the_client_gets_what_the_upstream_sent_and_the_wire_meters_the_same(tmp_path: Path, upstream: Upstream, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wire.jsonl"
    with start_proxy(upstream.url, out) as proxy, httpx.Client() as client:
        assert proxy.url == proxy.origin  # the upstream has no path prefix
        direct, proxied = [], []
        for path, _, body in REQUESTS:
            direct.append(post(client, upstream.url, path, body))
            proxied.append(post(client, proxy.url, path, body))
        models = client.get(proxy.url + "/v1/models")
        assert models.status_code == 200
    for d, p in zip(direct, proxied, strict=True):
        assert p.status_code == d.status_code and p.reason_phrase == d.reason_phrase
        assert p.content == d.content
        for h in ("content-type", "x-request-id", "retry-after", "content-length"):
            assert p.headers.get(h) == d.headers.get(h)
    assert [p.status_code for p in proxied] == [200, 200, 200, 200, 429]

    # the upstream saw the same bytes and the credentials, with its own Host
    posts = [s for s in upstream.seen if s["method"] == "POST"]
    assert [s["body"] for s in posts[0::2]] == [s["body"] for s in posts[1::2]]
    for s in posts:
        assert s["headers"]["Authorization"] == f"Bearer {SECRET}" and s["headers"]["x-api-key"] == SECRET
        assert s["headers"]["Host"] == upstream.url.removeprefix("http://")

    records = read_wire(out, "proxy")
    assert len(records) == len(REQUESTS) + 1
    assert [r.api_shape for r in records] == [shape for _, shape, _ in REQUESTS] + ["unknown"]
    assert [r.model for r in records][:4] == ["gpt-x", "gpt-x", "claude-x", "gemini-x"]
    assert all(r.via == "proxy" for r in records)
    assert records[4].status == 429 and records[4].error_code == "rate_limited"
    assert [r.response_raw for r in records[:5]] == [p.content for p in proxied]
    assert verify_log(out).ok

    totals = meter_wire(records, PRICING)
    expected = total_cost(
        meter(usage_from_response(shape, d.json()), PRICING.get(body.get("model") or "gemini-x"))
        for (_, shape, body), d in zip(REQUESTS, direct, strict=True)
        if d.status_code == 200
    )
    assert totals.cost.status == "metered" and totals.cost.total == expected.total
    assert totals.errors_unbilled == 1 and totals.not_metered == 1 and totals.metered == 4

    wire_bytes = out.read_bytes()
    captured = capfd.readouterr()
    for text in (wire_bytes.decode(), captured.out, captured.err, json.dumps(totals.to_json())):
        assert SECRET not in text


def test_a_key_in_the_query_is_forwarded_but_never_written(tmp_path: Path, upstream: Upstream) -> None:
    out = tmp_path / "wire.jsonl"
    with start_proxy(upstream.url, out) as proxy:
        r = httpx.post(f"{proxy.url}/v1beta/models/gemini-x:generateContent?key={SECRET}", content=b"{}")
    assert r.status_code == 200 and r.json() == GEMINI_BODY
    assert upstream.seen[-1]["path"].endswith(f"key={SECRET}")
    assert SECRET not in out.read_text()
    (rec,) = read_wire(out)
    assert rec.url.endswith("key=REDACTED") and rec.model == "gemini-x"


def test_a_key_echoed_by_the_upstream_is_scrubbed_from_the_record(tmp_path: Path, upstream: Upstream) -> None:
    out = tmp_path / "wire.jsonl"
    with start_proxy(upstream.url, out) as proxy, httpx.Client() as client:
        r = post(client, proxy.url, "/v1/chat/completions", {"model": "echo", "messages": []})
    assert r.status_code == 401 and SECRET in r.text  # the client gets the upstream's bytes unchanged
    assert SECRET not in out.read_text()
    (rec,) = read_wire(out)
    assert rec.redacted and b"provided: REDACTED" in rec.response_raw and rec.error_code == "auth"


def test_a_chunked_upload_is_forwarded_whole_and_absolute_urls_are_refused(tmp_path: Path, upstream: Upstream) -> None:
    with start_proxy(upstream.url, tmp_path / "w.jsonl") as proxy:
        r = httpx.post(proxy.url + "/v1/chat/completions", content=iter([b'{"model": "gpt-x", ', b'"messages": []}']))
        assert r.status_code == 200 and upstream.seen[-1]["body"] == b'{"model": "gpt-x", "messages": []}'
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.sendall(b"GET http://elsewhere.example/ HTTP/1.1\r\nHost: elsewhere.example\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert len(read_wire(tmp_path / "w.jsonl")) == 1


def test_the_upstream_path_prefix_is_the_clients_base_url(tmp_path: Path, upstream: Upstream) -> None:
    with start_proxy(upstream.url + "/v1", tmp_path / "w.jsonl") as proxy:
        assert proxy.url == proxy.origin + "/v1"
        r = httpx.post(proxy.url + "/chat/completions", json={"model": "gpt-x", "messages": []})
    assert r.status_code == 200 and upstream.seen[-1]["path"] == "/v1/chat/completions"


def test_a_stream_is_relayed_as_it_comes_and_metered(tmp_path: Path, upstream: Upstream) -> None:
    out = tmp_path / "wire.jsonl"
    body = {"model": "gpt-x", "stream": True, "stream_options": {"include_usage": True}, "messages": [], "wait_for_client": True}
    with start_proxy(upstream.url, out) as proxy, httpx.Client() as client:
        received = b""
        with client.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=CRED_HEADERS) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            for chunk in r.iter_raw():
                received += chunk
                if b"data: " in received:
                    upstream.release.set()  # the first event arrived before the upstream finished
        assert upstream.released_in_time is True, "the proxy held the first event back"
        direct = client.post(upstream.url + "/v1/chat/completions", json=body).content
    assert received == direct
    (rec,) = read_wire(out)
    assert rec.stream and rec.response_raw == received and rec.finish_reason == "stop"
    assert rec.usage == usage_from_response("openai_chat", openai_body(body))
    assert meter_wire([rec], PRICING).cost.status == "metered"
    assert SECRET not in out.read_text()


def test_upstream_down_is_a_recorded_502(tmp_path: Path) -> None:
    out = tmp_path / "wire.jsonl"
    with start_proxy(f"http://127.0.0.1:{free_port()}", out) as proxy:
        r = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "gpt-x", "messages": []}, headers=CRED_HEADERS)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unreachable"
    assert SECRET not in r.text
    (rec,) = read_wire(out)
    assert rec.status is None and rec.error_code == "transport" and rec.response_raw == b""
    totals = meter_wire([rec], PRICING)
    assert totals.cost.total is None and totals.usage_unknown == 1  # no response: never $0


def test_32_concurrent_clients_give_32_records_and_an_intact_chain(tmp_path: Path, upstream: Upstream) -> None:
    out = tmp_path / "wire.jsonl"
    n = 32
    barrier = threading.Barrier(n)
    results: list[httpx.Response | BaseException] = [RuntimeError("not run")] * n

    def worker(i: int, base: str) -> None:
        try:
            with httpx.Client() as client:
                barrier.wait(10)
                results[i] = post(client, base, "/v1/chat/completions", {"model": "gpt-x", "messages": [{"content": "x" * i}]})
        except BaseException as exc:
            results[i] = exc

    with start_proxy(upstream.url, out) as proxy:
        threads = [threading.Thread(target=worker, args=(i, proxy.url)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert proxy.exchanges == n and proxy.failures == 0
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results), results
    status = verify_log(out, "proctor-wire:proxy")
    assert status.ok and status.lines == n
    records = read_wire(out)
    assert sorted(json.loads(r.request_body)["messages"][0]["content"] for r in records) == sorted("x" * i for i in range(n))
    assert meter_wire(records, PRICING).cost.total == total_cost(
        meter(usage_from_response("openai_chat", r.json()), PRICING.get("gpt-x")) for r in results if isinstance(r, httpx.Response)
    ).total


def test_keep_alive_serves_many_requests_on_one_connection(tmp_path: Path, upstream: Upstream) -> None:
    with start_proxy(upstream.url, tmp_path / "w.jsonl") as proxy, httpx.Client(limits=httpx.Limits(max_connections=1)) as client:
        for _ in range(5):
            assert client.post(proxy.url + "/v1/chat/completions", json={"model": "gpt-x", "messages": []}).status_code == 200
        assert len(proxy._server.conns) == 1
        assert proxy.exchanges == 5


def test_start_proxy_refusals(tmp_path: Path, upstream: Upstream) -> None:
    from harness.errors import Refusal

    cases: list[tuple[dict[str, Any], str]] = [
        ({"upstream": "ftp://x/v1", "out": tmp_path / "w.jsonl"}, "proxy_upstream_invalid"),
        ({"upstream": "http://user:pw@x/v1", "out": tmp_path / "w.jsonl"}, "proxy_upstream_invalid"),
        ({"upstream": upstream.url, "out": tmp_path / "w.jsonl", "host": "0.0.0.0"}, "proxy_not_loopback"),
        ({"upstream": upstream.url, "out": tmp_path / "missing" / "w.jsonl"}, "folder_missing"),
    ]
    for kwargs, code in cases:
        with pytest.raises(Refusal) as info:
            start_proxy(**kwargs)
        assert info.value.code == code
        assert "pw" not in info.value.message
    broken = tmp_path / "broken.jsonl"
    ChainedLog(broken, "proctor-wire:proxy").append({"a": 1})
    broken.write_bytes(broken.read_bytes() + b'{"torn')
    with pytest.raises(Refusal) as info:
        start_proxy(upstream.url, broken)
    assert info.value.code == "log_torn_tail"


# --- the command ----------------------------------------------------------------------------


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))
        if proc.poll() is not None:
            raise AssertionError(f"exited early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError("never became ready")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env.update(extra)
    return env


def test_cli_wire_proxy_records_and_stops_on_sigterm(tmp_path: Path, upstream: Upstream) -> None:
    out, ready = tmp_path / "wire.jsonl", tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "wire", "proxy", "--port", "0", "--upstream", upstream.url + "/v1",
         "--out", str(out), "--ready-file", str(ready), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=clean_env(),
    )
    try:
        info = wait_for(ready, proc)
        assert info["pid"] == proc.pid and info["url"].endswith("/v1")
        r = httpx.post(info["url"] + "/chat/completions", json={"model": "gpt-x", "messages": []}, headers=CRED_HEADERS)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    (line,) = stdout.splitlines()
    summary = json.loads(line)
    assert summary["ok"] is True and summary["exchanges"] == 1 and summary["record_failures"] == 0
    for text in (stdout, stderr, out.read_text(), ready.read_text()):
        assert SECRET not in text
    assert len(read_wire(out, "proxy")) == 1
    metered = run_proctor("wire", "meter", str(out))
    assert metered.code == 0 and metered.out["cost"]["status"] == "price_unknown"  # gpt-x is not in the bundled table
    assert metered.out["tokens"]["input"] == 802  # 1000 + len("[]") prompt tokens, 200 of them cached


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        (["--host", "0.0.0.0"], "proxy_not_loopback"),
        (["--upstream", "not a url"], "proxy_upstream_invalid"),
        (["--out", "/nonexistent-folder/w.jsonl"], "folder_missing"),
        (["--ready-file", "/nonexistent-folder/r.json"], "folder_missing"),
    ],
)
def test_cli_wire_proxy_refusals(tmp_path: Path, extra: list[str], code: str) -> None:
    words = {"--port": "0", "--upstream": "http://127.0.0.1:9/v1", "--out": str(tmp_path / "w.jsonl")}
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        words[flag] = value
    done = run_proctor("wire", "proxy", *[w for pair in words.items() for w in pair])
    assert done.code == 3 and done.out["refusal"] == code


def test_cli_wire_proxy_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run_proctor("wire", "proxy", "--port", str(port), "--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "w.jsonl"))
    assert done.code == 3 and done.out["refusal"] == "proxy_port_unavailable"


def test_cli_wire_proxy_usage_errors() -> None:
    done = run_proctor("wire", "proxy", "--port", "0")
    assert done.code == 2 and done.out["refusal"] == "usage_error"


# --- through the simulator ----------------------------------------------------------------------


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two simulators with the same seed: one called directly, one through the proxy."""
    procs, urls = [], []
    try:
        for i in range(2):
            ready = tmp_path / f"sim{i}.json"
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", "--ready-file", str(ready), "--seed", "7"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                env=clean_env(PROCTOR_SIM_LATENCY_SCALE="0"),
            )
            procs.append(proc)
            urls.append(wait_for(ready, proc)["url"])
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.communicate(timeout=30)


def test_an_agent_through_the_proxy_to_the_simulator_meters_like_direct_calls(tmp_path: Path, sims: tuple[str, str]) -> None:
    direct_url, proxied_upstream = sims
    out = tmp_path / "wire.jsonl"
    pricing = load_pricing()
    prompts = [(m, f"question {i}: what is {i} * 7?") for i in range(4) for m in ("sim-flash", "sim-glm", "sim-k3")]

    def agent(base_url: str) -> list[dict[str, Any]]:
        """An agent CLI's loop in miniature: one OpenAI client, a conversation per prompt."""
        bodies = []
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {SECRET}"}, timeout=30) as client:
            for model, prompt in prompts:
                r = client.post("/chat/completions", json={"model": model, "messages": [{"role": "user", "content": prompt}]})
                assert r.status_code == 200, r.text
                bodies.append(r.json())
        return bodies

    direct = agent(direct_url)
    with start_proxy(proxied_upstream, out) as proxy:
        assert proxy.url.endswith("/v1")
        through = agent(proxy.url)
    expected = total_cost(
        meter(usage_from_response("openai_chat", body), pricing.get(model))
        for (model, _), body in zip(prompts, direct, strict=True)
    )
    records = read_wire(out, "proxy")
    assert len(records) == len(prompts) and verify_log(out).ok
    assert [json.loads(r.response_raw) for r in records] == through
    totals = meter_wire(records, pricing)
    assert expected.status == "metered" and expected.total is not None and expected.total > 0
    assert totals.cost.total == expected.total
    assert totals.tokens.to_json() == {
        c: sum(usage_from_response("openai_chat", b).to_json()[c] for b in direct)  # type: ignore[union-attr]
        for c in totals.tokens.to_json()
    }
    assert SECRET not in out.read_text()
