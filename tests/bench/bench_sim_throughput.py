"""Benchmark: dispatch throughput against the simulator at a fixed latency.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_sim_throughput.py -s

A `proctor sim serve` subprocess answers every request after a fixed 0.25 s.
An asyncio client keeps 1, 16, 64 and 256 requests in flight (one keep-alive
connection each, opened first) for about 4 s per level and reports the
achieved requests/s as a fraction of the ideal (concurrency / latency), with
the CPU time per request spent in the client process (`time.process_time`) and
in the server (utime + stime from /proc/<pid>/stat).

Clients: `raw`, a minimal HTTP/1.1 client on asyncio streams (the simulator's
own ceiling); `httpx`, one `httpx.AsyncClient` whose pool holds every
connection; `httpx-pools-of-8`, the same spread over clients of 8 connections
each; and `adapter`, proctor's own path (`openai_chat.build_request` +
`Transport.asend`: exact bytes, hashing, parsing, usage) when present.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
LATENCY_S = 0.25
LEVELS = (1, 16, 64, 256)
SECONDS_PER_LEVEL = 4.0
MODEL = "sim-fixed"
PROMPT = "Rehearse the pipeline: answer briefly. " * 8


@dataclass
class Sim:
    url: str
    pid: int


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    folder = tmp_path_factory.mktemp("sim-bench")
    systems = folder / "systems.json"
    latency = {"dist": "fixed", "value": LATENCY_S}
    systems.write_text(json.dumps({"systems": [{"name": MODEL, "skill": 0.5, "latency_s": latency}]}))
    ready = folder / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    argv = [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", "--systems", str(systems)]
    proc = subprocess.Popen(
        [*argv, "--ready-file", str(ready)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the simulator did not start"
            time.sleep(0.02)
        yield Sim(json.loads(ready.read_text())["url"], proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _server_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Level:
    client: str
    concurrency: int
    requests: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def fraction(self) -> float:
        return self.rate / (self.concurrency / LATENCY_S)


Send = Callable[[], Awaitable[bool]]
RESULTS: list[Level] = []


async def _drive(sends: list[Send], seconds: float | None) -> int:
    """One worker per send function, each sending one request after another: once each
    (`seconds` None: warming the pool), or until `seconds` have passed. Returns the successes."""
    deadline = time.perf_counter() + (seconds or 0.0)
    ok = 0

    async def worker(send: Send) -> None:
        nonlocal ok
        while True:
            done = await send()  # not `ok += await ...`: that reads `ok` before the await
            ok += done
            if seconds is None or time.perf_counter() >= deadline:
                return

    await asyncio.gather(*(worker(send) for send in sends))
    return ok


async def _measure(sim: Sim, client: str, sends: list[Send]) -> None:
    await _drive(sends, None)  # open every connection first
    cpu0, server0, t0 = time.process_time(), _server_cpu_s(sim.pid), time.perf_counter()
    ok = await _drive(sends, SECONDS_PER_LEVEL)
    seconds = time.perf_counter() - t0
    cpu, server = time.process_time() - cpu0, _server_cpu_s(sim.pid) - server0
    RESULTS.append(Level(client, len(sends), ok, seconds, cpu, server))


def _body() -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}).encode()


async def _raw(sim: Sim, concurrency: int) -> None:
    """The simulator's own ceiling: a minimal HTTP/1.1 keep-alive client on asyncio streams."""
    host, port = sim.url.split("//")[1].split("/")[0].rsplit(":", 1)
    body = _body()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    request = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    streams = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]

    def sender(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Send:
        async def send() -> bool:
            writer.write(request)
            await writer.drain()
            lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
            return lines[0].split()[1] == b"200" and b'"usage"' in await reader.readexactly(length)

        return send

    try:
        await _measure(sim, "raw", [sender(r, w) for r, w in streams])
    finally:
        for _, writer in streams:
            writer.close()


async def _httpx(sim: Sim, concurrency: int, pool: int | None) -> None:
    """httpx.AsyncClient.post: one pool for all (`pool` None) or pools of `pool` connections."""
    size = pool or concurrency
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    clients = [httpx.AsyncClient(limits=limits, timeout=60) for _ in range(max(1, concurrency // size))]
    body, headers = _body(), {"content-type": "application/json", "authorization": "Bearer sk-sim-not-a-secret"}

    def sender(client: httpx.AsyncClient) -> Send:
        async def send() -> bool:
            reply = await client.post(f"{sim.url}/chat/completions", content=body, headers=headers)
            return reply.status_code == 200 and "usage" in reply.json()

        return send

    try:
        name = "httpx" if pool is None else f"httpx, pools of {pool}"
        await _measure(sim, name, [sender(clients[i % len(clients)]) for i in range(concurrency)])
    finally:
        for client in clients:
            await client.aclose()


async def _adapter(sim: Sim, concurrency: int) -> None:
    """proctor's path: openai_chat.build_request (exact bytes, sha256) + Transport.asend (parse, usage)."""
    from harness.providers import openai_chat
    from harness.providers.base import GenerationSettings
    from harness.providers.transport import Transport

    async with Transport(timeout_s=60, max_connections=concurrency) as transport:

        async def send() -> bool:
            request = openai_chat.build_request(MODEL, PROMPT, GenerationSettings(), sim.url)
            exchange = await transport.asend(request, "sk-sim-not-a-secret")
            return exchange.parsed.ok and exchange.parsed.usage is not None

        await _measure(sim, "adapter (Transport.asend)", [send] * concurrency)


def _adapter_available() -> bool:
    try:
        from harness.providers import openai_chat, transport  # noqa: F401
    except ImportError:
        return False
    return True


CLIENTS: dict[str, Callable[[Sim, int], Awaitable[None]]] = {
    "raw": _raw,
    "httpx": lambda sim, c: _httpx(sim, c, None),
    "httpx-pools-of-8": lambda sim, c: _httpx(sim, c, 8),
    "adapter": _adapter,
}


@pytest.mark.parametrize("client", list(CLIENTS))
def test_sim_throughput(sim: Sim, client: str) -> None:
    if client == "adapter" and not _adapter_available():
        pytest.skip("harness.providers.openai_chat / transport not present")
    before = len(RESULTS)
    for concurrency in LEVELS:
        asyncio.run(CLIENTS[client](sim, concurrency))
    levels = RESULTS[before:]
    print(f"\nsimulator at a fixed {LATENCY_S} s; client: {levels[0].client}; {os.cpu_count()} CPUs")
    print(
        f"{'concurrency':>11} {'requests':>8} {'seconds':>7} {'req/s':>7} {'ideal':>6} {'of ideal':>8} "
        f"{'client CPU/req':>14} {'server CPU/req':>14}"
    )
    for r in levels:
        print(
            f"{r.concurrency:>11} {r.requests:>8} {r.seconds:>7.2f} {r.rate:>7.1f} {r.concurrency / LATENCY_S:>6.0f} "
            f"{r.fraction:>8.1%} {1000 * r.client_cpu_s / r.requests:>11.3f} ms "
            f"{1000 * r.server_cpu_s / r.requests:>11.3f} ms"
        )
    assert all(r.requests > 0 for r in levels)
    # Loose floors, not a timing benchmark: the latency must overlap across connections.
    assert all(r.fraction > 0.8 for r in levels if r.concurrency <= 16)
    if client == "raw":  # the simulator itself must sustain every level
        assert all(r.fraction > 0.6 for r in levels)
