"""Where chain verification spends its time, and what the tempting shortcuts would save (issue 16).

Run: pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_chain_parts.py -s

On the blocks `verify_log` reads (256 KiB of the bench log's lines), CPU time
(`time.thread_time`, so other processes on the machine count less), medians of
alternating runs, each beside the whole block check (`chain_read._fast_lines`):

- its parts: parse the block as one array, then re-encode each object, and sha256 per line;
- orjson's proof of the same (`chain_read._orjson_objects`), which the check uses first;
- the same parse followed by one re-encoding of the whole array compared with
  the comma-joined lines (the shortcut measured and rejected in docs/evidence.md);
- sha256 over the same bytes in one call (the floor).

Every case parses afresh, as a verifier does: re-encoding objects parsed once
and kept warm flatters the whole-array encoding (0.82x instead of 0.88x).
"""

from __future__ import annotations

import hashlib
import json
import operator
import statistics
import time
from collections.abc import Callable

import pytest

from harness.evidence import chain_read
from tests.bench.bench_chain import _big_chain

pytestmark = pytest.mark.bench

LINES = 200_000
RUNS = 7


def _blocks(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    pos = data.index(b"\n") + 1  # the seed line is checked on its own
    while pos < len(data):
        cut = data.rfind(b"\n", pos, pos + chain_read._CHUNK) + 1
        out.append(data[pos:cut])
        pos = cut
    return out


def test_bench_verify_parts() -> None:
    data, _ = _big_chain(LINES, "bench/parts.jsonl")
    blocks = _blocks(data)
    body_bytes = sum(map(len, blocks))
    texts = [b.decode()[:-1] for b in blocks]
    arrays = ["[" + t.replace("\n", ",") + "]" for t in texts]
    raws = [b.split(b"\n")[:-1] for b in blocks]
    hexdigest = operator.methodcaller("hexdigest")
    encode = chain_read._encode

    def whole() -> None:
        for block in blocks:
            assert chain_read._fast_lines(block, None) is not None

    def parse() -> None:
        for array in arrays:
            json.loads(array)

    def encode_lines() -> None:
        for array, text in zip(arrays, texts, strict=True):
            assert "\n".join(map(encode, json.loads(array))) == text

    def encode_array() -> None:
        for array in arrays:
            assert encode(json.loads(array)) == array

    def orjson_proof() -> None:
        for block, raw in zip(blocks, raws, strict=True):
            assert chain_read._orjson_objects(block[:-1], len(raw)) is not None

    def sha_lines() -> None:
        for raw in raws:
            list(map(hexdigest, map(hashlib.sha256, raw)))

    def sha_floor() -> None:
        hashlib.sha256(data).hexdigest()

    cases: dict[str, Callable[[], None]] = {
        "whole block check (_fast_lines)": whole,
        "  parse, one array per block": parse,
        "  parse + re-encode per line (stdlib)": encode_lines,
        "  sha256 per line": sha_lines,
        "orjson's proof (loads, dumps, floats)": orjson_proof,
        "parse + one re-encoding of the array": encode_array,
        "sha256 in one call (the floor)": sha_floor,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(RUNS):
        for name, run in cases.items():
            start = time.thread_time()
            run()
            times[name].append(time.thread_time() - start)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    total = med["whole block check (_fast_lines)"]
    mb = body_bytes / 1e6
    print(
        f"\n[chain verify parts] {LINES:,} lines, {mb:.1f} MB in {len(blocks)} blocks, CPU medians of {RUNS}"
    )
    for name, took in med.items():
        print(
            f"  {name:40s} {mb / took:8.1f} MB/s  {took / LINES * 1e9:7.0f} ns/line  {took / total:6.1%} of the check"
        )
    today, array = (
        med["  parse + re-encode per line (stdlib)"],
        med["parse + one re-encoding of the array"],
    )
    print(
        f"  ratio one array / per line (parse + re-encode): {array / today:.2f}"
        f" (would save {(today - array) / total:.1%} of the check; unsound without a boundary proof)"
    )
    print(f"  ratio check / floor: {med['sha256 in one call (the floor)'] / total:.3f}")
