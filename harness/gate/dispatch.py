"""`proctor dispatch`: run one worker in the workspace under the task's budget, and journal it.

The manual: docs/gated-path.md; what its sandbox holds: docs/sandbox.md.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, MeterRefusal, ProviderRefusal, Refusal, WorkerRefusal
from harness.evidence.fsutil import atomic_write, cap_output, ensure_private_dir
from harness.evidence.git import git_dir_snapshot, snapshot_changes
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.tree import scan_tree, tree_signature
from harness.evidence.tree_entry import TreeEntry, TreeSignature, diff_trees
from harness.gate.choice import (
    AUTO_MODEL,
    ModelChoice,
    choose_model,
    lane_switch,
    next_lane,
    provider_switch,
)
from harness.gate.decision import SwitchDecision, decide_next, dispatch_history
from harness.gate.escalation import EscalationState, escalation_state, is_provider_failure
from harness.gate.evidence import render_repair, repair_packet
from harness.gate.lanes import choose_lane
from harness.gate.metering import metering_proxy, socket_base_url, wire_end
from harness.gate.state import NESTED_ENV, refuse_nested
from harness.gate.task import Task
from harness.gate.workspace import Gate, check_pin, gated, withheld_paths
from harness.meter.allowance import Allowance
from harness.records.journal import (
    DispatchEnd,
    DispatchStart,
    LaneSwitch,
    StateTampered,
    TargetedRepair,
)
from harness.workers.arm import ArmWorker
from harness.workers.limits import resolve_limits
from harness.workers.llm_edit import TESTS_ARGV_ENV
from harness.workers.process import ProcessResult, WorkerOutcome, run_group
from harness.workers.sandbox import (
    IN_SANDBOX,
    PROXY_SOCKET_ENV,
    View,
    find_program,
    named_paths,
    resolve_sandbox,
    sandbox_env,
)

__all__ = ["DispatchResult", "check_preflight", "dispatch"]


def check_preflight(task: Task, now: float) -> list[dict[str, Any]]:
    """A production task needs named preflight receipts, each newer than `max_preflight_age_s`."""
    if not task.preflight_receipts:
        raise GateRefusal(Code.PREFLIGHT_RECEIPT_REQUIRED, "a production task must name preflight_receipts", task.path)
    checked = []
    for name in task.preflight_receipts:
        path = os.path.join(task.folder, name)
        data = read_bytes(path)  # missing, dangling or special: a named refusal
        age = now - os.stat(path).st_mtime
        if age > task.budget.max_preflight_age_s:
            raise GateRefusal(
                Code.PREFLIGHT_RECEIPT_STALE,
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


def _read_end(gate: Gate, output: str) -> tuple[TreeSignature | Refusal, str | None, int | None, int | None, str | None]:
    """The tree the worker left (or the refusal scanning it), the output's sha256, bytes kept, bytes cut from, why not.

    Never raises a refusal: the dispatch's end is journaled whatever the worker left.
    """
    errors: list[str] = []
    tree: TreeSignature | Refusal
    try:
        tree = tree_signature(gate.workspace)
    except Refusal as exc:
        tree = exc
        errors.append(f"tree: {exc.code}: {exc.message} ({exc.path})")
    try:
        kept, cut = cap_output(output)
        digest: str | None = sha256_hex(read_bytes(output))
    except (OSError, Refusal) as exc:
        kept, cut, digest = None, None, None
        errors.append(f"output: {exc}")
    return tree, digest, kept, cut, "; ".join(errors) or None


def _worker_vars(gate: Gate, dispatch_id: str, prompt_file: str, heartbeat: str) -> dict[str, str]:
    """The PROCTOR_* variables a worker is given (paths as the worker sees them)."""
    return {
        NESTED_ENV: "1",
        "PROCTOR_TASK_ID": gate.task.task_id,
        "PROCTOR_DISPATCH_ID": dispatch_id,
        "PROCTOR_PROMPT_FILE": prompt_file,
        "PROCTOR_HEARTBEAT": heartbeat,
        "PROCTOR_SCOPE": json.dumps(list(gate.task.scope)),
    }


def _refuse_tampering(
    gate: Gate, dispatch_id: str, changed: list[str], wire: dict[str, Any] | None, wire_forged: str | None
) -> None:
    """Journal `state_tampered` and refuse: the worker changed the state folder or its wire log."""
    reasons = []
    paths = list(changed)
    if wire is not None and wire_forged is not None:
        reasons.append(f"the wire log {wire['path']} is not what the metering proxy wrote: {wire_forged}")
        paths.insert(0, wire["path"])
    if changed:
        reasons.append(f"the worker changed the proctor's state folder: {', '.join(changed)}")
    details: dict[str, Any] = {"paths": paths}
    if wire_forged is not None:
        details["wire_log"] = wire_forged
    gate.record(StateTampered(dispatch_id=dispatch_id, paths=tuple(paths), wire_log=wire_forged))
    raise GateRefusal(Code.STATE_TAMPERED, "; ".join(reasons), paths[0], **details)


def _choose(
    model: str, lane: str, esc: EscalationState, switching: SwitchDecision, catalog_path: str | None, pricing_path: str | None
) -> ModelChoice:
    """The catalog model; a targeted repair under `--model auto` runs the repaired dispatch's model again."""
    if model == AUTO_MODEL and switching.switch_class == "localized_defect" and switching.model:
        named = choose_model(switching.model, lane, esc, catalog_path, pricing_path)
        return ModelChoice(named.model, named.catalog, {"mode": "targeted_repair", "lane": lane,
                                                        "model_lane": named.model.lane})  # fmt: skip
    return choose_model(model, lane, esc, catalog_path, pricing_path)


def _targeted_repair(
    gate: Gate, switching: SwitchDecision, dispatch_id: str, folder: str, shown_dir: str, model: str | None
) -> tuple[TargetedRepair, str]:
    """The targeted-repair event (not yet journaled) and its packet as prompt text (harness.gate.evidence);
    `model`: the catalog model that runs it (None: a `--command` worker)."""
    packet = repair_packet(gate, switching, dispatch_id)
    path = os.path.join(folder, "evidence.json")
    data = canonical_bytes(packet)
    atomic_write(path, data)
    event = TargetedRepair(
        dispatch_id=dispatch_id,
        lane=switching.lane,
        model=model,
        reason=switching.reason,
        receipt_id=switching.receipt_id,
        fingerprint=switching.fingerprint,
        failing_tests=switching.failing_tests,
        tests_expected=switching.tests_expected,
        repair=switching.targeted_repairs,
        evidence_file=path,
        evidence_sha256=sha256_hex(data),
    )
    return event, render_repair(packet, os.path.join(shown_dir, "evidence.json"))


@dataclass(frozen=True)
class DispatchResult(WorkerOutcome):
    """How one dispatch ended: its id, lane, model, the worker's exit, the tree it left, its sandbox."""

    dispatch_id: str
    seq: int
    lane: str
    lane_switch: LaneSwitch | None
    model: str | None
    wire_log: str | None
    provider_failure: bool
    output_file: str
    tree_after: TreeSignature
    sandbox: dict[str, Any]
    process: ProcessResult
    budget_stop: bool = False
    """The metering proxy answered a request of this run with a budget stop: the attempt ends `budget_stop`."""
    worker: ArmWorker | None = None
    targeted_repair: TargetedRepair | None = None
    """A localized defect after broad success: this dispatch repairs it (docs/models.md, `harness/gate/decision.py`)."""

    def to_json(self) -> dict[str, Any]:
        return self.outcome_json({
            "dispatch_id": self.dispatch_id,
            "seq": self.seq,
            "lane": self.lane,
            "lane_switch": None if self.lane_switch is None else self.lane_switch.fields(),
            "model": self.model,
            "wire_log": self.wire_log,
            "provider_failure": self.provider_failure,
            "output_file": self.output_file,
            "tree_after": self.tree_after.to_json(),
            "sandbox": self.sandbox,
            "budget_stop": self.budget_stop,
            "worker": None if self.worker is None else self.worker.to_json(),
            "targeted_repair": None if self.targeted_repair is None else self.targeted_repair.fields(),
        })


def dispatch(
    workspace: str,
    task_path: str,
    argv: Sequence[str] | None = None,
    state_dir: str | None = None,
    *,
    model: str | None = None,
    catalog_path: str | None = None,
    pricing_path: str | None = None,
    sandbox: str | None = None,
    worker: ArmWorker | None = None,
    allowance: Allowance | None = None,
    upstream_url: str | None = None,
    timeout_s: float | None = None,
    prompt_text: str | None = None,
) -> DispatchResult:
    """Run the worker in the workspace: `argv`, or the catalog worker of `model` (an id or "auto").

    Returns the dispatch's end record. On stagnation the lane switches first
    and the worker gets an evidence packet (`harness.gate.escalation`).
    `sandbox`: "bwrap" or "none" (default: `PROCTOR_SANDBOX`, else bwrap).
    `worker`: an arm's worker run on `model` instead of the catalog's (docs/gated-path.md, "Agent arms");
    `allowance`: what the attempt may still spend through the metering proxy ("Budgets inside an attempt").
    The study runner's seams (a repository-task attempt, docs/run.md): `upstream_url` replaces the
    model's base URL behind the metering proxy, `timeout_s` shortens the task's `timeout_s` (the
    attempt's deadline), `prompt_text` replaces the task's prompt (the plan's prompt for the arm).
    """
    refuse_nested("dispatch")
    if model is not None and argv:
        raise ProviderRefusal(Code.WORKER_CHOICE_CONFLICT, "give either --model or --command, not both")
    if worker is not None and (model is None or not isinstance(worker, ArmWorker)):
        raise WorkerRefusal(Code.ARM_WORKER_INVALID, "an arm's worker is an ArmWorker run on a model (--model)")
    if allowance is not None and (model is None or not isinstance(allowance, Allowance)):
        raise MeterRefusal(Code.ALLOWANCE_INVALID, "an allowance is an Allowance for a model's metering proxy")
    if model is None and not argv:
        raise GateRefusal(Code.WORKER_COMMAND_MISSING, "give --model ID|auto, or the worker's argv after --command --")
    with gated(workspace, task_path, state_dir) as gate, gate.journaling_refusals("dispatch"):
        check_pin(gate.task, gate.pin)
        box = resolve_sandbox(sandbox)
        budget = gate.task.budget
        deadline_s = budget.timeout_s if timeout_s is None else min(budget.timeout_s, timeout_s)
        started = [e for e in gate.events if e["event"] == "dispatch_start"]
        if len(started) >= budget.max_dispatches:
            raise GateRefusal(
                Code.DISPATCH_BUDGET_EXHAUSTED,
                f"{len(started)} of {budget.max_dispatches} dispatches used",
                gate.task.path,
            )
        decision = choose_lane(gate.task)
        preflight: list[dict[str, Any]] = []
        if decision.production:
            if decision.lane == "flash" and not decision.explicit:
                raise GateRefusal(
                    Code.FLASH_LANE_REFUSED_FOR_PRODUCTION,
                    f"the task names {', '.join(decision.production_entrypoints)}; give an explicit lane and reason",
                    gate.task.path,
                )
            preflight = check_preflight(gate.task, time.time())
        esc = escalation_state(gate.pin["lane"]["lane"], gate.events)
        lane = next_lane(gate, esc)
        switching = decide_next(gate.pin["lane"]["lane"], dispatch_history(gate.events), budget.max_stagnant)
        repairing = switching.switch_class == "localized_defect"
        choice = None if model is None else _choose(model, lane, esc, switching, catalog_path, pricing_path)
        seq = len(started) + 1
        dispatch_id = f"d{seq:03d}-{secrets.token_hex(4)}"
        folder = ensure_private_dir(gate.state.path("dispatches", dispatch_id))
        sandboxed = box.kind == "bwrap"
        seen = IN_SANDBOX if sandboxed else folder  # where the worker finds what it is given
        switch = lane_switch(gate, esc, dispatch_id, folder, seen)
        repair = (
            _targeted_repair(gate, switching, dispatch_id, folder, seen, None if choice is None else choice.model.id)
            if repairing and not switch else None
        )
        prompt_file = os.path.join(folder, "prompt.md")
        prompt = (gate.task.prompt if prompt_text is None else prompt_text).encode("utf-8")
        if switch:
            prompt += switch[1].encode("utf-8")
        if repair:
            prompt += repair[1].encode("utf-8")
        atomic_write(prompt_file, prompt)
        beats = ensure_private_dir(os.path.join(folder, "heartbeat"))
        heartbeat = os.path.join(beats, "heartbeat.json")
        output = os.path.join(folder, "output.log")
        given = _worker_vars(
            gate, dispatch_id, os.path.join(seen, "prompt.md"), os.path.join(seen, "heartbeat", "heartbeat.json")
        )
        placed = [(prompt_file, os.path.join(IN_SANDBOX, "prompt.md"))]
        evidence_file = switch[0].evidence_file if switch else repair[0].evidence_file if repair else None
        if evidence_file:
            given["PROCTOR_EVIDENCE_FILE"] = os.path.join(seen, "evidence.json")
            placed.append((evidence_file, os.path.join(IN_SANDBOX, "evidence.json")))
        network = "none"
        if choice is not None:
            assert choice.model.worker is not None
            if worker is None:
                argv = choice.model.worker.render(
                    model=choice.model.id, workspace=gate.workspace, prompt_file=given["PROCTOR_PROMPT_FILE"],
                    python=sys.executable,
                )
            network = "proxy" if worker is not None or allowance is not None else choice.model.worker.network
            upstream = upstream_url or choice.model.effective_base_url()
            wire_name = f"{gate.task.task_id}/{dispatch_id}"
            proxied: AbstractContextManager[dict[str, Any]] = (
                metering_proxy(upstream, os.path.join(folder, "wire.jsonl"), wire_name, unix=sandboxed,
                               allowance=allowance)
                if network == "proxy" else nullcontext({})
            )
        else:
            proxied = nullcontext({})
        with proxied as metering:
            model_fields: dict[str, Any] = {}
            if choice is not None:
                from harness.providers.catalog import worker_env

                base_url = socket_base_url(metering["base_url"]) if metering.get("socket") else metering.get("base_url", upstream)
                given.update(worker_env(choice.model, choice.catalog, base_url))
                if metering.get("socket"):
                    given[PROXY_SOCKET_ENV] = os.path.join(IN_SANDBOX, "proxy", "proxy.sock")
                    placed.append((os.path.dirname(metering["socket"]), os.path.join(IN_SANDBOX, "proxy")))
                if worker is not None:
                    argv = worker.render(model=choice.model.id, prompt_file=given["PROCTOR_PROMPT_FILE"],
                                         base_url=base_url, python=sys.executable, workspace=gate.workspace)
                    if worker.kind == "llm-edit" and worker.repair_turns:
                        given[TESTS_ARGV_ENV] = json.dumps(gate.pin["verifier_argv"])
                credential = choice.model.credential_env
                if sandboxed and credential and os.environ.get(credential):
                    given[credential] = os.environ[credential]  # what it would inherit without a sandbox
                model_fields = {
                    "model": choice.model.id,
                    "api_model": choice.model.api_model,
                    "provider": choice.model.provider,
                    "api_shape": choice.model.api_shape,
                    "pricing_key": choice.model.pricing_key,
                    "model_choice": choice.record,
                    "catalog": {"path": choice.catalog.path, "sha256": choice.catalog.sha256},
                    "upstream": upstream,
                    "metering": "proxy" if network == "proxy" else "none",
                    "worker_network": network,
                    "wire_log": metering.get("wire_log"),
                    "wire_name": metering.get("wire_name"),
                }
                if worker is not None:
                    model_fields["worker"] = worker.to_json()
                if allowance is not None:
                    model_fields["allowance"] = allowance.to_json()
            env = sandbox_env(os.environ, given, sandboxed=sandboxed)
            assert argv is not None
            program = find_program(argv[0], gate.workspace, env)
            readable = named_paths(argv, program)
            if choice is not None:
                readable += (choice.catalog.path,)
            view = View(
                cwd=gate.workspace, writable=(gate.workspace,), readable=readable, placed=tuple(placed),
                placed_writable=((beats, os.path.join(IN_SANDBOX, "heartbeat")),), withheld=withheld_paths(gate),
                read_only=(os.path.join(gate.workspace, ".git"),),
            )
            wrapped = box.wrap(argv, view, env, resolve_limits())
            if switch:
                gate.record(switch[0])
            if repair:
                gate.record(repair[0])
            changed_provider = provider_switch(esc, started, lane, choice, dispatch_id)
            if changed_provider:
                gate.record(changed_provider)
            gate.record(
                DispatchStart(
                    dispatch_id=dispatch_id,
                    seq=seq,
                    argv=tuple(argv),
                    lane=lane,
                    proctor_pid=os.getpid(),
                    prompt_sha256=sha256_hex(prompt),
                    heartbeat=heartbeat,
                    timeout_s=deadline_s,
                    preflight=tuple(preflight),
                    evidence_file=evidence_file,
                    sandbox=wrapped.record,
                    model=model_fields or None,
                )
            )
            watched = _state_entries(gate, dispatch_id)
            git_before = git_dir_snapshot(gate.workspace)
            try:
                if sandboxed and program is None:
                    raise FileNotFoundError(2, "No such file or directory", argv[0])
                result = run_group(
                    wrapped.argv,
                    cwd=gate.workspace,
                    env=env,
                    timeout_s=deadline_s,
                    output_path=output,
                    sandboxed=wrapped.sandboxed, limits=wrapped.limits,
                )
            except OSError as exc:
                gate.record(DispatchEnd(dispatch_id=dispatch_id, seq=seq, spawn_error=str(exc)))
                raise GateRefusal(Code.WORKER_SPAWN_FAILED, f"cannot start the worker: {exc.strerror or exc}", argv[0]) from None
        # The tamper and state checks first: nothing the worker left (a huge output, a
        # sparse file, a tree that cannot be read) may keep them from being journaled.
        tampered = _state_changes(gate, dispatch_id, watched)
        git_changed = snapshot_changes(git_before, git_dir_snapshot(gate.workspace))
        wire, wire_forged = wire_end(metering) if "proxy" in metering else (None, None)
        try:
            tree, output_sha256, kept, cut, end_error = _read_end(gate, output)
            end = {"exit_code": result.exit_code, "timed_out": result.timed_out}
            process = result.to_json()
            gate.record(
                DispatchEnd(
                    dispatch_id=dispatch_id,
                    seq=seq,
                    output_sha256=output_sha256,
                    tree_after=None if isinstance(tree, Refusal) else tree.digest,
                    provider_failure=is_provider_failure(end),
                    wire=wire,
                    detached_pids=tuple(process.pop("detached_pids")),
                    process=process,
                    output_bytes=kept,
                    output_truncated_from=cut,
                    end_error=end_error,
                )
            )
        finally:
            if tampered or wire_forged:
                _refuse_tampering(gate, dispatch_id, tampered, wire, wire_forged)
            if git_changed:
                raise GateRefusal(
                    Code.GIT_DIR_CHANGED,
                    f"the worker changed the workspace's .git ({len(git_changed)} paths); its config and hooks may "
                    "run code as you: inspect them before any git command here; this task can no longer be accepted",
                    git_changed[0],
                    paths=git_changed,
                )
        if isinstance(tree, Refusal):
            raise tree
    return DispatchResult(
        dispatch_id=dispatch_id,
        seq=seq,
        lane=lane,
        lane_switch=switch[0] if switch else None,
        targeted_repair=repair[0] if repair else None,
        model=model_fields.get("model"),
        wire_log=model_fields.get("wire_log"),
        provider_failure=is_provider_failure(end),
        output_file=output,
        tree_after=tree,
        sandbox=wrapped.record,
        process=result,
        budget_stop=bool(wire and wire.get("budget_stops")),
        worker=worker,
    )
