"""`make demo`: the gated path end to end on bundled tasks, step by step, through the real CLI.

Part one copies a bundled task's workspace into a fresh git repository in a
temporary folder and runs lane, init, a failing verify, a dispatch of the
scripted worker, a passing verify, accept and status, printing each step.

Part two puts a model over real HTTP in the worker's place: it starts the
simulator (`proctor sim serve`, which answers the bundled tasks), copies a
second task into a fresh repository and runs lane, init, `dispatch --model
auto` (the built-in llm-edit worker, through the metering proxy) and verify,
dispatching again while verify fails and the budget allows, then accept,
record (tokens and the notional cost metered from the wire) and status. The
simulator is deterministic from its seed, so the walk-through is the same on
every run; its default seed and task end accepted after one failed attempt.

Part three is a whole preregistered study: it checks the frozen `prereg/demo`,
starts the simulator answering HumanEval items, runs stage A through
`notebooks/run_study.ipynb` (`proctor batch`, papermill), stops the simulator,
runs `proctor analyze` (the analysis notebook, its HTML export, tables and
figures, all anchored) and `proctor audit`, and prints the q table, the
equivalence verdict, the break-even lines and the paths. Its files go to
`build/demo/` (emptied first; `--out` elsewhere), so they can be read after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.evidence.git import run_git

__all__ = ["main", "make_workspace"]

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "evals" / "tasks"


def make_workspace(task_dir: Path, parent: Path) -> Path:
    """A git repository holding a copy of the task's workspace, with one commit."""
    parent.mkdir(parents=True, exist_ok=True)
    ws = parent / "workspace"
    shutil.copytree(task_dir / "workspace", ws)
    who = {f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER")
           for what, value in (("NAME", "proctor demo"), ("EMAIL", "demo@proctor.invalid"))}  # fmt: skip
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "task as given"]):
        run_git(args, git_dir=str(ws / ".git"), work_tree=str(ws), env=who).check_returncode()
    return ws


def _run(
    step: str, words: list[str], expect: int | tuple[int, ...], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run `proctor WORDS --json`, print the step, and insist on an expected exit code."""
    cut = words.index("--command") if "--command" in words else len(words)
    argv = [sys.executable, "-m", "harness", *words[:cut], "--json", *words[cut:]]
    shown = " ".join(["proctor", *words]).replace(str(REPO) + "/", "")
    print(f"\n== {step}\n$ {shown}", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=None if env is None else dict(env))
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"demo: step {step!r} printed no JSON object (exit {done.returncode})") from None
    expected = (expect,) if isinstance(expect, int) else expect
    if done.returncode not in expected:
        print(json.dumps(result, indent=2))
        raise SystemExit(f"demo: step {step!r} exited {done.returncode}, expected {' or '.join(map(str, expected))}")
    return result


@contextmanager
def simulator(folder: Path, seed: int, source: tuple[str, str] | None = None,
              env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run `proctor sim serve` on a free loopback port for the block; yields its base URL. Stopped in a finally.

    `source` is the simulator's answers: ("--tasks", folder) (default: the bundled tasks)
    or ("--answers", a JSONL file).
    """
    ready = folder / f"sim-ready-{seed}.json"
    ready.unlink(missing_ok=True)  # a ready file left by an earlier simulator names a dead port
    flag, where = source or ("--tasks", str(TASKS))
    argv = [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", flag, where,
            "--ready-file", str(ready), "--seed", str(seed)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=None if env is None else dict(env))
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None:
                raise SystemExit(f"demo: the simulator exited {proc.returncode}: {proc.communicate()[1].decode()}")
            if time.monotonic() > deadline:
                raise SystemExit("demo: the simulator did not get ready in 30 s")
            time.sleep(0.02)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _lines(path: str | None) -> int:
    if not path or not os.path.exists(path):
        return 0
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def part_one(task_name: str, tmp: Path) -> None:
    """The scripted worker: a worker that fixes the task without any model."""
    task_dir = TASKS / task_name
    task = str(task_dir / "task.json")
    # Named in its argv, the task folder is visible (read-only) in the worker's sandbox; its hidden tests are not.
    worker = [sys.executable, str(TASKS / "scripted_worker.py"), "--task-dir", str(task_dir)]
    ws = str(make_workspace(task_dir, tmp / "scripted"))
    print(f"proctor demo, part 1: the scripted worker on task {task_name}, workspace {ws} (a fresh git repository)")
    r = _run("lane: which tier of worker", ["lane", "--task", task], 0)
    print(f"lane {r['lane']}: {r['reason']}; production entrypoints: {r['production_entrypoints'] or 'none'}")
    r = _run("init: pin the verifier, seal its inputs outside the workspace", ["init", "--workspace", ws, "--task", task], 0)
    print(f"state folder {r['state_dir']}\nsealed {r['sealed']}; hidden {r['hidden']}; baseline tree {r['baseline_tree']['digest'][:16]}")
    r = _run("verify before any work: the sealed verifier must fail", ["verify", "--workspace", ws, "--task", task], 1)
    print(f"receipt {r['receipt_id']}: passed={r['passed']} exit={r['exit_code']}; {r['output_tail'].strip().splitlines()[-1]}")
    r = _run("accept now: refused", ["accept", "--workspace", ws, "--task", task], 3)
    print(f"refused: {r['refusal']}: {r['message']}")
    r = _run("dispatch the scripted worker", ["dispatch", "--workspace", ws, "--task", task, "--command", "--", *worker], 0)
    print(f"dispatch {r['dispatch_id']}: exit {r['exit_code']} in {r['duration_s']:.2f}s; tree now {r['tree_after']['digest'][:16]}")
    r = _run("verify on a fresh copy with the hidden tests laid in", ["verify", "--workspace", ws, "--task", task], 0)
    print(f"receipt {r['receipt_id']}: passed={r['passed']} on tree {r['tree'][:16]}; {r['output_tail'].strip().splitlines()[-1]}")
    r = _run("accept: the receipt binds this exact tree", ["accept", "--workspace", ws, "--task", task], 0)
    print(f"accepted receipt {r['receipt_id']} for tree {r['tree'][:16]} after {r['dispatches']} dispatch(es)")
    r = _run("status", ["status", "--workspace", ws], 0)
    print(
        f"dispatches {r['dispatches']}/{r['max_dispatches']}; orphaned {r['orphaned_dispatch_ids'] or 'none'}; "
        f"detached {r['detached_dispatch_ids'] or 'none'}; stall suspected: {r['stall_suspected']}; "
        f"degraded measurement: {', '.join(r['measurement_degraded']['components']) or 'none'}"
    )
    r = _run("the journal is an intact chain", ["ledger", "verify", os.path.join(r["state_dir"], "journal.jsonl")], 0)
    print(f"journal: {r['lines']} lines, head {r['head'][:16]}")


def part_two(task_name: str, seed: int, tmp: Path) -> None:
    """A model over real HTTP: the simulator behind the llm-edit worker, metered through the proxy."""
    task_dir = TASKS / task_name
    task = str(task_dir / "task.json")
    max_dispatches = int(json.loads((task_dir / "task.json").read_text())["budget"]["max_dispatches"])
    print(f"\n\nproctor demo, part 2: a model over real HTTP on task {task_name}")
    print(
        "The simulator (proctor sim serve) plays the model API: simulated systems behind the OpenAI Chat\n"
        "Completions API on loopback, deterministic from a seed. It rehearses the pipeline; it is never\n"
        "evidence about a model."
    )
    with simulator(tmp, seed) as url:
        print(f"simulator at {url} (seed {seed}); PROCTOR_SIM_URL={url} for every command below")
        env = {k: v for k, v in os.environ.items() if k != "PROCTOR_CATALOG"}  # the bundled catalog: sim models
        env["PROCTOR_SIM_URL"] = url
        ws = str(make_workspace(task_dir, tmp / "model"))
        print(f"workspace {ws} (a fresh git repository)")
        r = _run("lane", ["lane", "--task", task], 0, env)
        print(f"lane {r['lane']}: {r['reason']}")
        r = _run("init", ["init", "--workspace", ws, "--task", task], 0, env)
        state_dir = r["state_dir"]
        print(f"state folder {state_dir}; baseline tree {r['baseline_tree']['digest'][:16]}")
        passed = False
        for attempt in range(1, max_dispatches + 1):
            r = _run(
                f"dispatch {attempt}/{max_dispatches}: --model auto, the cheapest model of the lane, "
                "through the metering proxy",
                ["dispatch", "--workspace", ws, "--task", task, "--model", "auto"], (0, 1), env,
            )
            if r["lane_switch"]:
                s = r["lane_switch"]
                print(f"lane switch {s['from']} -> {s['to']}: {s['reason']}; evidence packet {s['evidence_file']}")
            if r.get("targeted_repair"):
                t = r["targeted_repair"]
                print(f"targeted repair {t['repair']}: {t['reason']}; repair packet {t['evidence_file']}")
            print(
                f"dispatch {r['dispatch_id']}: model {r['model']} (lane {r['lane']}), llm-edit exit {r['exit_code']} "
                f"in {r['duration_s']:.2f}s;\nthe metering proxy recorded {_lines(r['wire_log'])} exchange(s) in "
                f"<state folder>/{os.path.relpath(r['wire_log'], state_dir)}"
            )
            if r["provider_failure"]:
                print("the provider failed: the next dispatch tries another provider of the same lane")
            r = _run("verify", ["verify", "--workspace", ws, "--task", task], (0, 1), env)
            tail = r["output_tail"].strip().splitlines()[-1]
            if r["passed"]:
                print(f"receipt {r['receipt_id']}: passed on tree {r['tree'][:16]}; {tail}")
                passed = True
                break
            print(f"receipt {r['receipt_id']}: failed, fingerprint {str(r.get('fingerprint'))[:16]}; {tail}")
            if attempt < max_dispatches:
                print("the model's answer did not pass: dispatch again (three identical failures switch the lane)")
        if passed:
            r = _run("accept", ["accept", "--workspace", ws, "--task", task], 0, env)
            print(f"accepted receipt {r['receipt_id']} for tree {r['tree'][:16]} after {r['dispatches']} dispatch(es)")
        else:
            r = _run("accept: the budget ran out without a passing receipt", ["accept", "--workspace", ws, "--task", task], 3, env)
            print(f"refused: {r['refusal']}: {r['message']}")
        r = _run("record: what it cost, metered from the wire logs", ["record", "--workspace", ws, "--task", task], 0, env)
        tokens = r["tokens"] or {}
        shown = ", ".join(f"{k} {tokens[k]}" for k in ("input", "cached_input", "cache_write", "output", "reasoning"))
        notional = r["pricing"]["notional"]
        cost = "unknown" if r["cost"] is None else f"${r['cost']:.6f}"
        print(f"task record line {r['line']}: {r['dispatches']['count']} dispatch(es), models {r['dispatches']['models']}, "
              f"accept {r['accept']['state']}")
        print(f"metered from the wire: {r['exchanges']} exchange(s); tokens: {shown}")
        print(f"cost {cost} ({r['cost_status']})"
              + ("; NOTIONAL: the bundled simulator prices are made up, not any real model's" if notional else ""))
        r = _run("status", ["status", "--workspace", ws], 0, env)
        print(
            f"dispatches {r['dispatches']}/{r['max_dispatches']}; lane {r['lane']}; accepted: {r['accepted']}; "
            f"degraded measurement: {', '.join(r['measurement_degraded']['components']) or 'none'}"
        )


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as aligned text (floats to 3 places, None as '-')."""
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if v == 0 or abs(v) >= 0.1 else f"{v:.3g}"
        return str(v)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def part_three(out: Path, seed: int, tmp: Path) -> None:
    """A preregistered study: run notebook, analysis notebook and audit on the frozen prereg/demo."""
    print("\n\nproctor demo, part 3: the frozen preregistration prereg/demo, stage A, against simulated tiers")
    _study(out, seed, tmp, REPO / "prereg" / "demo", "A",
           REPO / "evals" / "humaneval" / "private" / "sim_answers.jsonl", "HumanEval items")


def part_four(out: Path, seed: int, tmp: Path, stage: str = "A") -> None:
    """The agents demo: coding agents on the mutant suite (single shot, feedback, a live cascade), prereg/agents-demo."""
    print(f"\n\nproctor demo, part 4: the agents demo prereg/agents-demo, stage {stage}: llm-edit single shot, "
          "with repair turns, and a live cascade on the mutant suite, against simulated tiers")
    _study(out, seed, tmp, REPO / "prereg" / "agents-demo", stage,
           REPO / "evals" / "mutants" / "private" / "sim_answers.jsonl", "the mutant tasks")


def _study(out: Path, seed: int, tmp: Path, prereg: Path, stage: str, answers: Path, what: str) -> None:
    """Check, run one stage through the run notebook against the simulator, analyse, audit; print the tables."""
    results = out / "results"
    study = json.loads((prereg / "systems.json").read_text())["study"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    r = _run("check the frozen preregistration", ["prereg", "check", str(prereg)], 0)
    covers = ", ".join(f"{name} the {case} case" for name, case in sorted(r["budget"]["covers"].items()))
    print(f"study {r.get('study')}: frozen, unchanged; budget covered: {r['budget']['covered']} "
          f"(what each limit covers: {covers})")
    env = {**os.environ, "PROCTOR_SIM_LATENCY_SCALE": "0.2"}
    with simulator(tmp, seed, ("--answers", str(answers)), env) as url:
        print(f"simulator at {url}, answering {what} (latency scaled by 0.2)")
        executed = results / study / stage / "run_study.ipynb"
        batch = out / "run-batch.json"
        batch.write_text(json.dumps({"jobs": [{
            "notebook": str(REPO / "notebooks" / "run_study.ipynb"), "out": str(executed), "cwd": str(REPO),
            "parameters": {"prereg": str(prereg), "stage": stage, "results": str(results), "base_url": url},
        }]}, indent=2))
        _run("run the stage through notebooks/run_study.ipynb (papermill)", ["batch", str(batch)], 0)
        print(f"executed run notebook {executed}")
    print("simulator stopped")
    r = _run("analyse: notebooks/analysis.ipynb (papermill), HTML export, outputs anchored",
             ["analyze", str(results)], 0)
    print("\nq table (hidden-test pass rate, Wilson interval, cost per pass):")
    print(_table(r["q_table"], ["stage", "system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high",
                                "cost_usd", "cost_per_pass_usd"]))
    print("\nequivalence (paired TOST at the registered margin):")
    print("\n".join(r["verdicts"]) or "(no registered comparison)")
    print("\ncheap-first break-even:")
    print("\n".join(r["break_even"]) or "(no cascade)")
    if r.get("repo_break_even"):
        print("\nrepository-task break-even (v measured from the live cascades' gates, or assumed):")
        print("\n".join(r["repo_break_even"]))
    _live_cascades(results, prereg)
    print(f"\nexecuted analysis notebook {r['notebook']['path']}\nHTML {r['html']['path']}")
    print("figures:\n" + "\n".join(f"  {f['path']}" for f in r["figures"]))
    a = _run("audit: every chain, anchor, receipt, the freeze, the plan and every anchored output",
             ["audit", str(results)], 0)
    print(f"audit: {'intact' if a['ok'] else 'BROKEN'}; {a.get('message') or ''}".rstrip("; "))


def _live_cascades(results: Path, prereg: Path) -> None:
    """Print the live-versus-composed cascade table when the design has a cascade arm."""
    from harness.analysis.cascade import live_cascades
    from harness.analysis.study import analyze_study

    table = live_cascades(analyze_study(results, prereg=prereg))
    if table.height:
        print("\nlive cascade vs composed (oracle gate), with the measured gate cost v:")
        print(_table(table.to_dicts(), ["stage", "arm", "cheap", "strong", "n", "escalated", "live_pass_rate",
                                        "live_mean_cost_usd", "composed_pass_rate", "composed_mean_cost_usd",
                                        "strong_pass_rate", "b_live", "s_live", "v_usd", "v_s", "gate_false_pass",
                                        "break_even_q_measured"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cli.demo", description=__doc__)
    parser.add_argument("--task", default="wordfreq", help="bundled task folder for part 1 (the scripted worker)")
    parser.add_argument("--model-task", default="intervals", help="bundled task folder for part 2 (a model)")
    parser.add_argument("--seed", type=int, default=0, help="the simulator's seed for part 2")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--out", default=str(REPO / "build" / "demo"),
                        help="where part 3 writes its results, notebooks and figures (emptied first)")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run (comma-separated; 4: the agents demo)")
    parser.add_argument("--agents-stage", default="A", help="the agents demo's stage (part 4): A, or smoke")
    parser.add_argument("--agents-out", default=str(REPO / "build" / "agents-demo"),
                        help="where part 4 writes its results, notebooks and figures (emptied first)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="proctor-demo-"))
    started = time.monotonic()
    try:
        parts = {p.strip() for p in args.parts.split(",")}
        if "1" in parts:
            part_one(args.task, tmp)
        if "2" in parts:
            part_two(args.model_task, args.seed, tmp)
        if "3" in parts:
            part_three(Path(args.out).resolve(), args.seed, tmp)
        if "4" in parts:
            part_four(Path(args.agents_out).resolve(), args.seed, tmp, args.agents_stage)
        print(f"\nproctor demo: done in {time.monotonic() - started:.1f}s")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
