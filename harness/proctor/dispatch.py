"""`proctor dispatch`: run one worker in the workspace under the task's budget, and journal it."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

from harness.errors import Refusal
from harness.evidence.fsutil import atomic_write, ensure_private_dir
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.tree import TreeEntry, diff_trees, scan_tree, tree_signature
from harness.proctor.gate import Gate, check_pin, gated
from harness.proctor.lanes import choose_lane
from harness.proctor.state import NESTED_ENV, refuse_nested
from harness.proctor.task import Task
from harness.workers.process import run_group

__all__ = ["check_preflight", "dispatch"]


def check_preflight(task: Task, now: float) -> list[dict[str, Any]]:
    """A production task needs named preflight receipts, each newer than `max_preflight_age_s`."""
    if not task.preflight_receipts:
        raise Refusal("preflight_receipt_required", "a production task must name preflight_receipts", task.path)
    checked = []
    for name in task.preflight_receipts:
        path = os.path.join(task.folder, name)
        data = read_bytes(path)  # missing, dangling or special: a named refusal
        age = now - os.stat(path).st_mtime
        if age > task.budget.max_preflight_age_s:
            raise Refusal(
                "preflight_receipt_stale",
                f"{age:.0f}s old, limit {task.budget.max_preflight_age_s:.0f}s",
                path,
            )
        checked.append({"path": path, "sha256": sha256_hex(data), "age_s": round(age, 3)})
    return checked


def _state_entries(gate: Gate, dispatch_id: str) -> dict[bytes, TreeEntry]:
    """The state folder as the worker must leave it: all but its own dispatch folder and the lock."""
    return scan_tree(gate.state.root, (f"/dispatches/{dispatch_id}", "/invocation.lock"))


def _state_changes(gate: Gate, dispatch_id: str, before: dict[bytes, TreeEntry]) -> list[str]:
    """Absolute paths in the state folder that the worker added, removed or changed.

    The worker runs as the same user and can find the state folder next to the
    workspace; a valid-looking chained journal line or a rewritten pin would
    otherwise be trusted by every later command.
    """
    try:
        diff = diff_trees(before, _state_entries(gate, dispatch_id))
    except Refusal as exc:  # e.g. a folder made unreadable
        return [exc.path or gate.state.root]
    paths = sorted({*diff.added, *diff.removed, *diff.changed})
    return [os.path.join(gate.state.root, os.fsdecode(p)) for p in paths]


def _worker_env(gate: Gate, dispatch_id: str, prompt_file: str, heartbeat: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env.update(
        {
            NESTED_ENV: "1",
            "PROCTOR_TASK_ID": gate.task.task_id,
            "PROCTOR_DISPATCH_ID": dispatch_id,
            "PROCTOR_PROMPT_FILE": prompt_file,
            "PROCTOR_HEARTBEAT": heartbeat,
        }
    )
    return env


def dispatch(
    workspace: str, task_path: str, argv: Sequence[str], state_dir: str | None = None
) -> dict[str, Any]:
    """Run `argv` as the worker in the workspace; returns the dispatch's end record."""
    refuse_nested("dispatch")
    if not argv:
        raise Refusal("worker_command_missing", "give the worker's argv after --command --")
    with gated(workspace, task_path, state_dir) as gate, gate.journaling_refusals("dispatch"):
        check_pin(gate.task, gate.pin)
        budget = gate.task.budget
        started = [e for e in gate.events if e["event"] == "dispatch_start"]
        if len(started) >= budget.max_dispatches:
            raise Refusal(
                "dispatch_budget_exhausted",
                f"{len(started)} of {budget.max_dispatches} dispatches used",
                gate.task.path,
            )
        lane = choose_lane(gate.task)
        preflight: list[dict[str, Any]] = []
        if lane.production:
            if lane.lane == "flash" and not lane.explicit:
                raise Refusal(
                    "flash_lane_refused_for_production",
                    f"the task names {', '.join(lane.production_entrypoints)}; give an explicit lane and reason",
                    gate.task.path,
                )
            preflight = check_preflight(gate.task, time.time())
        seq = len(started) + 1
        dispatch_id = f"d{seq:03d}-{secrets.token_hex(4)}"
        folder = ensure_private_dir(gate.state.path("dispatches", dispatch_id))
        prompt_file = os.path.join(folder, "prompt.md")
        prompt = gate.task.prompt.encode("utf-8")
        atomic_write(prompt_file, prompt)
        heartbeat = os.path.join(folder, "heartbeat.json")
        output = os.path.join(folder, "output.log")
        gate.record(
            "dispatch_start",
            dispatch_id=dispatch_id,
            seq=seq,
            argv=list(argv),
            lane=lane.lane,
            proctor_pid=os.getpid(),
            prompt_sha256=sha256_hex(prompt),
            heartbeat=heartbeat,
            timeout_s=budget.timeout_s,
            preflight=preflight,
        )
        watched = _state_entries(gate, dispatch_id)
        try:
            result = run_group(
                argv,
                cwd=gate.workspace,
                env=_worker_env(gate, dispatch_id, prompt_file, heartbeat),
                timeout_s=budget.timeout_s,
                output_path=output,
            )
        except OSError as exc:
            gate.record("dispatch_end", dispatch_id=dispatch_id, seq=seq, spawn_error=str(exc), detached_pids=[])
            raise Refusal("worker_spawn_failed", f"cannot start the worker: {exc.strerror or exc}", argv[0]) from None
        tampered = _state_changes(gate, dispatch_id, watched)
        tree = tree_signature(gate.workspace)
        gate.record(
            "dispatch_end",
            dispatch_id=dispatch_id,
            seq=seq,
            output_sha256=sha256_hex(read_bytes(output)),
            tree_after=tree.digest,
            **result.to_json(),
        )
        if tampered:
            gate.record("state_tampered", dispatch_id=dispatch_id, paths=tampered)
            raise Refusal(
                "state_tampered",
                f"the worker changed the proctor's state folder: {', '.join(tampered)}",
                tampered[0],
                paths=tampered,
            )
    return {
        "ok": result.exit_code == 0 and not result.timed_out,
        "dispatch_id": dispatch_id,
        "seq": seq,
        "lane": lane.lane,
        "output_file": output,
        "tree_after": tree.to_json(),
        **result.to_json(),
    }
