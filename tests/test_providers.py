"""Provider adapters: exact request bytes, recorded responses, loopback HTTP, errors as data, no leaked secret."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from provider_server import ProviderServer, fixture_bytes, load_fixture

from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.meter.usage import API_SHAPES
from harness.providers.base import ERROR_CODES, Exchange, GenerationSettings, ParsedResponse
from harness.providers.credentials import REDACTED
from harness.providers.errors import classify_error
from harness.providers.registry import ADAPTERS, adapter_for
from harness.providers.transport import Transport

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "providers"
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
    code = "import sys, harness.cli, harness.providers.registry; sys.exit('httpx' in sys.modules)"
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
