"""A plan in the documented format and attempt records built from real exchanges (the attempts and resume tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.evidence.jsonio import canonical_bytes, canonical_line, sha256_hex
from harness.meter.cost import Cost, meter
from harness.meter.pricing import Price
from harness.providers.base import Exchange, GenerationSettings, ParsedResponse
from harness.providers.registry import adapter_for
from harness.records.plan import Plan, PlanCell
from harness.records.usage import TokenUsage
from harness.run.attempts import attempt_from_exchange, error_attempt, read_plan

BASE_URL = "http://127.0.0.1:9/v1"
PRICE = Price(key="sim-flash", input_per_mtok=0.5, output_per_mtok=2.0)
UNKNOWN = Cost(None, status="usage_unknown", usage_unknown=1)


def plan_records(n: int = 3, *, study: str = "demo", stages: tuple[str, ...] = ("A",)) -> list[dict[str, Any]]:
    """A header and `n` requests per stage in the documented plan format."""
    adapter = adapter_for("openai_chat")
    requests: list[dict[str, Any]] = []
    for stage in stages:
        for i in range(n):
            prompt = f"Write `f{i}()` returning {i}. Réponds en Python.\n"
            built = adapter.build_request("sim-flash", prompt, GenerationSettings(max_output_tokens=256), BASE_URL)
            item = f"HumanEval/{i}"
            requests.append({
                "kind": "plan-request.v1",
                "run_id": "r-" + sha256_hex(canonical_bytes([study, stage, "cheap", item, "direct", 1]))[:20],
                "study": study, "stage": stage, "system": "cheap", "provider": "sim",
                "model": "sim-flash", "api_model": "sim-flash", "api_shape": "openai_chat",
                "setting": "default", "item": item, "arm": "direct", "repeat": 1,
                "lane": i % 2, "lane_position": i // 2, "arm_position": 0,
                "prompt": prompt, "prompt_sha256": sha256_hex(prompt.encode("utf-8")),
                "request_body": built.body.decode("utf-8"), "request_sha256": built.body_sha256,
            })
    header = {
        "kind": "plan-header.v1", "study": study, "scope": "pilot", "seed": 20261130,
        "design_sha256": sha256_hex(b"design.toml"), "requests": len(requests),
    }
    return [header, *requests]


def write_records(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(canonical_line(r) for r in records))
    return path


def write_plan(path: Path, n: int = 3, *, stages: tuple[str, ...] = ("A",)) -> Plan:
    """Write the plan fixture to `path` and read it back."""
    write_records(path, plan_records(n, stages=stages))
    return read_plan(path)


def chat_body(text: str | None = "def f():\n    return 0\n", *, usage: bool = True) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-123", "object": "chat.completion", "model": "sim-flash-2026-01-01",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    return canonical_bytes(body)


def exchange(
    request: PlanCell,
    *,
    status: int | None = 200,
    raw: bytes | None = None,
    parsed: ParsedResponse | None = None,
    body: bytes | None = None,
    started: float = 1_767_225_600.25,
    ended: float = 1_767_225_601.75,
) -> Exchange:
    """A real Exchange for `request`, parsed by the real adapter unless `parsed` is given."""
    sent = adapter_for(request.api_shape).build_request(
        request.api_model, request.prompt, GenerationSettings(max_output_tokens=256), BASE_URL
    )
    if body is not None:
        sent = type(sent)(**{**sent.__dict__, "body": body, "body_sha256": sha256_hex(body)})
    raw = chat_body() if raw is None else raw
    headers = {"content-type": "application/json", "x-request-id": "req-abc"}
    if parsed is None:
        assert status is not None
        parsed = adapter_for(request.api_shape).parse_response(status, headers, raw)
    return Exchange(sent, status, raw, sha256_hex(raw), headers, started, ended, parsed)


def delivered(request: PlanCell, attempt: int) -> dict[str, Any]:
    """A delivered record for `request`."""
    return attempt_from_exchange(request, attempt, exchange(request), meter(TokenUsage(40, 0, 0, 12, 0), PRICE))


def failed(request: PlanCell, attempt: int, code: str) -> dict[str, Any]:
    """An error record with `code` for `request` (no response came back)."""
    return error_attempt(
        request, attempt, error_code=code, error_message=f"planted {code}", started=10.0, ended=12.5, cost=UNKNOWN
    )
