"""`exchange_error_code`: a recorded exchange's provider error is classified from its wire bytes exactly as a
completion's response is (the adapter's `parse_response`), not by the proxy's status-only code (issue 17;
docs/models.md, `harness/meter/wire.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.meter.wire import WireLog, WireRecord, exchange_error_code, read_wire
from harness.providers.base import GenerationSettings
from harness.providers.registry import adapter_for
from tests.support.paths import FIXTURES
from tests.support.provider_server import fixture_bytes, load_fixture

ALL_FIXTURES = sorted((FIXTURES / "providers").glob("*/*.json"))


def _recorded(tmp_path: Path, shape: str, status: int | None, body: bytes, *, error_code: str | None = None,
              stream: bool | None = None, url: str | None = None) -> WireRecord:
    """One exchange written by the proxy's writer (`append_raw`) and read back verified."""
    request = adapter_for("openai_chat" if shape == "unknown" else shape).build_request("m-1", "Fix the bug.", GenerationSettings(), "http://127.0.0.1:9/v1")
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = WireLog(tmp_path / "wire.jsonl", "t")
    log.append_raw(shape, "m-1", url or request.url, request.body, status, body, 1.0, 2.0, error_code=error_code,
                   stream=stream)
    (rec,) = read_wire(tmp_path / "wire.jsonl", "t")
    return rec


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_recorded_response_is_classed_as_its_adapter_classes_it(tmp_path: Path, path: Path) -> None:
    fx = load_fixture(path)
    raw = fixture_bytes(fx["body"])
    rec = _recorded(tmp_path, path.parent.name, fx["status"], raw, stream=False)
    assert exchange_error_code(rec) == fx["expect"]["error_code"]
    assert exchange_error_code(rec) == adapter_for(path.parent.name).parse_response(fx["status"], {}, raw).error_code


@pytest.mark.parametrize(("shape", "fixture", "status_only", "classed"), [
    ("openai_chat", "error_400_context_length", "bad_request", "context_length"),
    ("openai_chat", "error_400_llamacpp_context", "bad_request", "context_length"),
    ("openai_chat", "error_429_quota", "rate_limited", "quota"),
    ("gemini_generate", "error_400_api_key", "bad_request", "auth"),
    ("anthropic_messages", "error_400_credit_balance", "bad_request", "billing"),
    ("openai_chat", "error_400_content_policy", "bad_request", "content_filter"),
])
def test_the_body_decides_where_the_status_alone_would_not(tmp_path: Path, shape: str, fixture: str,
                                                           status_only: str, classed: str) -> None:
    fx = load_fixture(FIXTURES / "providers" / shape / f"{fixture}.json")
    rec = _recorded(tmp_path, shape, fx["status"], fixture_bytes(fx["body"]), stream=False)
    assert (rec.error_code, exchange_error_code(rec)) == (status_only, classed)


def test_what_no_adapter_can_read_keeps_the_record_s_own_code(tmp_path: Path) -> None:
    stop = b'{"error": {"message": "stopped by the allowance", "code": "budget_stop"}}'
    assert exchange_error_code(_recorded(tmp_path / "a", "openai_chat", 402, stop, error_code="budget_stop")) \
        == "budget_stop"
    assert exchange_error_code(_recorded(tmp_path / "b", "openai_chat", None, b"", error_code="transport")) \
        == "transport"
    assert exchange_error_code(_recorded(tmp_path / "c", "openai_chat", None, b"", error_code="timeout")) \
        == "timeout"
    context = json.dumps({"error": {"code": "context_length_exceeded", "message": "too long"}}).encode()
    unknown = _recorded(tmp_path / "d", "unknown", 400, context, url="http://127.0.0.1:9/v1/elsewhere")
    assert (unknown.api_shape, exchange_error_code(unknown)) == ("unknown", "bad_request")
    streamed = _recorded(tmp_path / "e", "openai_chat", 200, b'data: {"choices": []}\n\ndata: [DONE]\n\n',
                         stream=True)
    assert exchange_error_code(streamed) == streamed.error_code
    # a streamed request the upstream refused with a JSON error is still read by the adapter
    refused = _recorded(tmp_path / "f", "openai_chat", 400, context, stream=True)
    assert (refused.error_code, exchange_error_code(refused)) == ("bad_request", "context_length")
