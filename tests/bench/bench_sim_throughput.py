"""Benchmark: dispatch throughput against the simulator at a fixed latency.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_sim_throughput.py -s

A `proctor sim serve` subprocess answers every request after a fixed 0.25 s.
At 1, 16, 64 and 256 concurrent requests (one worker each, sending one
request after another; every connection opened first), each client runs for
about 4 s and the bench reports the achieved requests/s as a fraction of the
ideal (concurrency / latency) and the CPU time per request spent in the
client process (`time.process_time()` delta / requests), with the server's
(utime + stime from /proc/<pid>/stat) for context. The clients take turns at
each level, so they share the machine's conditions; the whole run takes
about a minute.

Clients:

- `proctor`: proctor's dispatch path, `OpenAIChat().build_request` (canonical
  bytes, sha256) + `Transport.asend` (exact bytes out, response hashed,
  scrubbed and parsed, usage read).
- `proctor + wire log`: the same plus `WireLog.append_exchange` to a temp
  file per exchange (the response parsed again for the record, one chained,
  fsynced line), which is what a run does per attempt.
- `raw asyncio (peer)`: a minimal HTTP/1.1 keep-alive client on asyncio
  streams, the simulator's own ceiling.
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

import pytest

from harness.meter.wire import WireLog
from harness.providers.base import GenerationSettings
from harness.providers.openai_chat import OpenAIChat
from harness.providers.transport import Transport
from tests.support.bench import Row, bench_command, record

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
LATENCY_S = 0.25
LEVELS = (1, 16, 64, 256)
SECONDS_PER_LEVEL = 4.0
MODEL = "sim-fixed"
PROMPT = "Rehearse the pipeline: answer briefly. " * 8
CREDENTIAL = "sk-sim-not-a-secret"


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

    @property
    def client_ms(self) -> float:
        return 1000 * self.client_cpu_s / max(1, self.requests)

    @property
    def server_ms(self) -> float:
        return 1000 * self.server_cpu_s / max(1, self.requests)


Send = Callable[[], Awaitable[bool]]


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


async def _measure(sim: Sim, client: str, sends: list[Send]) -> Level:
    await _drive(sends, None)  # open every connection first
    cpu0, server0, t0 = time.process_time(), _server_cpu_s(sim.pid), time.perf_counter()
    ok = await _drive(sends, SECONDS_PER_LEVEL)
    seconds = time.perf_counter() - t0
    cpu, server = time.process_time() - cpu0, _server_cpu_s(sim.pid) - server0
    return Level(client, len(sends), ok, seconds, cpu, server)


async def _raw(sim: Sim, concurrency: int, folder: Path) -> Level:
    """The simulator's own ceiling: a minimal HTTP/1.1 keep-alive client on asyncio streams."""
    host, port = sim.url.split("//")[1].split("/")[0].rsplit(":", 1)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}).encode()
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
        return await _measure(sim, "raw asyncio (peer)", [sender(r, w) for r, w in streams])
    finally:
        for _, writer in streams:
            writer.close()


async def _proctor(sim: Sim, concurrency: int, folder: Path, *, wire: bool) -> Level:
    """proctor's path: build_request + Transport.asend, and with `wire` a wire-log line per exchange."""
    log = WireLog(folder / f"wire-{concurrency}.jsonl", "bench") if wire else None
    chat = OpenAIChat()
    async with Transport(timeout_s=60, max_connections=concurrency) as transport:

        async def send() -> bool:
            request = chat.build_request(MODEL, PROMPT, GenerationSettings(), sim.url)
            exchange = await transport.asend(request, CREDENTIAL)
            if log is not None:
                log.append_exchange(exchange)
            return exchange.parsed.ok and exchange.parsed.usage is not None

        return await _measure(sim, "proctor + wire log" if wire else "proctor", [send] * concurrency)


CLIENTS: dict[str, Callable[[Sim, int, Path], Awaitable[Level]]] = {
    "proctor": lambda sim, c, folder: _proctor(sim, c, folder, wire=False),
    "proctor + wire log": lambda sim, c, folder: _proctor(sim, c, folder, wire=True),
    "raw asyncio (peer)": _raw,
}


def _report(levels: list[Level], elapsed: float) -> None:
    by = {(r.client, r.concurrency): r for r in levels}
    print(
        f"\n\nDispatch throughput against the simulator: fixed {LATENCY_S} s latency, "
        f"{SECONDS_PER_LEVEL:.0f} s per level, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, {elapsed:.0f} s in all"
    )
    print("of ideal = (requests/s) / (concurrency / latency); CPU/req = client process_time / requests\n")
    cols = "".join(f"{c:>8}" for c in LEVELS)
    print(f"{'':<20}{'of ideal at concurrency':>32}    {'client CPU per request (ms)':>32}")
    print(f"{'client':<20}{cols}    {cols}")
    for client in CLIENTS:
        fractions = "".join(f"{by[client, c].fraction:>8.1%}" for c in LEVELS)
        cpu = "".join(f"{by[client, c].client_ms:>8.3f}" for c in LEVELS)
        print(f"{client:<20}{fractions}    {cpu}")
    print(
        f"\n{'client':<20}{'concurrency':>11} {'requests':>8} {'seconds':>7} {'req/s':>7} {'ideal':>6} "
        f"{'of ideal':>8} {'client CPU/req':>14} {'server CPU/req':>14}"
    )
    for r in sorted(levels, key=lambda r: (list(CLIENTS).index(r.client), r.concurrency)):
        print(
            f"{r.client:<20}{r.concurrency:>11} {r.requests:>8} {r.seconds:>7.2f} {r.rate:>7.1f} "
            f"{r.concurrency / LATENCY_S:>6.0f} {r.fraction:>8.1%} {r.client_ms:>11.3f} ms {r.server_ms:>11.3f} ms"
        )


def test_sim_throughput(sim: Sim, tmp_path: Path) -> None:
    started = time.perf_counter()
    levels = [asyncio.run(measure(sim, c, tmp_path)) for c in LEVELS for measure in CLIENTS.values()]
    _report(levels, time.perf_counter() - started)
    by = {(r.client, r.concurrency): r for r in levels}
    assert all(r.requests > 0 for r in levels)

    def shares(client: str) -> str:
        return " / ".join(f"{100 * by[client, c].fraction:.0f}" for c in LEVELS) + " %"

    def cpu(client: str) -> str:
        return " / ".join(f"{by[client, c].client_ms:.2f}" for c in LEVELS) + " ms"

    top, peer = by["proctor", LEVELS[-1]], by["raw asyncio (peer)", LEVELS[-1]]
    record("sim_throughput", [Row(
        f"dispatch throughput vs the simulator at {LATENCY_S} s latency, "
        f"{' / '.join(map(str, LEVELS))} concurrent, share of ideal and client CPU per request",
        f"provider + `Transport.asend`: {shares('proctor')}, {cpu('proctor')}; "
        f"with a wire-log append per exchange: {shares('proctor + wire log')}",
        "raw asyncio HTTP/1.1 client", f"{shares('raw asyncio (peer)')}, {cpu('raw asyncio (peer)')}",
        f"at {LEVELS[-1]}: {top.rate / peer.rate:.2f} of the peer's rate",
        bench_command("tests/bench/bench_sim_throughput.py"))])
    # Loose floors, not a timing benchmark: the latency must overlap across connections ...
    assert all(r.fraction > 0.8 for r in levels if r.concurrency <= 16)
    assert all(by["raw asyncio (peer)", c].fraction > 0.6 for c in LEVELS)  # ... the simulator keeps up ...
    # ... and proctor's cost per request must not grow with the connections (one httpx pool: ~20 ms at 256).
    assert by["proctor", 256].client_ms < 3.0
