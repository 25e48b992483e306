"""Provider adapters: exact request bytes, recorded responses, loopback HTTP, errors as data, no leaked secret."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.providers.base import ERROR_CODES, Exchange, GenerationSettings, ParsedResponse
from harness.providers.credentials import REDACTED
from harness.providers.registry import ADAPTERS, API_SHAPES, adapter_for, classify_error
from harness.providers.transport import Transport
from tests.support.paths import FIXTURES as PROVIDER_FIXTURES
from tests.support.paths import REPO
from tests.support.provider_server import ProviderServer, fixture_bytes, load_fixture

FIXTURES = PROVIDER_FIXTURES / "providers"
ALL_FIXTURES = sorted(FIXTURES.glob("*/*.json"))
SECRET = "sk-test-SECRET-123"
PROMPT = "What is 6 x 7? Answer with a number."
ALL_SET = GenerationSettings(
    max_output_tokens=256, temperature=0.5, top_p=0.9, seed=7, reasoning_effort="low", system="Be brief."
)


def _fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def _check(parsed: ParsedResponse, expect: dict[str, Any]) -> None:
    for key, want in expect.items():
        got = (None if parsed.usage is None else parsed.usage.to_json()) if key == "usage" else getattr(parsed, key)
        assert got == want, f"{key}: {got!r} != {want!r} ({parsed})"
    assert parsed.error_code is None or parsed.error_code in ERROR_CODES
    if parsed.error_code is not None:
        assert parsed.error_message and len(parsed.error_message) <= 500


# --- build_request -----------------------------------------------------------


@pytest.mark.parametrize("shape", API_SHAPES)
def test_request_bytes_are_deterministic_and_hash_as_reported(shape: str) -> None:
    adapter = adapter_for(shape)
    a = adapter.build_request("m-1", PROMPT, GenerationSettings(), "https://api.example.test/v1/")
    b = adapter.build_request("m-1", PROMPT, GenerationSettings(), "https://api.example.test/v1")
    assert a == b
    assert a.body_sha256 == sha256_hex(a.body)
    assert a.body == canonical_bytes(json.loads(a.body))  # canonical JSON, byte for byte
    c = adapter.build_request("m-1", PROMPT + " ", GenerationSettings(), "https://api.example.test/v1")
    assert c.body_sha256 != a.body_sha256
    assert a.api_shape == shape and a.model == "m-1"


DEFAULT_BODIES: dict[str, dict[str, Any]] = {
    "openai_chat": {"model": "m-1", "messages": [{"role": "user", "content": PROMPT}]},
    "openai_responses": {"model": "m-1", "input": [{"role": "user", "content": PROMPT}]},
    "anthropic_messages": {"model": "m-1", "max_tokens": 1024, "messages": [{"role": "user", "content": PROMPT}]},
    "gemini_generate": {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]},
}


@pytest.mark.parametrize("shape", API_SHAPES)
def test_default_body_has_no_sampling_or_system_fields(shape: str) -> None:
    request = adapter_for(shape).build_request("m-1", PROMPT, GenerationSettings(), "https://x.test/v1")
    assert json.loads(request.body) == DEFAULT_BODIES[shape]


FULL_BODIES: dict[str, dict[str, Any]] = {
    "openai_chat": {
        "model": "m-1",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}],
        "max_tokens": 256,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 7,
        "reasoning_effort": "low",
    },
    "openai_responses": {
        "model": "m-1",
        "input": [{"role": "user", "content": PROMPT}],
        "instructions": "Be brief.",
        "max_output_tokens": 256,
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning": {"effort": "low"},
    },
    "anthropic_messages": {
        "model": "m-1",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": PROMPT}],
        "system": "Be brief.",
        "temperature": 0.5,
        "top_p": 0.9,
        "output_config": {"effort": "low"},
    },
    "gemini_generate": {
        "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "maxOutputTokens": 256,
            "temperature": 0.5,
            "topP": 0.9,
            "seed": 7,
            "thinkingConfig": {"thinkingBudget": 1024},
        },
    },
}
NO_SEED = {"openai_responses", "anthropic_messages"}


@pytest.mark.parametrize("shape", API_SHAPES)
def test_every_setting_maps_to_the_documented_field(shape: str) -> None:
    s = ALL_SET if shape not in NO_SEED else GenerationSettings(**{**ALL_SET.__dict__, "seed": None})
    request = adapter_for(shape).build_request("m-1", PROMPT, s, "https://x.test/v1")
    assert json.loads(request.body) == FULL_BODIES[shape]


ROUTES = {
    "openai_chat": ("https://x.test/v1/chat/completions", "Authorization", "Bearer ", {}),
    "openai_responses": ("https://x.test/v1/responses", "Authorization", "Bearer ", {}),
    "anthropic_messages": ("https://x.test/v1/messages", "x-api-key", "", {"anthropic-version": "2023-06-01"}),
    "gemini_generate": ("https://x.test/v1/models/m-1:generateContent", "x-goog-api-key", "", {}),
}


@pytest.mark.parametrize("shape", API_SHAPES)
def test_url_and_credential_header(shape: str) -> None:
    request = adapter_for(shape).build_request("m-1", PROMPT, GenerationSettings(), "https://x.test/v1/")
    url, name, prefix, extra = ROUTES[shape]
    assert (request.url, request.credential_header, request.credential_prefix) == (url, name, prefix)
    assert dict(request.headers) == {"content-type": "application/json", **extra}
    assert "body_sha256" in request.public_json() and SECRET not in json.dumps(request.public_json())


@pytest.mark.parametrize(
    ("shape", "settings_", "code"),
    [
        ("openai_responses", GenerationSettings(seed=1), "setting_unsupported"),
        ("anthropic_messages", GenerationSettings(seed=1), "setting_unsupported"),
        ("anthropic_messages", GenerationSettings(reasoning_effort="minimal"), "setting_unsupported"),
        ("anthropic_messages", GenerationSettings(temperature=1.5), "setting_unsupported"),
        ("gemini_generate", GenerationSettings(reasoning_effort="minimal"), "setting_unsupported"),
        ("openai_chat", GenerationSettings(reasoning_effort="extreme"), "setting_unsupported"),
        ("openai_chat", GenerationSettings(max_output_tokens=True), "setting_unsupported"),
        ("openai_chat", GenerationSettings(max_output_tokens=0), "setting_unsupported"),
        ("openai_chat", GenerationSettings(temperature=float("nan")), "setting_unsupported"),
        ("openai_responses", GenerationSettings(top_p=1.5), "setting_unsupported"),
        ("gemini_generate", GenerationSettings(seed=1.5), "setting_unsupported"),  # type: ignore[arg-type]
    ],
)
def test_unsupported_settings_are_refused(shape: str, settings_: GenerationSettings, code: str) -> None:
    with pytest.raises(Refusal) as caught:
        adapter_for(shape).build_request("m-1", PROMPT, settings_, "https://x.test/v1")
    assert caught.value.code == code


def test_bad_model_url_and_shape_are_refused() -> None:
    with pytest.raises(Refusal, match="model_id_invalid"):
        adapter_for("gemini_generate").build_request("models/gemini-x", PROMPT, GenerationSettings(), "https://x.test")
    with pytest.raises(Refusal, match="model_id_invalid"):
        adapter_for("openai_chat").build_request("bad model", PROMPT, GenerationSettings(), "https://x.test")
    for url in ("ftp://x.test", "https://x.test/v1?key=abc", "https://x .test"):
        with pytest.raises(Refusal, match="base_url_invalid"):
            adapter_for("openai_chat").build_request("m", PROMPT, GenerationSettings(), url)
    with pytest.raises(Refusal) as caught:
        adapter_for("grpc_magic")
    assert caught.value.code == "unknown_api_shape" and "openai_chat" in caught.value.message
    assert set(ADAPTERS) == set(API_SHAPES)
    assert all(shape == ADAPTERS[shape].API_SHAPE for shape in API_SHAPES)


def test_adapters_do_not_import_httpx() -> None:
    code = "import sys, harness.cli.main, harness.providers.registry; sys.exit('httpx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


# --- recorded responses ------------------------------------------------------


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_fixture_id)
def test_recorded_response_parses_as_expected(path: Path) -> None:
    fx = load_fixture(path)
    parsed = adapter_for(path.parent.name).parse_response(fx["status"], fx["headers"], fixture_bytes(fx["body"]))
    _check(parsed, fx["expect"])


@pytest.mark.parametrize("shape", API_SHAPES)
def test_fixtures_cover_every_error_class(shape: str) -> None:
    codes = {load_fixture(p)["expect"]["error_code"] for p in (FIXTURES / shape).glob("*.json")}
    required = {None, "auth", "rate_limited", "server_error", "bad_request", "context_length"}
    required |= {"content_filter", "malformed_response"}
    assert required <= codes
    assert {"quota"} <= codes or shape == "anthropic_messages"
    assert {"billing"} <= codes or shape == "openai_responses"


def test_classifier_truncates_and_masks_keys() -> None:
    code, message = classify_error("openai_chat", 400, {"error": {"message": "x" * 5000, "type": "invalid"}})
    assert code == "bad_request" and len(message) <= 500
    code, message = classify_error("openai_chat", 401, {"error": {"message": "bad key sk-proj-abcdefghijklmnopqrstu"}})
    assert code == "auth" and "abcdefghijklmnopqrstu" not in message
    assert classify_error("openai_chat", 307, b"")[0] == "bad_request"
    assert classify_error("openai_chat", 408, b"")[0] == "server_error"
    assert classify_error("openai_chat", 418, b"teapot")[0] == "bad_request"
    assert classify_error("openai_chat", 599, None)[0] == "server_error"


# --- loopback HTTP -----------------------------------------------------------


@pytest.fixture
def server() -> Any:
    with ProviderServer() as s:
        yield s


def _request(shape: str, base_url: str) -> Any:
    return adapter_for(shape).build_request("m-1", PROMPT, ALL_SET if shape not in NO_SEED else GenerationSettings(), base_url)


def _assert_round_trip(ex: Exchange, server: ProviderServer, served: bytes, fx: dict[str, Any]) -> None:
    (got,) = server.received
    request = ex.request
    assert got.body == request.body  # byte for byte
    assert got.path == request.url.removeprefix(server.url)
    assert got.header(request.credential_header or "") == request.credential_prefix + SECRET
    assert got.header("content-type") == "application/json"
    assert got.header("accept-encoding") == "identity"
    assert ex.status == fx["status"]
    assert ex.raw_response == served and ex.response_sha256 == sha256_hex(served)
    assert ex.started <= ex.ended and ex.latency_s >= 0
    _check(ex.parsed, fx["expect"])


@pytest.mark.parametrize("shape", API_SHAPES)
def test_round_trip_sync_and_async(shape: str, server: ProviderServer) -> None:
    fx = load_fixture(FIXTURES / shape / "ok_full_usage.json")
    served = server.serve_fixture(fx)
    request = _request(shape, server.url)
    with Transport(timeout_s=10) as transport:
        _assert_round_trip(transport.send(request, SECRET), server, served, fx)
    server.received.clear()

    async def go() -> Exchange:
        async with Transport(timeout_s=10) as transport:
            return await transport.asend(request, SECRET)

    _assert_round_trip(asyncio.run(go()), server, served, fx)


def test_async_request_heads_made_once_carry_each_requests_credential_and_length(server: ProviderServer) -> None:
    """The async transport reuses the URL and headers it made (`Transport._head`) only for the same URL,
    headers and credential; every request arrives with its own credential, Content-Length and body."""
    fx = load_fixture(FIXTURES / "openai_chat" / "ok_full_usage.json")
    server.serve_fixture(fx)
    first = _request("openai_chat", server.url)
    same_length = dataclasses.replace(first, body=first.body.replace(b"m-1", b"m-2"))
    longer = dataclasses.replace(first, body=first.body.replace(b"m-1", b"m-10"))
    other = SECRET + "-other"
    sends = [(first, SECRET), (first, SECRET), (first, other), (same_length, SECRET), (longer, SECRET), (first, None)]

    async def go() -> list[Exchange]:
        async with Transport(timeout_s=10) as transport:
            return [await transport.asend(request, credential) for request, credential in sends]

    exchanges = asyncio.run(go())
    assert [ex.status for ex in exchanges] == [fx["status"]] * len(sends)
    assert len(server.received) == len(sends)
    header = first.credential_header or ""
    for got, (request, credential) in zip(server.received, sends, strict=True):
        assert got.body == request.body
        assert got.header("content-length") == str(len(request.body))
        assert got.header(header) == (None if credential is None else first.credential_prefix + credential)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_fixture_id)
def test_every_fixture_over_http(path: Path, server: ProviderServer) -> None:
    fx = load_fixture(path)
    served = server.serve_fixture(fx)
    with Transport(timeout_s=10) as transport:
        ex = transport.send(_request(path.parent.name, server.url), SECRET)
    _assert_round_trip(ex, server, served, fx)
    assert ex.response_headers.get("content-type") == fx["headers"]["content-type"]


def test_no_retry_and_no_redirect(server: ProviderServer) -> None:
    with Transport(timeout_s=10) as transport:
        server.serve(503, {"content-type": "application/json"}, b'{"error":{"message":"down"}}')
        assert transport.send(_request("openai_chat", server.url), SECRET).parsed.error_code == "server_error"
        assert len(server.received) == 1
        server.serve(307, {"location": "http://127.0.0.1:9/elsewhere"}, b"")
        ex = transport.send(_request("openai_chat", server.url), SECRET)
    assert ex.status == 307 and ex.parsed.error_code == "bad_request" and len(server.received) == 2


def _closed_port() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def _transport_failures(server: ProviderServer, credential: str | None) -> list[Exchange]:
    """A timeout and a refused connection, sync and async."""
    server.serve(200, {"content-type": "application/json"}, b"{}", delay_s=3)
    slow, refused = _request("openai_chat", server.url), _request("anthropic_messages", _closed_port())
    with Transport(timeout_s=0.3) as transport:
        out = [transport.send(slow, credential), transport.send(refused, credential)]

    async def go() -> list[Exchange]:
        async with Transport(timeout_s=0.3) as transport:
            return [await transport.asend(slow, credential), await transport.asend(refused, credential)]

    return out + asyncio.run(go())


def test_timeout_and_refused_connection_are_data(server: ProviderServer) -> None:
    started = time.monotonic()
    exchanges = _transport_failures(server, SECRET)
    assert time.monotonic() - started < 2.5
    assert [ex.parsed.error_code for ex in exchanges] == ["timeout", "transport", "timeout", "transport"]
    for ex in exchanges:
        assert ex.status is None and ex.raw_response == b"" and ex.response_sha256 == sha256_hex(b"")
        assert ex.parsed.error_message and ex.meta["exception"]
        assert ex.started <= ex.ended
    # a refused connection never sent the request (it costs nothing); a timeout after sending may be billed
    assert [ex.meta["sent"] for ex in exchanges] == [True, False, True, False]


def test_a_request_that_never_left_says_so_and_one_that_left_says_so_too(raw_server: _RawServer) -> None:
    """`meta["sent"]`: False only when the failure came before a byte was written (connect, DNS, TLS)."""
    unresolvable = "http://proctor-no-such-host.invalid"
    for url in (_closed_port(), unresolvable):
        for ex in _both(url):
            assert ex.status is None and ex.meta["sent"] is False, (url, ex.meta)
    raw_server.reply = AWKWARD["hang-up-silently"]  # connected, the request written, then no answer
    for ex in _both(raw_server.url()):
        assert ex.status is None and ex.parsed.error_code == "transport" and ex.meta["sent"] is True
    raw_server.reply = AWKWARD["content-length"]
    for ex in _both(raw_server.url()):
        assert ex.status == 200 and "sent" not in ex.meta  # an answer: sent, and it says what it cost


class _EchoServer(ThreadingHTTPServer):
    """Answers each Chat Completions POST with its own prompt as the text, after `delay_s`
    (or trickling the body over ~1 s when `trickle`); counts connections and requests in flight."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self.lock = threading.Lock()
        self.delay_s, self.trickle = 0.0, False
        self.open = self.in_flight = self.peak = 0
        self.ports: set[int] = set()
        self.prompts: list[str] = []  # in the order they arrived

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up is expected here."""


class _EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _EchoServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.open += 1
            self.server.ports.add(self.client_address[1])

    def finish(self) -> None:
        with self.server.lock:
            self.server.open -= 1
        super().finish()

    def do_POST(self) -> None:
        echo = self.server
        prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"][-1]["content"]
        with echo.lock:
            echo.in_flight += 1
            echo.peak = max(echo.peak, echo.in_flight)
            echo.prompts.append(prompt)
        time.sleep(echo.delay_s)
        with echo.lock:
            echo.in_flight -= 1
        message = {"role": "assistant", "content": prompt}
        body = json.dumps({"id": f"echo-{prompt}", "choices": [{"message": message, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        step = max(1, len(body) // 10) if echo.trickle else len(body)
        for start in range(0, len(body), step):
            if echo.trickle:
                time.sleep(0.1)  # well within the client's per-read timeout
            self.wfile.write(body[start : start + step])
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _ask(echo: _EchoServer, prompt: str) -> Any:
    return adapter_for("openai_chat").build_request("m-1", prompt, GenerationSettings(), echo.url)


def _eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_many_concurrent_asends_each_get_their_own_response(echo: _EchoServer) -> None:
    echo.delay_s = 0.2
    prompts = [f"prompt {i}" for i in range(48)]

    async def go() -> list[Exchange]:
        async with Transport(timeout_s=10, max_connections=8) as transport:
            return list(await asyncio.gather(*(transport.asend(_ask(echo, p), SECRET) for p in prompts)))

    exchanges = asyncio.run(go())
    assert [ex.parsed.text for ex in exchanges] == prompts
    assert all(ex.status == 200 and ex.parsed.request_id == f"echo-{ex.parsed.text}" for ex in exchanges)
    assert echo.peak == 8 and len(echo.ports) == 8  # max_connections in all, each connection kept alive


def test_many_threads_each_get_their_own_response(echo: _EchoServer) -> None:
    echo.delay_s = 0.2
    prompts = [f"prompt {i}" for i in range(24)]
    with Transport(timeout_s=10, max_connections=4) as transport, ThreadPoolExecutor(len(prompts)) as pool:
        exchanges = list(pool.map(lambda p: transport.send(_ask(echo, p), SECRET), prompts))
    assert [ex.parsed.text for ex in exchanges] == prompts and all(ex.status == 200 for ex in exchanges)
    assert echo.peak == 4 and len(echo.ports) == 4


def test_a_lone_caller_keeps_one_connection(echo: _EchoServer) -> None:
    transport = Transport(timeout_s=10)

    async def go(run: int) -> list[str | None]:
        return [(await transport.asend(_ask(echo, f"{run}.{i}"), SECRET)).parsed.text for i in range(4)]

    assert asyncio.run(go(1)) == ["1.0", "1.1", "1.2", "1.3"]
    assert asyncio.run(go(2)) == ["2.0", "2.1", "2.2", "2.3"]  # a new event loop gets its own connections
    assert [transport.send(_ask(echo, f"s.{i}"), SECRET).parsed.text for i in range(4)] == [f"s.{i}" for i in range(4)]
    transport.close()
    assert len(echo.ports) == 3  # one per event loop, one for the sync caller


def test_waiting_for_a_free_connection_times_out_as_data(echo: _EchoServer) -> None:
    echo.trickle = True  # the first answer takes ~1 s, every read well within timeout_s

    async def go() -> list[Exchange]:
        async with Transport(timeout_s=0.6, max_connections=1) as transport:
            return list(await asyncio.gather(transport.asend(_ask(echo, "a"), SECRET), transport.asend(_ask(echo, "b"), SECRET)))

    with Transport(timeout_s=0.6, max_connections=1) as transport, ThreadPoolExecutor(2) as pool:
        seen = len(echo.prompts)
        first = pool.submit(transport.send, _ask(echo, "a"), SECRET)
        assert _eventually(lambda: len(echo.prompts) == seen + 1)  # the first holds the one connection
        second = pool.submit(transport.send, _ask(echo, "b"), SECRET)
        exchanges = [first.result(), second.result()]
    exchanges += asyncio.run(go())
    for i, (ex, waited) in enumerate(zip(exchanges, [False, True, False, True], strict=True)):
        if waited:
            assert ex.status is None and ex.parsed.error_code == "timeout" and ex.meta["exception"] == "PoolTimeout"
            assert ex.meta["sent"] is False  # it waited for a connection and never got one
            assert ex.ended < exchanges[i - 1].ended  # it gave up before the answer it waited behind arrived
        else:
            assert ex.status == 200 and ex.parsed.text == "a"


def test_aclose_and_close_close_every_connection(echo: _EchoServer) -> None:
    echo.delay_s = 0.5  # long enough that the 3 threads' requests overlap (3 connections) on a busy machine
    transport = Transport(timeout_s=10, max_connections=4)

    async def go() -> None:
        exchanges = await asyncio.gather(*(transport.asend(_ask(echo, str(i)), SECRET) for i in range(8)))
        assert [ex.parsed.text for ex in exchanges] == [str(i) for i in range(8)]
        with ThreadPoolExecutor(3) as pool:
            assert all(ex.status == 200 for ex in pool.map(lambda i: transport.send(_ask(echo, str(i)), SECRET), range(3)))
        assert _eventually(lambda: echo.open == 7)  # 4 async, 3 sync, kept alive
        await transport.aclose()
        assert _eventually(lambda: echo.open == 0)
        assert (await transport.asend(_ask(echo, "again"), SECRET)).parsed.text == "again"  # reopens
        await transport.aclose()

    asyncio.run(go())
    assert _eventually(lambda: echo.open == 0)


def test_waiting_asends_are_served_in_arrival_order(echo: _EchoServer) -> None:
    echo.delay_s = 0.5  # b and c queue while a1 is held, even when the loop stalls for a while

    async def go() -> None:
        async with Transport(timeout_s=10, max_connections=1) as transport:

            async def again_at_once(name: str) -> None:  # a caller that asks again at once must queue too
                for i in (1, 2):
                    await transport.asend(_ask(echo, f"{name}{i}"), SECRET)

            tasks = [asyncio.create_task(again_at_once("a"))]
            for name in ("b", "c"):
                await asyncio.sleep(0.02)
                tasks.append(asyncio.create_task(transport.asend(_ask(echo, name), SECRET)))
            await asyncio.gather(*tasks)

    asyncio.run(go())
    assert echo.prompts == ["a1", "b", "c", "a2"]


def test_a_cancelled_asend_frees_its_connection(echo: _EchoServer) -> None:
    echo.delay_s = 1.0

    async def go() -> Exchange:
        async with Transport(timeout_s=10, max_connections=1) as transport:
            task = asyncio.create_task(transport.asend(_ask(echo, "cancelled"), SECRET))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            echo.delay_s = 0.0
            return await asyncio.wait_for(transport.asend(_ask(echo, "next"), SECRET), 5)

    ex = asyncio.run(go())
    assert ex.parsed.text == "next" and len(echo.ports) == 2  # the slot came back, on a new connection


def test_an_idle_connection_past_keep_alive_is_not_reused(echo: _EchoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.providers.transport as module

    monkeypatch.setattr(module, "_KEEPALIVE_S", 0.0)

    async def go() -> list[str | None]:
        async with Transport(timeout_s=10) as transport:
            return [(await transport.asend(_ask(echo, str(i)), SECRET)).parsed.text for i in range(3)]

    assert asyncio.run(go()) == ["0", "1", "2"] and len(echo.ports) == 3


def test_cookies_from_a_response_are_never_sent(server: ProviderServer) -> None:
    server.serve(200, {"content-type": "application/json", "set-cookie": "session=abc; Path=/"}, b"{}")
    request = _request("openai_chat", server.url)
    with Transport(timeout_s=10) as transport:
        transport.send(request, SECRET)
        transport.send(request, SECRET)

    async def go() -> None:
        async with Transport(timeout_s=10) as transport:
            await transport.asend(request, SECRET)
            await transport.asend(request, SECRET)

    asyncio.run(go())
    assert len(server.received) == 4 and all(got.header("cookie") is None for got in server.received)


class _RawServer:
    """Answers every request with the bytes in `reply` (then hangs up when `hang_up`), over TLS
    when given a certificate; counts the connections it accepted."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.tls, self.reply, self.hang_up, self.connections, self.closed = tls, b"", True, 0, 0
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = next(int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))
                while len(buffered) < length:
                    buffered += conn.recv(65536)
                buffered = buffered[length:]
                conn.sendall(self.reply)
                if self.hang_up:
                    return
        except (OSError, StopIteration):  # a client that refused our certificate, or hung up
            return
        finally:
            conn.close()
            self.closed += 1


@pytest.fixture
def raw_server() -> Iterator[_RawServer]:
    server = _RawServer()
    yield server
    server.sock.close()


_BODY = json.dumps({"id": "r-1", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}).encode()
_GZ = gzip.compress(_BODY)
_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
AWKWARD = {
    "content-length": _JSON + b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY),
    "chunked": _JSON + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(_BODY), _BODY),
    "http-1.0-until-close": b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + _BODY,
    "gzip": _JSON + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(_GZ), _GZ),
    "mangled-gzip": _JSON + b"Content-Encoding: gzip\r\nContent-Length: 10\r\n\r\n0123456789",
    "100-continue-first": b"HTTP/1.1 100 Continue\r\n\r\n" + _JSON + b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY),
    "cut-short": _JSON + b"Content-Length: 500\r\n\r\n" + _BODY,
    "bad-content-length": _JSON + b"Content-Length: abc\r\n\r\n" + _BODY,
    "not-http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "hang-up-silently": b"",
}


def _both(url: str, credential: str = SECRET) -> tuple[Exchange, Exchange]:
    """The same request sent once by `send` and once by `asend`."""
    request = adapter_for("openai_chat").build_request("m-1", PROMPT, GenerationSettings(), url)
    with Transport(timeout_s=5) as transport:
        sync = transport.send(request, credential)

    async def go() -> Exchange:
        async with Transport(timeout_s=5) as transport:
            return await transport.asend(request, credential)

    return sync, asyncio.run(go())


def _view(ex: Exchange) -> tuple[Any, ...]:
    return ex.status, ex.raw_response, ex.response_headers, ex.parsed, ex.meta


@pytest.mark.parametrize("case", list(AWKWARD))
def test_sync_and_async_read_awkward_responses_alike(case: str, raw_server: _RawServer) -> None:
    raw_server.reply = AWKWARD[case]
    sync, async_ = _both(raw_server.url())
    assert _view(sync) == _view(async_)  # the same Exchange, error messages included
    if case in ("content-length", "chunked", "http-1.0-until-close", "gzip", "100-continue-first"):
        assert sync.status == 200 and sync.raw_response == _BODY and sync.parsed.text == "hi"
    elif case == "mangled-gzip":
        assert sync.parsed.error_code == "malformed_response" and sync.meta["status_before_failure"] == 200
    else:
        assert sync.status is None and sync.parsed.error_code == "transport"
        assert ("status_before_failure" in sync.meta) == (case == "cut-short")
        assert sync.meta["sent"] is True  # connected and written: an answer may have been billed


def test_a_plain_http_asend_never_loads_the_certificate_store(raw_server: _RawServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The async transport asks for its TLS context only on an https connection (loading the store costs
    about 25 ms of CPU per invocation); the TLS test above shows an https one still verifies."""
    import httpx

    def refuse() -> None:
        raise AssertionError("the certificate store was loaded for a plain-http request")

    raw_server.reply, raw_server.hang_up = AWKWARD["content-length"], False
    request = adapter_for("openai_chat").build_request("m-1", PROMPT, GenerationSettings(), raw_server.url())
    monkeypatch.setattr(httpx, "create_ssl_context", refuse)

    async def go() -> list[Exchange]:
        async with Transport(timeout_s=5) as transport:
            return [await transport.asend(request, SECRET) for _ in range(3)]

    assert [(ex.status, ex.parsed.text) for ex in asyncio.run(go())] == [(200, "hi")] * 3


def test_a_connection_the_server_closed_is_not_reused(raw_server: _RawServer) -> None:
    raw_server.reply = AWKWARD["content-length"]  # keep-alive by the headers, then the server hangs up
    request = adapter_for("openai_chat").build_request("m-1", PROMPT, GenerationSettings(), raw_server.url())

    def hung_up() -> bool:  # the client finds out before its next request, not by failing it
        return _eventually(lambda: raw_server.closed == raw_server.connections)

    with Transport(timeout_s=5) as transport:
        assert [hung_up() and transport.send(request, SECRET).status for _ in range(4)] == [200] * 4

    async def go() -> list[int | None]:
        async with Transport(timeout_s=5) as transport:
            return [hung_up() and (await transport.asend(request, SECRET)).status for _ in range(4)]

    assert asyncio.run(go()) == [200] * 4 and raw_server.connections == 8


def test_tls_is_verified_alike_sync_and_async(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = _RawServer(tls)
    server.reply, server.hang_up = AWKWARD["content-length"], False
    try:
        for ex in _both(server.url("localhost")):  # a certificate nobody vouches for
            assert ex.status is None and ex.parsed.error_code == "transport" and ex.meta["exception"] == "ConnectError"
            assert "CERTIFICATE_VERIFY_FAILED" in (ex.parsed.error_message or "")
            assert ex.meta["sent"] is False  # the handshake failed before the request was written
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted, as httpx has always let it be
        for ex in _both(server.url("localhost")):
            assert ex.status == 200 and ex.parsed.text == "hi" and ex.meta["http_version"] == "HTTP/1.1"
        for ex in _both(server.url("127.0.0.1")):  # trusted, but not for this name
            assert ex.status is None and ex.meta["exception"] == "ConnectError"
            assert "CERTIFICATE_VERIFY_FAILED" in (ex.parsed.error_message or "")
    finally:
        server.sock.close()


def test_bad_credentials_are_refused_without_echo() -> None:
    request = _request("openai_chat", "http://127.0.0.1:9")
    with Transport(timeout_s=1) as transport:
        for bad in ("short", SECRET + "\r\nx-evil: 1", SECRET + " é"):
            with pytest.raises(Refusal) as caught:
                transport.send(request, bad)
            assert caught.value.code == "credential_malformed"
            assert SECRET not in json.dumps(caught.value.to_json()) and SECRET not in str(caught.value)


def _record(ex: Exchange) -> dict[str, Any]:
    """Everything an Exchange carries, as a wire log would write it."""
    return {
        "request": ex.request.public_json(),
        "status": ex.status,
        "raw": ex.raw_response.decode("utf-8", "backslashreplace"),
        "sha256": ex.response_sha256,
        "headers": ex.response_headers,
        "parsed": ex.parsed.to_json(),
        "meta": ex.meta,
        "repr": repr(ex),
    }


def test_no_credential_in_any_output(server: ProviderServer, tmp_path: Path) -> None:
    exchanges: list[Exchange] = []
    with Transport(timeout_s=10) as transport:
        for path in ALL_FIXTURES:
            server.serve_fixture(load_fixture(path))
            exchanges.append(transport.send(_request(path.parent.name, server.url), SECRET))
        # a hostile upstream that echoes the key in its body (raw and JSON-escaped) and a header
        echo = '{"error": {"message": "bad key ' + SECRET + '", "type": "\\u0073k-test-SECRET-123"}}'
        server.serve(401, {"content-type": "application/json", "x-echo": SECRET.upper()}, echo.encode())
        leaky = transport.send(_request("openai_chat", server.url), SECRET)
        exchanges.append(leaky)
    assert all(got.header(r.request.credential_header or "") == r.request.credential_prefix + SECRET
               for got, r in zip(server.received, exchanges, strict=True))  # the key did go out
    exchanges += _transport_failures(server, SECRET)
    assert leaky.meta.get("credential_redacted") is True and REDACTED in leaky.raw_response.decode()
    assert SECRET.lower() not in json.dumps(json.loads(leaky.raw_response), ensure_ascii=False).lower()
    assert leaky.parsed.error_code == "auth"
    log = tmp_path / "wire.jsonl"
    with log.open("w", encoding="utf-8") as out:
        for ex in exchanges:
            line = json.dumps(_record(ex), ensure_ascii=False)
            assert SECRET.lower() not in line.lower() and SECRET.lower().encode() not in ex.raw_response.lower()
            out.write(line + "\n")
    (tmp_path / "errors.txt").write_text("\n".join(str(ex.parsed.error_message) for ex in exchanges))
    for written in tmp_path.rglob("*"):
        if written.is_file():
            assert SECRET.lower().encode() not in written.read_bytes().lower(), written


# --- never raises ------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = [
    "id", "model", "choices", "message", "content", "finish_reason", "usage", "error", "type", "status", "output",
    "incomplete_details", "stop_reason", "candidates", "promptFeedback", "usageMetadata", "responseId", "text",
    "parts", "code", "message", "details", "refusal",
]  # fmt: skip
SHAPED = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(API_SHAPES),
    status=st.integers(0, 999),
    raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()) | SHAPED.map(lambda v: json.dumps(v).encode()),
    headers=st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3),
)
def test_parse_never_raises(shape: str, status: int, raw: bytes, headers: dict[str, str]) -> None:
    parsed = adapter_for(shape).parse_response(status, headers, raw)
    assert isinstance(parsed, ParsedResponse)
    assert parsed.error_code is None or parsed.error_code in ERROR_CODES
    if parsed.error_code is not None:
        assert parsed.error_message is not None and len(parsed.error_message) <= 500
    if 200 <= status < 300:
        try:
            value = json.loads(raw)
        except ValueError:
            assert parsed.error_code == "malformed_response"
        else:
            if not isinstance(value, (dict, list)):
                assert parsed.error_code == "malformed_response"
    else:
        assert parsed.error_code is not None
    json.dumps(parsed.to_json())
