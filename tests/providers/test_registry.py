"""Adding an API shape is one `Provider` subclass plus its registration: the meter, the wire log, the proxy,
the transport and the catalog learn it from the registry alone, and name no shape themselves."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness
from harness.errors import Refusal
from harness.meter.exchange import (
    api_shape_for_path,
    describe_response,
    model_from_request,
    request_streams,
)
from harness.meter.pricing import Price, PricingTable
from harness.meter.proxy import start_proxy
from harness.meter.wire import WireLog, meter_wire, read_wire
from harness.providers import registry
from harness.providers.base import Described, GenerationSettings, ParsedResponse, ProviderRequest
from harness.providers.catalog import parse_catalog
from harness.providers.common import make_request, str_or_none, url_base
from harness.providers.provider import Provider
from harness.providers.transport import Transport
from harness.records.usage import TokenUsage
from tests.support.provider_server import ProviderServer

HARNESS = Path(harness.__file__).resolve().parent
ADAPTER_MODULES = {f"{shape}.py" for shape in registry.API_SHAPES}


# ---- a whole provider for a made-up shape: subclass Provider, override what differs, register it


class EchoLines(Provider):
    API_SHAPE = "echo_lines"
    PATH_SUFFIXES = ("/echo",)
    FREE_PATH_SUFFIXES = ("/echo/count",)
    USAGE_KEY = "tokens"

    def build_request(self, model: str, prompt: str, settings: GenerationSettings, base_url: str) -> ProviderRequest:
        del settings
        body = {"model": model, "prompt": prompt}
        return make_request(self.API_SHAPE, model, f"{url_base(base_url)}/echo", body, (), "x-echo-key")

    def parse_body(self, body: Mapping[str, Any], request_id: str | None, model: str | None) -> ParsedResponse:
        return ParsedResponse(str_or_none(body.get("text")), str_or_none(body.get("done")), model, request_id, self.parse_usage(body))

    def parse_usage(self, body: Any) -> TokenUsage | None:
        tokens = body.get("tokens") if isinstance(body, Mapping) else None
        if not isinstance(tokens, Mapping) or not all(isinstance(tokens.get(k), int) for k in ("in", "out")):
            return None
        return TokenUsage(input=tokens["in"], output=tokens["out"])

    def describe(self, doc: Mapping[str, Any]) -> Described:
        return Described(self.parse_usage(doc), str_or_none(doc.get("done")), str_or_none(doc.get("model")), str_or_none(doc.get("id")), True)


ECHO = EchoLines()

REPLY = {"id": "e-1", "model": "echo-1", "text": "hello", "done": "stop", "tokens": {"in": 1000, "out": 250}}
PRICING = PricingTable({"echo-1": Price("echo-1", 1.0, 2.0)}, "0" * 64)


@pytest.fixture
def echo() -> Iterator[None]:
    registry.register(ECHO)
    try:
        yield
    finally:
        del registry.ADAPTERS["echo_lines"]


def test_a_registered_shape_is_known_to_the_meter(echo: None) -> None:
    assert registry.adapter_for("echo_lines") is ECHO
    assert "echo_lines" in registry.api_shapes() and "echo_lines" not in registry.API_SHAPES
    assert api_shape_for_path("POST", "/v1/echo/") == "echo_lines"
    assert api_shape_for_path("GET", "/v1/echo") == "unknown"
    assert model_from_request("/v1/echo", b'{"model": "echo-1"}') == "echo-1"
    assert request_streams("echo_lines", "http://x/echo", b'{"stream": true}')
    d = describe_response("echo_lines", json.dumps(REPLY).encode())
    assert (d.usage, d.finish_reason, d.request_id) == (TokenUsage(input=1000, output=250), "stop", "e-1")
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in ({"id": "e-1"}, REPLY))
    assert describe_response("echo_lines", stream, stream=True).usage == TokenUsage(input=1000, output=250)
    assert registry.usage_from_response("echo_lines", REPLY) == TokenUsage(input=1000, output=250)


def test_a_registered_shape_is_unknown_once_removed() -> None:
    assert registry.find_adapter("echo_lines") is None
    assert describe_response("echo_lines", json.dumps(REPLY).encode()).usage is None
    with pytest.raises(Refusal) as caught:
        registry.adapter_for("echo_lines")
    assert caught.value.code == "unknown_api_shape"
    with pytest.raises(ValueError):
        registry.register(registry.ADAPTERS["openai_chat"])


def test_a_registered_shape_goes_through_transport_and_wire_log(echo: None, tmp_path: Path) -> None:
    log = WireLog(tmp_path / "w.jsonl", "t")
    with ProviderServer() as server, Transport(timeout_s=10) as transport:
        server.serve(200, {"content-type": "application/json"}, json.dumps(REPLY).encode())
        request = registry.adapter_for("echo_lines").build_request("echo-1", "hi", GenerationSettings(), server.url)
        exchange = transport.send(request, "k-123456789")
        assert server.received[0].header("x-echo-key") == "k-123456789"
    assert exchange.parsed.ok and exchange.parsed.text == "hello"
    log.append_exchange(exchange)
    log.append_raw("unknown", None, server.url + "/echo/count", b"{}", 200, b"{}", 1.0, 2.0)  # free, says the adapter
    rec, free = read_wire(tmp_path / "w.jsonl", "t")
    assert rec.api_shape == "echo_lines" and rec.usage == TokenUsage(input=1000, output=250)
    totals = meter_wire([rec, free], PRICING)
    assert totals.cost.total == pytest.approx(0.0015) and totals.not_metered == 1


def test_a_registered_shape_is_recorded_by_the_proxy(echo: None, tmp_path: Path) -> None:
    out = tmp_path / "proxy.jsonl"
    with ProviderServer() as server:
        server.serve(200, {"content-type": "application/json"}, json.dumps(REPLY).encode())
        with start_proxy(server.url + "/v1", out, name="p") as proxy:
            reply = httpx.post(proxy.url + "/echo", json={"model": "echo-1", "prompt": "hi"}, timeout=10)
            assert reply.json() == REPLY
    (rec,) = read_wire(out, "p")
    assert (rec.api_shape, rec.model, rec.usage) == ("echo_lines", "echo-1", TokenUsage(input=1000, output=250))


def test_a_registered_shape_is_accepted_by_the_catalog(echo: None) -> None:
    toml = (
        b'[[model]]\nid = "echo-1"\nprovider = "echo"\napi_shape = "echo_lines"\nbase_url = "http://127.0.0.1:9/v1"\n'
        b'credential_env = ""\npricing_key = "echo-1"\nlane = "flash"\n'
    )
    assert parse_catalog(toml, "c.toml").models[0].api_shape == "echo_lines"


def test_the_catalog_refuses_an_unregistered_shape_naming_the_registered_ones() -> None:
    toml = (
        b'[[model]]\nid = "echo-1"\nprovider = "echo"\napi_shape = "echo_lines"\nbase_url = "http://127.0.0.1:9/v1"\n'
        b'credential_env = ""\npricing_key = "echo-1"\nlane = "flash"\n'
    )
    with pytest.raises(Refusal) as caught:
        parse_catalog(toml, "c.toml")
    assert caught.value.code == "catalog_invalid"
    assert ", ".join(registry.API_SHAPES) in caught.value.message


# ---- nothing outside an adapter module names a shape


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _shape_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            hits += [f"{path.relative_to(HARNESS)}:{node.lineno}: {shape}" for shape in registry.API_SHAPES if shape in node.value]
    return hits


def _scanned() -> list[Path]:
    meter = sorted((HARNESS / "meter").glob("*.py"))
    providers = [p for p in sorted((HARNESS / "providers").glob("*.py")) if p.name not in ADAPTER_MODULES]
    return meter + providers


def test_the_scan_sees_the_modules_it_should() -> None:
    names = {p.relative_to(HARNESS).as_posix() for p in _scanned()}
    assert {"meter/exchange.py", "meter/wire.py", "meter/proxy.py", "providers/catalog.py", "providers/errors.py"} <= names
    assert not names & {f"providers/{m}" for m in ADAPTER_MODULES}
    assert _shape_literals(HARNESS / "providers" / "openai_chat.py")  # the scan does find a shape in its own module


def test_meter_and_catalog_name_no_api_shape() -> None:
    hits = [hit for path in _scanned() for hit in _shape_literals(path)]
    assert hits == [], "only an adapter module may name its API shape; ask harness.providers.registry:\n" + "\n".join(hits)


def test_providers_import_no_meter() -> None:
    bad = []
    for path in sorted((HARNESS / "providers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n == "harness.meter" or n.startswith("harness.meter.")]
    assert bad == []
