"""Budgets inside an attempt: the allowance, a request's worst case, and the metering proxy's budget stop
over real loopback HTTP (a canned upstream that keeps every request it received)."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.errors import Refusal
from harness.evidence.chain_read import verify_log
from harness.meter.allowance import Allowance, AllowanceLedger, worst_case
from harness.meter.cost import meter
from harness.meter.pricing import load_pricing
from harness.meter.proxy import start_proxy
from harness.meter.wire import meter_wire, read_wire, wire_seed
from harness.records.usage import TokenUsage
from tests.support.provider_server import ProviderServer

PRICING = load_pricing(None)
FLASH = PRICING.get("sim-flash")
USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
_COST = meter(TokenUsage(input=120, output=30), FLASH).total
assert _COST is not None
COST: float = _COST
"""What every canned answer meters to."""


def chat(content: str = "ok") -> bytes:
    return json.dumps({
        "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": "sim-flash-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": USAGE,
    }).encode()


def request(n: int, **extra: Any) -> bytes:
    return json.dumps({"model": "sim-flash", "messages": [{"role": "user", "content": f"question {n}"}], **extra}).encode()


# --- the allowance and the worst case ------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"limit_usd": -0.01}, {"limit_usd": math.nan}, {"limit_usd": math.inf}, {"limit_usd": True},
    {"reserve_usd": 0.0}, {"reserve_usd": -1.0}, {"keys": {"sim-flash": 3}},
])
def test_a_bad_allowance_is_refused_by_name(fields: dict[str, Any]) -> None:
    with pytest.raises(Refusal) as caught:
        Allowance(**{"limit_usd": 1.0, "pricing": PRICING, "reserve_usd": 0.01, **fields})
    assert caught.value.code == "allowance_invalid"


def test_the_worst_case_is_the_output_cap_at_the_dearest_rate_else_the_reserve() -> None:
    allowance = Allowance(1.0, PRICING, 0.05)
    body = request(1, max_tokens=100)
    worst, basis = worst_case(allowance, "openai_chat", "sim-flash", body)
    assert FLASH is not None and basis == "max_tokens"
    # every body byte as a prompt token at the dearer of input and cache-write, the cap at the output rate
    prompt_rate = max(FLASH.input_per_mtok, FLASH.cache_write_per_mtok or 0.0)
    assert worst == pytest.approx(len(body) * prompt_rate / 1e6 + 100 * FLASH.output_per_mtok / 1e6, rel=1e-12)
    assert worst_case(allowance, "openai_chat", "sim-flash", request(1)) == (0.05, "reserve")
    assert worst_case(allowance, "openai_chat", "no-such-model", body) == (0.05, "reserve")
    assert worst_case(allowance, "unknown", "sim-flash", body) == (0.05, "reserve")
    gemini = json.dumps({"contents": [], "generationConfig": {"maxOutputTokens": 100}}).encode()
    assert worst_case(allowance, "gemini_generate", "sim-flash", gemini)[1] == "max_tokens"
    keyed = Allowance(1.0, PRICING, 0.05, {"gpt-x": "sim-k3"})
    assert worst_case(keyed, "openai_responses", "gpt-x", json.dumps({"max_output_tokens": 10}).encode())[1] == "max_tokens"


def test_the_ledger_admits_while_settled_costs_holds_and_the_worst_case_fit() -> None:
    ledger = AllowanceLedger(Allowance(0.25, PRICING, 0.1))
    first, left = ledger.admit(0.1)
    second, _ = ledger.admit(0.1)
    assert first is not None and second is not None and left == 0.25
    stopped, remaining = ledger.admit(0.1)  # two holds of 0.1: 0.3 would cross 0.25
    assert stopped is None and remaining == pytest.approx(0.05)
    ledger.settle(first, 0.01)
    ledger.settle(second, None)  # unknown: counts its worst case
    assert ledger.spent() == pytest.approx(0.11)
    third, _ = ledger.admit(0.1)
    assert third is not None and ledger.admit(0.1)[0] is None
    ledger.settle(third, 0.2)  # dearer than its hold: counted, and flagged
    assert ledger.summary()["over_worst"] == 1 and ledger.summary()["budget_stops"] == 2


# --- the proxy over loopback ---------------------------------------------------------------------


def test_a_request_that_would_cross_the_allowance_is_stopped_never_sent_and_logged_at_zero(tmp_path: Path) -> None:
    reserve = 1e-4
    limit = reserve + 2.5 * COST  # room for three requests at the reserve (each settles at COST)
    out = tmp_path / "wire.jsonl"
    with ProviderServer() as upstream:
        upstream.serve(200, {"Content-Type": "application/json"}, chat())
        with start_proxy(upstream.url + "/v1", out, name="a1", allowance=Allowance(limit, PRICING, reserve)) as proxy:
            replies = [httpx.post(proxy.url + "/chat/completions", content=request(n),
                                  headers={"Content-Type": "application/json"}) for n in range(5)]
            summary = proxy.summary()
        received = len(upstream.received)
    assert [r.status_code for r in replies] == [200, 200, 200, 402, 402]
    assert received == 3  # the stopped ones never left the proxy
    error = replies[3].json()["error"]
    assert error["code"] == "budget_stop" and error["type"] == "proxy_error"
    assert error["remaining_usd"] == pytest.approx(limit - 3 * COST)
    assert summary["budget_stops"] == 2 and summary["allowance"]["spent_usd"] == pytest.approx(3 * COST)
    assert verify_log(out, wire_seed("a1")).problem is None
    records = read_wire(out, "a1")
    assert [r.sent for r in records] == [True, True, True, False, False]
    stop = records[3]
    assert stop.status == 402 and stop.error_code == "budget_stop" and stop.usage is None and stop.latency_s == 0.0
    assert stop.request_body == request(3) and stop.via == "proxy"
    totals = meter_wire(records, PRICING)
    assert totals.budget_stops == 2 and totals.errors_unbilled == 0 and totals.metered == 3
    assert totals.cost.total is not None and totals.cost.total == pytest.approx(3 * COST) and totals.cost.total <= limit
    assert totals.to_json()["budget_stops"] == 2


def test_an_output_cap_bounds_the_worst_case_and_the_allowance_is_never_crossed(tmp_path: Path) -> None:
    capped = request(0, max_tokens=50)
    worst, _ = worst_case(Allowance(1.0, PRICING, 1.0), "openai_chat", "sim-flash", capped)
    out = tmp_path / "wire.jsonl"
    with ProviderServer() as upstream:
        upstream.serve(200, {"Content-Type": "application/json"}, chat())
        # A reserve far above the limit: only the cap lets a capped request through.
        with start_proxy(upstream.url + "/v1", out, name="cap", allowance=Allowance(worst, PRICING, 1.0)) as proxy:
            ok = httpx.post(proxy.url + "/chat/completions", content=capped)
            uncapped = httpx.post(proxy.url + "/chat/completions", content=request(1))
            again = httpx.post(proxy.url + "/chat/completions", content=capped)
        received = len(upstream.received)
    assert (ok.status_code, uncapped.status_code, again.status_code) == (200, 402, 402)
    assert received == 1
    totals = meter_wire(read_wire(out, "cap"), PRICING)
    assert totals.cost.total is not None and totals.cost.total <= worst and totals.budget_stops == 2


def test_requests_in_flight_hold_their_worst_case(tmp_path: Path) -> None:
    reserve = 1e-3
    limit = 2.5 * reserve
    out = tmp_path / "wire.jsonl"
    codes: list[int] = []
    with ProviderServer() as upstream:
        upstream.serve(200, {"Content-Type": "application/json"}, chat(), delay_s=0.5)
        with start_proxy(upstream.url + "/v1", out, name="par", allowance=Allowance(limit, PRICING, reserve)) as proxy:
            def one(n: int) -> None:
                codes.append(httpx.post(proxy.url + "/chat/completions", content=request(n), timeout=30).status_code)

            threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        received = len(upstream.received)
    records = read_wire(out, "par")
    sent = [r for r in records if r.sent]
    assert len(records) == 6 and len(sent) == received == codes.count(200) and codes.count(402) == 6 - received
    assert 2 <= received < 6  # two holds fit at once; never all six
    totals = meter_wire(records, PRICING)
    assert totals.cost.total is not None and totals.cost.total <= limit


def test_without_an_allowance_nothing_is_stopped(tmp_path: Path) -> None:
    with ProviderServer() as upstream:
        upstream.serve(200, {"Content-Type": "application/json"}, chat())
        with start_proxy(upstream.url + "/v1", tmp_path / "w.jsonl", name="free") as proxy:
            codes = [httpx.post(proxy.url + "/chat/completions", content=request(n)).status_code for n in range(3)]
            summary = proxy.summary()
    assert codes == [200, 200, 200] and summary["budget_stops"] == 0 and summary["allowance"] is None


def test_a_budget_stop_record_must_be_the_proxys_own_402(tmp_path: Path) -> None:
    from harness.meter.wire import WireLog

    log = WireLog(tmp_path / "w.jsonl", "x")
    for status, via in ((200, "proxy"), (402, "direct")):
        with pytest.raises(Refusal) as caught:
            log.append_raw("openai_chat", "sim-flash", "http://127.0.0.1/v1/chat/completions", request(0), status,
                           b"{}", 0.0, 0.0, via, error_code="budget_stop")
        assert caught.value.code == "wire_record_invalid"


def test_a_forged_budget_stop_line_is_refused_on_reading(tmp_path: Path) -> None:
    from harness.evidence.chain import ChainedLog
    from harness.meter.wire import WireLog

    good = WireLog(tmp_path / "good.jsonl", "x").append_raw(
        "openai_chat", "sim-flash", "http://127.0.0.1/v1/chat/completions", request(0), 200, chat(), 0.0, 0.0)
    forged = {k: v for k, v in good.items() if k not in ("prev", "seed")}
    forged["error_code"] = "budget_stop"  # claims it was never sent, yet carries a 200 with usage
    ChainedLog(str(tmp_path / "forged.jsonl"), wire_seed("x")).append(forged)
    with pytest.raises(Refusal) as caught:
        read_wire(tmp_path / "forged.jsonl", "x")
    assert caught.value.code == "wire_record_invalid" and "budget stop" in caught.value.message
