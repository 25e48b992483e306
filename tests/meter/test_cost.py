"""Metering: the strict pricing loader, cost arithmetic, wire logs and metering from them."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import seed_hash
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.meter.cost import Cost, meter, total_cost
from harness.meter.exchange import describe_response, redact_url
from harness.meter.pricing import (
    BUNDLED_PRICING,
    EXAMPLE_PRICING,
    Price,
    PricingTable,
    Tier,
    load_pricing,
    parse_pricing,
)
from harness.meter.wire import WireLog, meter_wire, read_wire, wire_seed
from harness.providers.base import Exchange, ParsedResponse, ProviderRequest
from harness.providers.registry import usage_from_response
from harness.records.usage import CATEGORIES, TokenUsage
from tests.support.cli import run_proctor

GOOD = b"""\
models:
  m:
    input_per_mtok: 1.0
    output_per_mtok: 4
    reasoning: billed_as_output
"""


def refusal(data: bytes | str) -> Refusal:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with pytest.raises(Refusal) as info:
        parse_pricing(raw, "p.yaml")
    assert info.value.path == "p.yaml"
    return info.value


def model_yaml(**fields: str) -> str:
    base = {"input_per_mtok": "1.0", "output_per_mtok": "2.0", "reasoning": "billed_as_output"}
    base.update(fields)
    body = "".join(f"    {k}: {v}\n" for k, v in base.items() if v != "<omit>")
    return f"models:\n  m:\n{body}"


# --- the pricing loader ------------------------------------------------------------------


def test_bundled_pricing_loads_and_is_notional() -> None:
    table = load_pricing()
    assert set(table.models) == {"sim-flash", "sim-glm", "sim-k3"}
    assert table.sha256 == hashlib.sha256(BUNDLED_PRICING.read_bytes()).hexdigest()
    assert table.notional and all(p.notional for p in table.models.values())
    flash, k3 = table.models["sim-flash"], table.models["sim-k3"]
    assert (flash.input_per_mtok, flash.output_per_mtok) == (0.10, 0.40)
    assert (k3.input_per_mtok, k3.output_per_mtok) == (3.00, 15.00)
    assert "notional" in BUNDLED_PRICING.read_text().lower()


def test_example_pricing_is_refused_until_filled() -> None:
    with pytest.raises(Refusal) as info:
        load_pricing(EXAMPLE_PRICING)
    assert info.value.code == "pricing_invalid"
    assert info.value.details["cause"] == "invalid_cost"
    text = EXAMPLE_PRICING.read_text()
    assert "pricing_invalid" in text  # the file says why it does not load


def test_example_pricing_has_no_invented_prices() -> None:
    import yaml

    doc = yaml.safe_load(EXAMPLE_PRICING.read_text())

    def prices(node: Any) -> list[Any]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if str(k).endswith("_per_mtok")] + [
                x for v in node.values() for x in prices(v)
            ]
        if isinstance(node, list):
            return [x for v in node for x in prices(v)]
        return []

    found = prices(doc)
    assert found and all(v is None for v in found)


def test_minimal_table() -> None:
    table = parse_pricing(GOOD, "p.yaml")
    assert table.get("m") == Price("m", 1.0, 4.0)
    assert table.get("other") is None and table.get(None) is None
    assert table.sha256 == sha256_hex(GOOD) and table.path == "p.yaml"
    assert not table.notional


def test_a_table_is_parsed_once_per_bytes_and_path_and_changed_bytes_are_parsed_again(tmp_path: Path) -> None:
    path = tmp_path / "pricing.yaml"
    path.write_bytes(GOOD)
    first = load_pricing(path)
    assert load_pricing(path) is first  # the same bytes at the same path: the frozen table already validated
    elsewhere = tmp_path / "other.yaml"
    elsewhere.write_bytes(GOOD)
    assert load_pricing(elsewhere) is not first and load_pricing(elsewhere).path == str(elsewhere)
    path.write_bytes(GOOD.replace(b"input_per_mtok: 1.0", b"input_per_mtok: 2.0"))
    changed = load_pricing(path)
    assert changed.get("m") == Price("m", 2.0, 4.0) and changed.sha256 == sha256_hex(path.read_bytes())
    path.write_bytes(GOOD.replace(b"input_per_mtok: 1.0", b"input_per_mtok: -1"))
    with pytest.raises(Refusal):  # bad bytes are refused each time, never answered from what was read before
        load_pricing(path)
    path.write_bytes(GOOD)
    assert load_pricing(path) is first


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("models:\n  m:\n    input_per_mtok: 1\n    input_per_mtok: 2\n    output_per_mtok: 1\n    reasoning: 1\n", "input_per_mtok", 4),
        (GOOD.decode() + "  m:\n    input_per_mtok: 1\n", "m", 6),
        (GOOD.decode() + "models: {}\n", "models", 6),
    ],
)
def test_duplicate_keys_are_refused_naming_key_and_line(text: str, key: str, line: int) -> None:
    r = refusal(text)
    assert r.code == "pricing_duplicate_key"
    assert r.details["key"] == key and r.details["line"] == line
    assert repr(key) in r.message and f"line {line}" in r.message


@pytest.mark.parametrize(
    "value", [".nan", ".NaN", ".inf", "-.inf", "yes", "true", "no", "'1.0'", "abc", "null", "~", "", "-1", "-0.5", "1e3", "[1]", "{a: 1}"]
)
def test_bad_prices_are_refused(value: str) -> None:
    r = refusal(model_yaml(input_per_mtok=value))
    assert r.code == "pricing_invalid", r.to_json()
    assert r.details["field"] == "models.m.input_per_mtok"


@pytest.mark.parametrize("field", ["output_per_mtok", "cached_input_per_mtok", "cache_write_per_mtok", "reasoning"])
def test_every_price_field_goes_through_parse_cost(field: str) -> None:
    for bad in (".nan", ".inf", "yes", "null", "-1"):
        r = refusal(model_yaml(**{field: bad}))
        assert r.code == "pricing_invalid" and r.details["field"] == f"models.m.{field}"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (model_yaml(colour="blue"), "models.m.colour"),
        (GOOD.decode() + "currency: USD\n", "the pricing file.currency"),
        (model_yaml(tiers="[{above_prompt_tokens: 10, input_per_mtok: 1, output_per_mtok: 1, reasoning: 1}]"), "models.m.tiers[0].reasoning"),
        (model_yaml(input_per_mtok="<omit>"), "models.m.input_per_mtok"),
        (model_yaml(reasoning="<omit>"), "models.m.reasoning"),
        (model_yaml(reasoning="billed_as_input"), "models.m.reasoning"),
        (model_yaml(notional="1"), "models.m.notional"),
        (model_yaml(source="3"), "models.m.source"),
        (model_yaml(tiers="{}"), "models.m.tiers"),
        ("models: {}\n", "models"),
        ("models: []\n", "models"),
    ],
)
def test_invalid_tables_are_refused(text: str, field: str) -> None:
    r = refusal(text)
    assert r.code == "pricing_invalid", r.to_json()
    assert r.details.get("field") == field


@pytest.mark.parametrize("text", ["", "[]\n", "42\n", "null\n"])
def test_a_table_must_be_a_mapping(text: str) -> None:
    assert refusal(text).code == "pricing_invalid"


@pytest.mark.parametrize(
    "tiers",
    [
        "[{above_prompt_tokens: 200, input_per_mtok: 2, output_per_mtok: 2}, {above_prompt_tokens: 100, input_per_mtok: 3, output_per_mtok: 3}]",
        "[{above_prompt_tokens: 100, input_per_mtok: 2, output_per_mtok: 2}, {above_prompt_tokens: 100, input_per_mtok: 3, output_per_mtok: 3}]",
        "[{above_prompt_tokens: -1, input_per_mtok: 2, output_per_mtok: 2}]",
        "[{above_prompt_tokens: 1.5, input_per_mtok: 2, output_per_mtok: 2}]",
        "[{above_prompt_tokens: yes, input_per_mtok: 2, output_per_mtok: 2}]",
        "[{above_prompt_tokens: 100, input_per_mtok: .nan, output_per_mtok: 2}]",
        "[{above_prompt_tokens: 100, input_per_mtok: 2}]",
    ],
)
def test_bad_tiers_are_refused(tiers: str) -> None:
    assert refusal(model_yaml(tiers=tiers)).code == "pricing_invalid"


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {input_per_mtok: 1, output_per_mtok: 2, reasoning: billed_as_output}\nmodels:\n  m: *b\n",
        "models:\n  m: &x\n    input_per_mtok: 1\n    output_per_mtok: 2\n    reasoning: billed_as_output\n",
        "models:\n  m:\n    <<: {input_per_mtok: 1}\n    output_per_mtok: 2\n    reasoning: billed_as_output\n",
        "models:\n  ? [a, b]\n  : {input_per_mtok: 1, output_per_mtok: 2, reasoning: billed_as_output}\n",
        "models:\n  m:\n    input_per_mtok: !!float 1\n    output_per_mtok: 2\n    reasoning: billed_as_output\n",
        "models: !!python/object:os.system {}\n",
        "models:\n  m:\n    input_per_mtok: ! 1\n    output_per_mtok: 2\n    reasoning: billed_as_output\n",
    ],
)
def test_yaml_features_are_refused(text: str) -> None:
    r = refusal(text)
    assert r.code == "pricing_yaml_forbidden", r.to_json()
    assert isinstance(r.details.get("line"), int)


def test_non_string_keys_are_refused() -> None:
    assert refusal("models:\n  1: {input_per_mtok: 1, output_per_mtok: 2, reasoning: billed_as_output}\n").code == "pricing_invalid"
    assert refusal("models:\n  yes: {input_per_mtok: 1, output_per_mtok: 2, reasoning: billed_as_output}\n").code == "pricing_invalid"


@pytest.mark.parametrize("text", ["models: [\n", "models:\n  m: {a: 1\n", "a: 1\n---\nb: 2\n", "models:\n\tm: 1\n"])
def test_bad_yaml_is_refused(text: str) -> None:
    assert refusal(text).code == "pricing_yaml_invalid"


@pytest.mark.parametrize("opener", ["[", "{a: ", "- "])
def test_a_price_list_nested_50000_deep_is_a_named_refusal_not_a_recursion_error(opener: str) -> None:
    """Issue 14, class 8: it exited 4 (RecursionError); now pricing_yaml_invalid naming the file."""
    closer = {"[": "]", "{a: ": "}", "- ": ""}[opener]
    if opener == "- ":
        text = "models:\n" + "- " * 50_000 + "1\n"  # block sequences, nested on one line
    else:
        text = "models: " + opener * 50_000 + "1" + closer * 50_000 + "\n"
    r = refusal(text)
    assert r.code == "pricing_yaml_invalid" and "deep" in r.message, r.to_json()


def test_non_utf8_is_refused() -> None:
    assert refusal(GOOD + b"# caf\xe9\n").code == "invalid_utf8"


def test_load_pricing_refuses_missing_and_special_files(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as info:
        load_pricing(tmp_path / "nope.yaml")
    assert info.value.code == "file_missing"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Refusal) as info:
        load_pricing(fifo)
    assert info.value.code == "not_a_regular_file"
    with pytest.raises(Refusal) as info:
        load_pricing(tmp_path)
    assert info.value.code == "not_a_regular_file"


def test_load_pricing_hashes_the_bytes_it_read(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(GOOD)
    assert load_pricing(path).sha256 == sha256_hex(GOOD)


def test_tiers_and_reasoning_price_parse() -> None:
    text = model_yaml(
        reasoning="5",
        cached_input_per_mtok="0.1",
        tiers="[{above_prompt_tokens: 100, input_per_mtok: 2, output_per_mtok: 3}, {above_prompt_tokens: 1000, input_per_mtok: 4, output_per_mtok: 6, cached_input_per_mtok: 0.5}]",
    )
    price = parse_pricing(text.encode()).models["m"]
    assert price.reasoning_per_mtok == 5.0 and price.cached_input_per_mtok == 0.1
    assert price.tiers == (Tier(100, 2.0, 3.0), Tier(1000, 4.0, 6.0, 0.5))


# --- cost ---------------------------------------------------------------------------------


FULL = Price("p", input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5, cache_write_per_mtok=2.5)


def test_every_category_is_priced() -> None:
    usage = TokenUsage(input=1_000_000, cached_input=2_000_000, cache_write=400_000, output=500_000, reasoning=250_000)
    cost = meter(usage, FULL)
    assert cost.status == "metered" and cost.tier is None
    assert dict(cost.parts) == {
        "input": 2.0,
        "cached_input": 1.0,
        "cache_write": 1.0,
        "output": 4.0,
        "reasoning": 2.0,  # billed as output
    }
    assert cost.total == 10.0 == cost.known_total


def test_reasoning_at_its_own_price() -> None:
    price = Price("p", 1.0, 8.0, reasoning_per_mtok=20.0)
    cost = meter(TokenUsage(output=1_000_000, reasoning=1_000_000), price)
    assert cost.parts["output"] == 8.0 and cost.parts["reasoning"] == 20.0 and cost.total == 28.0


def test_cached_tokens_are_cheaper_than_fresh() -> None:
    fresh = meter(TokenUsage(input=10_000), FULL)
    cached = meter(TokenUsage(cached_input=10_000), FULL)
    assert fresh.total == 0.02 and cached.total == 0.005


TIERED = Price(
    "t", 1.0, 2.0, cached_input_per_mtok=0.1, tiers=(Tier(1000, 10.0, 20.0, 1.0), Tier(5000, 100.0, 200.0))
)


@pytest.mark.parametrize(
    ("usage", "tier", "total"),
    [
        (TokenUsage(input=1000, output=1000), None, 0.003),
        (TokenUsage(input=1001, output=1000), 1000, 0.03001),
        (TokenUsage(input=500, cached_input=501, output=1_000_000), 1000, 0.005 + 0.000501 + 20.0),
        (TokenUsage(input=5000, output=0), 1000, 0.05),
        (TokenUsage(input=5001), 5000, 0.5001),
    ],
)
def test_tiers_price_the_whole_request_by_prompt_size(usage: TokenUsage, tier: int | None, total: float) -> None:
    cost = meter(usage, TIERED)
    assert cost.tier == tier
    assert cost.total == pytest.approx(total, rel=1e-12)


def test_reasoning_billed_as_output_follows_the_tier() -> None:
    cost = meter(TokenUsage(input=2000, reasoning=1_000_000), TIERED)
    assert cost.tier == 1000 and cost.parts["reasoning"] == 20.0


def test_a_tier_without_a_cached_price_is_unknown_for_cached_tokens() -> None:
    cost = meter(TokenUsage(input=6000, cached_input=1), TIERED)
    assert cost.total is None and cost.status == "price_unknown" and cost.tier == 5000
    assert "cached_input" in (cost.reason or "")


def test_unknown_usage_is_unknown_never_zero() -> None:
    cost = meter(None, FULL)
    assert cost.total is None and cost.status == "usage_unknown" and cost.usage_unknown == 1
    assert cost.to_json()["unknown"] is True


def test_unknown_price_is_unknown_never_zero() -> None:
    cost = meter(TokenUsage(input=5), None)
    assert cost.total is None and cost.status == "price_unknown" and cost.price_unknown == 1
    missing = meter(TokenUsage(cache_write=1), Price("p", 1.0, 1.0))
    assert missing.total is None and missing.status == "price_unknown"
    fine = meter(TokenUsage(input=1, cache_write=0), Price("p", 1.0, 1.0))
    assert fine.status == "metered" and fine.parts["cache_write"] == 0.0


def test_zero_usage_is_zero_cost() -> None:
    cost = meter(TokenUsage(), FULL)
    assert cost.total == 0.0 and cost.status == "metered"


def test_sums_do_not_lose_a_cent() -> None:
    one_cent = meter(TokenUsage(input=10_000), Price("c", 1.0, 1.0))
    assert one_cent.total == 0.01
    costs = [one_cent] * 100_000
    naive = 0.0
    for c in costs:
        assert c.total is not None
        naive += c.total
    assert naive != 1000.0  # what a running float sum would report
    total = total_cost(costs)
    assert total.total == 1000.0 and total.requests == 100_000 and total.parts["input"] == 1000.0


def test_a_sum_with_unknowns_is_unknown_but_reports_the_known_part() -> None:
    known = meter(TokenUsage(input=1_000_000), Price("c", 1.0, 1.0))
    total = total_cost([known, meter(None, FULL), known, meter(TokenUsage(input=1), None)])
    assert total.total is None and total.status == "usage_unknown"
    assert total.known_total == 2.0 and total.requests == 4
    assert (total.usage_unknown, total.price_unknown, total.unknown) == (1, 1, 2)
    only_price = total_cost([known, meter(TokenUsage(input=1), None)])
    assert only_price.status == "price_unknown" and only_price.known_total == 1.0
    assert total_cost([]).total == 0.0
    nested = total_cost([total, known])
    assert nested.requests == 5 and nested.unknown == 2 and nested.known_total == 3.0


def test_an_overflowing_cost_is_refused() -> None:
    with pytest.raises(Refusal) as info:
        meter(TokenUsage(input=10**400), FULL)
    assert info.value.code == "cost_overflow"
    with pytest.raises(Refusal):
        meter(TokenUsage(input=10**300, output=10**300), Price("x", 1e300, 1e300))


_tokens = st.integers(min_value=0, max_value=10**9)
# Prices from free to $1000/Mtok; below a millionth of a dollar per Mtok a part would underflow
# to subnormal floats, which no price list has.
_rate = st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1000, allow_nan=False, allow_infinity=False))


@settings(max_examples=2000, deadline=None)
@given(
    usage=st.builds(TokenUsage, _tokens, _tokens, _tokens, _tokens, _tokens),
    rates=st.tuples(_rate, _rate, _rate, _rate),
    reasoning=st.one_of(st.none(), _rate),
    threshold=st.one_of(st.none(), st.integers(min_value=0, max_value=3 * 10**9)),
)
def test_property_total_is_the_exact_sum_of_the_parts(
    usage: TokenUsage, rates: tuple[float, float, float, float], reasoning: float | None, threshold: int | None
) -> None:
    tiers = () if threshold is None else (Tier(threshold, rates[0] * 2, rates[1] * 2, rates[2] * 2, rates[3] * 2),)
    price = Price("p", rates[0], rates[1], rates[2], rates[3], reasoning, tiers)
    cost = meter(usage, price)
    assert cost.total is not None and cost.status == "metered"
    assert cost.total == math.fsum(cost.parts.values())
    in_tier = threshold is not None and usage.prompt_tokens > threshold
    k = 2 if in_tier else 1
    rate = {
        "input": rates[0] * k,
        "cached_input": rates[2] * k,
        "cache_write": rates[3] * k,
        "output": rates[1] * k,
        "reasoning": rates[1] * k if reasoning is None else reasoning,
    }
    exact = sum(Fraction(getattr(usage, c)) * Fraction(rate[c]) / 1_000_000 for c in CATEGORIES)
    assert math.isclose(cost.total, float(exact), rel_tol=1e-12, abs_tol=0.0) or exact == 0


# --- describing responses ---------------------------------------------------------------------


OPENAI_BODY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-x-2025",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "total_tokens": 150,
        "prompt_tokens_details": {"cached_tokens": 20},
        "completion_tokens_details": {"reasoning_tokens": 10},
    },
}


def sse(*events: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def test_describe_a_whole_response() -> None:
    d = describe_response("openai_chat", json.dumps(OPENAI_BODY).encode())
    assert d.usage == TokenUsage(input=100, cached_input=20, output=20, reasoning=10)
    assert (d.finish_reason, d.model_snapshot, d.request_id) == ("stop", "gpt-x-2025", "chatcmpl-1")
    assert describe_response("openai_chat", b"not json").usage is None
    assert describe_response("unknown", json.dumps(OPENAI_BODY).encode()).usage is None


def test_describe_an_openai_stream_with_a_usage_chunk() -> None:
    chunk = {"id": "c1", "model": "gpt-x", "choices": [{"delta": {"content": "h"}, "finish_reason": None}], "usage": None}
    last = {"id": "c1", "model": "gpt-x", "choices": [{"delta": {}, "finish_reason": "stop"}], "usage": None}
    usage = {"id": "c1", "model": "gpt-x", "choices": [], "usage": OPENAI_BODY["usage"]}
    d = describe_response("openai_chat", sse(chunk, last, usage), stream=True)
    assert d.usage == TokenUsage(input=100, cached_input=20, output=20, reasoning=10)
    assert d.finish_reason == "stop"
    assert describe_response("openai_chat", sse(chunk, last), stream=True).usage is None
    assert describe_response("openai_chat", sse(chunk, last, usage) + b"data: {bad\n\n", stream=True).usage is None


def test_describe_an_anthropic_stream() -> None:
    start = {"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 50, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 7, "output_tokens": 1}}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 42}}
    raw = b"event: message_start\n" + sse(start, done=False) + b"event: message_delta\n" + sse(delta, {"type": "message_stop"}, done=False)
    d = describe_response("anthropic_messages", raw, stream=True)
    assert d.usage == TokenUsage(input=50, cached_input=5, cache_write=7, output=42)
    assert (d.finish_reason, d.request_id, d.model_snapshot) == ("end_turn", "msg_1", "claude-x")
    assert describe_response("anthropic_messages", sse(start, done=False), stream=True).usage is None


def test_describe_responses_and_gemini_streams() -> None:
    created = {"type": "response.created", "response": {"id": "r1", "model": "o-x", "status": "in_progress", "usage": None}}
    done = {"type": "response.completed", "response": {"id": "r1", "model": "o-x", "status": "completed", "usage": {"input_tokens": 9, "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 1}}}}
    d = describe_response("openai_responses", sse(created, {"type": "response.output_text.delta", "delta": "x"}, done, done=False), stream=True)
    assert d.usage == TokenUsage(input=9, output=3, reasoning=1) and d.finish_reason == "completed"
    g1 = {"candidates": [{"content": {}}], "usageMetadata": {"promptTokenCount": 8}, "modelVersion": "gem-1"}
    g2 = {"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 6, "thoughtsTokenCount": 2}}
    d = describe_response("gemini_generate", sse(g1, g2, done=False), stream=True)
    assert d.usage == TokenUsage(input=8, output=6, reasoning=2) and d.finish_reason == "STOP"
    as_array = json.dumps([g1, g2]).encode()
    assert describe_response("gemini_generate", as_array, stream=True).usage == d.usage


def test_gzip_bodies_are_described_after_decoding() -> None:
    import gzip

    raw = gzip.compress(json.dumps(OPENAI_BODY).encode())
    assert describe_response("openai_chat", raw, content_encoding="gzip").usage is not None
    assert describe_response("openai_chat", raw, content_encoding="br").usage is None


def test_redact_url() -> None:
    assert redact_url("https://u:p@g.example/v1/m:generateContent?key=SECRET&alt=sse") == (
        "https://g.example/v1/m:generateContent?key=REDACTED&alt=sse"
    )
    assert redact_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


# --- the wire log -----------------------------------------------------------------------------


def append(log: WireLog, body: Any, *, shape: str = "openai_chat", status: int | None = 200, model: str = "m", **kw: Any) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = kw.pop("request", json.dumps({"model": model, "messages": []}).encode())
    url = kw.pop("url", "http://up/v1/chat/completions")
    return log.append_raw(shape, model, url, request, status, raw, 10.0, 11.5, **kw)


def test_wire_round_trip_with_binary_bodies(tmp_path: Path) -> None:
    path = tmp_path / "wire.jsonl"
    log = WireLog(path, "t")
    request, response = b"\xff\x00binary\x80", b"\x89PNG\r\n\x1a\n\x00\xfe"
    append(log, response, request=request, shape="unknown", model=None, status=200)
    append(log, OPENAI_BODY, model="gpt-x")
    records = read_wire(path, "t")
    assert [r.line for r in records] == [1, 2]
    first, second = records
    assert first.request_body == request and first.response_raw == response
    assert first.usage is None and first.api_shape == "unknown"
    assert (first.started, first.ended, first.latency_s) == (10.0, 11.5, 1.5)
    lines = path.read_bytes().splitlines()
    doc = json.loads(lines[0])
    assert doc["request_body"] == {"base64": base64.b64encode(request).decode()}
    assert doc["seed"] == wire_seed("t") and doc["prev"] == seed_hash("proctor-wire:t")
    assert doc["usage_unknown"] is True and doc["via"] == "proxy"
    assert second.usage == TokenUsage(input=100, cached_input=20, output=20, reasoning=10)
    assert (second.request_id, second.model_snapshot, second.finish_reason) == ("chatcmpl-1", "gpt-x-2025", "stop")
    assert json.loads(lines[1])["response_raw"] == json.dumps(OPENAI_BODY)


def test_a_tampered_wire_line_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "wire.jsonl"
    log = WireLog(path, "t")
    append(log, OPENAI_BODY)
    append(log, OPENAI_BODY)
    lines = path.read_bytes().split(b"\n")
    original = lines[0]
    lines[0] = lines[0].replace(b'\\"completion_tokens\\": 30', b'\\"completion_tokens\\": 3')
    assert lines[0] != original
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(Refusal) as info:
        read_wire(path)
    assert info.value.code == "log_broken" and info.value.details["line"] in (1, 2)


def rechain(path: Path, change: Any) -> None:
    """Rewrite a log's records through `change` and re-chain every line (a forger with write access)."""
    docs = [json.loads(line) for line in path.read_bytes().splitlines()]
    seed = docs[0]["seed"]
    out, prev = [], seed_hash(seed)
    for i, doc in enumerate(docs):
        change(doc)
        doc["prev"] = prev
        if i == 0:
            doc["seed"] = seed
        raw = canonical_bytes(doc)
        out.append(raw)
        prev = sha256_hex(raw)
    path.write_bytes(b"\n".join(out) + b"\n")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d.update(usage={**d["usage"], "output": 1}), "usage does not match"),
        (lambda d: d.update(response_raw=d["response_raw"].replace("120", "12")), "response_sha256"),
        (lambda d: d.update(request_sha256="0" * 64), "request_sha256"),
        (lambda d: d.update(usage=None), "usage_unknown disagrees"),
        (lambda d: d.update(extra=1), "unknown keys"),
        (lambda d: d.pop("via"), "missing"),
        (lambda d: d.update(status="200"), "status"),
        (lambda d: d.update(error_code="oops"), "error_code"),
        (lambda d: d.update(response_raw={"base64": "!!"}), "base64"),
    ],
)
def test_a_consistently_forged_record_is_refused(tmp_path: Path, change: Any, why: str) -> None:
    path = tmp_path / "wire.jsonl"
    append(WireLog(path, "t"), OPENAI_BODY)
    rechain(path, change)
    with pytest.raises(Refusal) as info:
        read_wire(path)
    assert info.value.code == "wire_record_invalid" and why in info.value.message


def test_read_wire_checks_the_seed(tmp_path: Path) -> None:
    path = tmp_path / "wire.jsonl"
    append(WireLog(path, "a"), OPENAI_BODY)
    assert len(read_wire(path)) == 1
    with pytest.raises(Refusal) as info:
        read_wire(path, "b")
    assert info.value.code == "log_broken"
    other = tmp_path / "other.jsonl"
    ChainedLog(other, "study:x").append({"a": 1})
    with pytest.raises(Refusal) as info:
        read_wire(other)
    assert info.value.code == "wire_seed_mismatch"


def test_append_exchange_records_an_adapter_call_without_credentials(tmp_path: Path) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = ProviderRequest(
        "openai_chat", "m", "https://up.example/v1/chat/completions", body, sha256_hex(body),
        (("content-type", "application/json"),), "authorization", "Bearer ",
    )
    raw = json.dumps(OPENAI_BODY).encode()
    parsed = ParsedResponse("hi", "stop", "gpt-x-2025", "req-9", usage_from_response("openai_chat", OPENAI_BODY))
    exchange = Exchange(request, 200, raw, sha256_hex(raw), {"x-request-id": "req-9"}, 5.0, 6.25, parsed)
    path = tmp_path / "wire.jsonl"
    WireLog(path, "direct").append_exchange(exchange)
    (rec,) = read_wire(path, "direct")
    assert rec.via == "direct" and rec.request_id == "req-9" and rec.latency_s == 1.25
    assert rec.usage == parsed.usage and rec.request_body == body and rec.response_raw == raw


def test_append_refuses_bad_via_and_error_codes(tmp_path: Path) -> None:
    log = WireLog(tmp_path / "w.jsonl", "t")
    with pytest.raises(Refusal):
        append(log, OPENAI_BODY, via="carrier-pigeon")
    with pytest.raises(Refusal):
        append(log, OPENAI_BODY, error_code="bogus")


def test_status_level_error_codes(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WireLog(path, "t")
    err = {"error": {"message": "slow down", "type": "rate_limit"}}
    for status in (429, 401, 500, 400, 402):
        append(log, err, status=status)
    append(log, b"<html>oops</html>", status=200)
    append(log, b"", status=None, error_code="transport")
    codes = [r.error_code for r in read_wire(path)]
    assert codes == ["rate_limited", "auth", "server_error", "bad_request", "billing", "malformed_response", "transport"]


def test_the_request_id_header_wins_and_headers_are_never_recorded(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    append(WireLog(path, "t"), OPENAI_BODY, response_headers={"X-Request-Id": "hdr-1", "Set-Cookie": "SECRET-COOKIE"})
    assert read_wire(path)[0].request_id == "hdr-1"
    assert b"SECRET-COOKIE" not in path.read_bytes()


# --- metering a wire log ---------------------------------------------------------------------------


PRICING = PricingTable(
    {"m": Price("m", 1.0, 2.0, 0.5), "priced-key": Price("priced-key", 10.0, 10.0)}, "0" * 64
)


def test_meter_wire(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WireLog(path, "t")
    body = {"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 500_000}, "choices": []}
    append(log, body, model="m")
    append(log, body, model="m")
    append(log, body, model="aliased")
    append(log, {"error": {"message": "rate"}}, status=429, model="m")
    append(log, b"{}", shape="unknown", method="GET", url="http://up/v1/models", model=None)
    append(log, b"{}", shape="unknown", url="http://up/v1/messages/count_tokens", model=None)
    records = read_wire(path)
    totals = meter_wire(records, PRICING, {"aliased": "priced-key"})
    assert totals.records == 6 and totals.metered == 3
    assert totals.errors_unbilled == 1 and totals.not_metered == 2
    assert totals.cost.total == 2.0 + 2.0 + 15.0 and totals.cost.status == "metered"
    assert totals.tokens == TokenUsage(input=3_000_000, output=1_500_000)
    assert totals.by_model["aliased"]["pricing_key"] == "priced-key"
    assert totals.by_model["m"]["cost"]["total"] == 4.0
    unmapped = meter_wire(records, PRICING)
    assert unmapped.cost.total is None and unmapped.price_unknown == 1 and unmapped.cost.known_total == 4.0
    json.dumps(totals.to_json())


def test_meter_wire_keeps_unknown_unknown(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WireLog(path, "t")
    append(log, {"usage": {"prompt_tokens": 10, "completion_tokens": 1}}, model="m")
    append(log, {"choices": []}, model="m")  # no usage
    append(log, b"", status=None, error_code="timeout")  # no response: may have been billed
    append(log, b"{}", shape="unknown", url="http://up/v1/embeddings", model=None)  # an unknown POST
    totals = meter_wire(read_wire(path), PRICING)
    assert totals.cost.total is None and totals.usage_unknown == 3 and totals.metered == 4
    assert totals.cost.known_total == pytest.approx(12e-6)


def test_cli_wire_meter(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    body = {"model": "sim-flash", "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}}
    append(WireLog(path, "t"), body, model="sim-flash")
    done = run_proctor("wire", "meter", str(path), "--name", "t")
    assert done.code == 0 and done.out["cost"]["total"] == 0.5
    assert done.out["tokens"]["input"] == 1_000_000
    rechain(path, lambda d: d.update(usage={**d["usage"], "output": 1}))
    done = run_proctor("wire", "meter", str(path))
    assert done.code == 3 and done.out["refusal"] == "wire_record_invalid" and done.out["path"] == str(path)
    fresh = tmp_path / "fresh.jsonl"
    append(WireLog(fresh, "t"), body, model="sim-flash")
    bad = tmp_path / "p.yaml"
    bad.write_text(model_yaml(input_per_mtok=".nan"))
    done = run_proctor("wire", "meter", str(fresh), "--pricing", str(bad))
    assert done.code == 3 and done.out["refusal"] == "pricing_invalid"


def test_cost_is_frozen() -> None:
    cost = meter(TokenUsage(input=1), FULL)
    with pytest.raises(AttributeError):
        cost.total = 0.0  # type: ignore[misc]
    assert isinstance(cost, Cost)
