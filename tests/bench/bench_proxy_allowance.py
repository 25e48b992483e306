"""Benchmark: what an allowance costs the metering proxy per request, against the same proxy without one.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_proxy_allowance.py -s

A canned loopback upstream (tests/support/provider_server.py) answers every
request at once. Two proxies stand in front of it, writing their own wire
logs: the peer without an allowance, and one with an allowance large enough
never to stop (each request is bounded, admitted, held, recorded, re-read and
settled). One keep-alive client sends the requests one after another, the
two proxies taking turns in rounds of ROUND requests so that they share the
machine's conditions; the bench prints the mean milliseconds per request of
each and their ratio (allowance / peer), and records its row for docs/benchmarks.md
(tests/bench/table.py renders it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from harness.meter.allowance import Allowance
from harness.meter.pricing import load_pricing
from harness.meter.proxy import start_proxy
from tests.support.bench import Row, record
from tests.support.provider_server import ProviderServer

pytestmark = pytest.mark.bench

ROUNDS = 10
ROUND = 30
BODY = json.dumps({"model": "sim-flash", "messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 256})
ANSWER = json.dumps({
    "id": "c", "object": "chat.completion", "created": 0, "model": "sim-flash",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 500, "completion_tokens": 2, "total_tokens": 502},
}).encode()


def test_allowance_overhead_per_request(tmp_path: Path) -> None:
    allowance = Allowance(1e9, load_pricing(None), 1.0)
    spent = {"peer": 0.0, "allowance": 0.0}
    with ProviderServer() as upstream:
        upstream.serve(200, {"Content-Type": "application/json"}, ANSWER)
        with start_proxy(upstream.url + "/v1", tmp_path / "peer.jsonl", name="peer") as peer, \
                start_proxy(upstream.url + "/v1", tmp_path / "allow.jsonl", name="allow", allowance=allowance) as ruled:
            with httpx.Client(trust_env=False) as client:
                for _ in range(ROUNDS):
                    for label, proxy in (("peer", peer), ("allowance", ruled)):
                        t0 = time.perf_counter()
                        for _ in range(ROUND):
                            assert client.post(proxy.url + "/chat/completions", content=BODY).status_code == 200
                        spent[label] += time.perf_counter() - t0
            assert ruled.summary()["allowance"]["settled"] == ROUNDS * ROUND
    n = ROUNDS * ROUND
    peer_ms, allow_ms = 1000 * spent["peer"] / n, 1000 * spent["allowance"] / n
    print(f"\nproxy without allowance (peer): {peer_ms:.3f} ms/request; with allowance: {allow_ms:.3f} ms/request; "
          f"ratio {allow_ms / peer_ms:.3f} ({n} requests each)")
    record("proxy_allowance", [Row(
        f"the metering proxy with an attempt's allowance, {n} sequential requests, rounds of {ROUND} alternating",
        f"with an allowance (bound, admit, hold, record, settle): {allow_ms:.1f} ms per request",
        "the same proxy without one", f"{peer_ms:.1f} ms per request", f"{allow_ms / peer_ms:.2f}x",
        ".venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_proxy_allowance.py -s",
    )])
