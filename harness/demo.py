"""`make demo`: the gated path end to end on a bundled task, step by step, through the real CLI.

It copies a bundled task's workspace into a fresh git repository in a
temporary folder and runs lane, init, a failing verify, a dispatch of the
scripted worker, a passing verify, accept and status, printing each step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["main", "make_workspace"]

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "evals" / "tasks"


def make_workspace(task_dir: Path, parent: Path) -> Path:
    """A git repository holding a copy of the task's workspace, with one commit."""
    ws = parent / "workspace"
    shutil.copytree(task_dir / "workspace", ws)
    git = ["git", "-C", str(ws), "-c", "user.name=proctor demo", "-c", "user.email=demo@proctor.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "task as given"], check=True)
    return ws


def _run(step: str, words: list[str], expect: int) -> dict[str, Any]:
    cut = words.index("--command") if "--command" in words else len(words)
    argv = [sys.executable, "-m", "harness", *words[:cut], "--json", *words[cut:]]
    shown = " ".join(["proctor", *words]).replace(str(REPO) + "/", "")
    print(f"\n== {step}\n$ {shown}")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    result: dict[str, Any] = json.loads(done.stdout)
    if done.returncode != expect:
        print(json.dumps(result, indent=2))
        raise SystemExit(f"demo: step {step!r} exited {done.returncode}, expected {expect}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.demo", description=__doc__)
    parser.add_argument("--task", default="wordfreq", help="bundled task folder under evals/tasks")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    task_dir = TASKS / args.task
    task = str(task_dir / "task.json")
    worker = [sys.executable, str(TASKS / "scripted_worker.py")]
    tmp = Path(tempfile.mkdtemp(prefix="proctor-demo-"))
    try:
        ws = str(make_workspace(task_dir, tmp))
        print(f"proctor demo: task {args.task}, workspace {ws} (a fresh git repository)")
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
        print("\nproctor demo: done")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
