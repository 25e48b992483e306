"""Benchmark: `audit_results` CPU per call with the parse reuse (packet, pricing, design) against without it.

The peer, in the same run, is the same audit with the reuse turned off (dicts that never keep an entry: the
behaviour before it), alternating rounds. The flip sweeps in tests/audit/test_audit.py audit a study once
per flipped byte, so this is their cost per flip.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_audit.py -s
"""

from __future__ import annotations

import resource
import statistics
from pathlib import Path

import pytest

import harness.evals.suite as suite
import harness.meter.pricing as pricing
import harness.prereg.design as design
from harness.audit.audit import audit_results
from harness.evidence.memo import ParsedMemo
from harness.run.runner import run_stage
from tests.support.bench import Row, bench_command, record
from tests.support.study import prereg, sim_servers, system, urls

ROUNDS = 6
CALLS = 20


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_audit_cpu_with_and_without_parse_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with sim_servers(tmp_path) as sim:
        p = prereg(tmp_path, items=3)
        assert run_stage(p, "A", tmp_path / "results", base_urls=urls(sim([system("sim-flash", 1.0),
                                                                          system("sim-glm", 0.0)]))).exit_code == 0
    results = tmp_path / "results" / "rt"
    per_call: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(ROUNDS):
        for mode in ("off", "on"):
            for module, name in ((suite, "_PACKETS"), (pricing, "_TABLES"), (design, "_DESIGNS")):
                monkeypatch.setattr(module, name, ParsedMemo(keep=0 if mode == "off" else 8))
            start = _cpu()
            for _ in range(CALLS):
                assert audit_results(results, prereg=p).ok
            per_call[mode].append((_cpu() - start) / CALLS)
    off, on = statistics.median(per_call["off"]), statistics.median(per_call["on"])
    print(f"\naudit CPU per call, median of {ROUNDS} x {CALLS}: reuse on {on * 1000:.1f} ms, "
          f"off {off * 1000:.1f} ms, ratio off/on {off / on:.2f}x")
    record("audit_parse_reuse", [Row(
        f"`audit_results` CPU per call, one 3-item stage, median of {ROUNDS} alternating rounds of {CALLS}",
        f"parse reuse on: {on * 1000:.1f} ms", "the same audit, reuse off (every call parses packet, pricing "
        "and design again)", f"{off * 1000:.1f} ms", f"{off / on:.2f}x less CPU",
        bench_command("tests/bench/bench_audit.py"))])
