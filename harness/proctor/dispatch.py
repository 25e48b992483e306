"""`proctor dispatch`: run one worker in the workspace under the task's budget, and journal it."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from harness.catalog import (
    Catalog,
    CatalogModel,
    cheapest_in_lane,
    load_catalog,
    resolve_model,
    worker_env,
)
from harness.errors import Refusal
from harness.evidence.fsutil import atomic_write, ensure_private_dir
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.tree import TreeEntry, diff_trees, scan_tree, tree_signature
from harness.proctor.escalation import (
    LATERAL,
    EscalationState,
    escalation_state,
    evidence_packet,
    is_provider_failure,
    render_evidence,
)
from harness.proctor.gate import Gate, check_pin, gated
from harness.proctor.lanes import choose_lane
from harness.proctor.state import NESTED_ENV, refuse_nested
from harness.proctor.task import Task
from harness.workers.process import run_group

__all__ = ["AUTO_MODEL", "check_preflight", "dispatch", "metering_proxy"]

AUTO_MODEL = "auto"
"""`--model auto`: the cheapest catalog model of the current lane."""


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
            "PROCTOR_SCOPE": json.dumps(list(gate.task.scope)),
        }
    )
    return env


@contextmanager
def metering_proxy(upstream: str, out: str, name: str) -> Iterator[dict[str, Any]]:
    """Run the metering proxy in front of `upstream` for the block.

    Yields a dict: `base_url` (what the worker must use), `wire_log` (the
    chained wire log `out`, seed `proctor-wire:<name>`) and, once the block
    has ended, `proxy` (the proxy's summary: exchanges recorded, failures).
    """
    from harness.meter.proxy import start_proxy

    proxy = start_proxy(upstream, out, port=0, name=name)
    metering: dict[str, Any] = {"base_url": proxy.url, "wire_log": out, "wire_name": name}
    try:
        yield metering
    finally:
        metering["proxy"] = proxy.close()


def _wire_end(metering: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The wire log as the proxy wrote it, and why the file differs from that (None when it does not).

    `lines` and `head` are the proxy's in-memory tally of the lines it appended
    and the sha256 of its last one, never read back from the file: the log
    lives in the dispatch folder, which the worker (the same user) can write
    while it runs, so a worker could append or rewrite correctly chained
    records. `interleaved` counts the proxy's appends that found a line it had
    not written at the end of the log. `file_lines`, `file_head` and `problem`
    are what the file verifies to now. `proctor record` later requires the file
    to end at the same `lines` and `head`.
    """
    from harness.evidence.chain import verify_log
    from harness.meter.wire import wire_seed

    path = metering["wire_log"]
    summary = metering["proxy"]
    lines, head, interleaved = summary["wire_lines"], summary["wire_head"], summary["wire_interleaved"]
    out: dict[str, Any] = {
        "path": path,
        "exchanges": summary.get("exchanges"),
        "record_failures": summary.get("record_failures"),
        "lines": lines,
        "head": head,
        "interleaved": interleaved,
    }
    file_lines: int | None = 0
    file_head: str | None = None
    problem: dict[str, Any] | None = None
    if os.path.lexists(path):
        try:
            status = verify_log(path, wire_seed(metering["wire_name"]))
        except Refusal as exc:  # replaced by a folder, a FIFO, a dangling link
            file_lines, problem = None, {"kind": exc.code, "message": exc.message}
        else:
            file_lines, file_head = status.lines, (status.head if status.lines else None)
            problem = None if status.problem is None else status.problem.to_json()
    out.update(file_lines=file_lines, file_head=file_head, problem=problem)
    why: str | None = None
    if problem is not None:
        why = f"it does not verify: {problem['message']}"
    elif (file_lines, file_head) != (lines, head):
        why = (
            f"it holds {file_lines} line(s) ending in {str(file_head)[:16]}, "
            f"the proxy wrote {lines} ending in {str(head)[:16]}"
        )
    elif interleaved:
        why = f"{interleaved} of the proxy's appends found a line it had not written at the end of the log"
    return out, why


@dataclass(frozen=True)
class _ModelChoice:
    model: CatalogModel
    catalog: Catalog
    record: dict[str, Any]


def _choose_model(
    name: str, lane: str, esc: EscalationState, catalog_path: str | None, pricing_path: str | None
) -> _ModelChoice:
    """The catalog model for `--model ID` or `--model auto` (the cheapest of the lane)."""
    catalog = load_catalog(catalog_path)
    if name != AUTO_MODEL:
        named = resolve_model(catalog, name)
        if named.worker is None:
            raise Refusal("model_has_no_worker", f"{named.id!r} has no [model.worker] argv in the catalog", catalog.path)
        return _ModelChoice(named, catalog, {"mode": "explicit", "model_lane": named.lane})
    from harness.meter.pricing import load_pricing

    pricing = load_pricing(pricing_path)
    excluded = esc.excluded_providers(lane)
    model, considered = cheapest_in_lane(catalog, lane, pricing, excluded)
    if model is None:
        raise Refusal(
            "no_model_for_lane",
            f"no catalog model with a worker in lane {lane!r}"
            + (f" outside the failed providers {', '.join(excluded)}" if excluded else ""),
            catalog.path,
            lane=lane,
            excluded_providers=list(excluded),
            considered=considered,
        )
    record = {
        "mode": "auto",
        "lane": lane,
        "by": "lowest output price (unpriced last)",
        "pricing": {"path": pricing.path, "sha256": pricing.sha256},
        "excluded_providers": list(excluded),
        "considered": considered,
    }
    return _ModelChoice(model, catalog, record)


def _provider_switch(
    esc: EscalationState, started: list[dict[str, Any]], lane: str, choice: _ModelChoice | None
) -> dict[str, Any] | None:
    """When the last dispatch failed for provider reasons and auto picked another provider: why."""
    if choice is None or choice.record.get("mode") != "auto" or not started or not esc.provider_failures:
        return None
    last = esc.provider_failures[-1]
    if last["dispatch_id"] != started[-1]["dispatch_id"] or last["lane"] != lane:
        return None
    if last["provider"] == choice.model.provider:
        return None
    return {
        "from_provider": last["provider"],
        "to_provider": choice.model.provider,
        "model": choice.model.id,
        "lane": lane,
        "reason": f"provider failure in dispatch {last['dispatch_id']} ({last['why']}): same lane, another provider",
    }


def _next_lane(gate: Gate, esc: EscalationState) -> str:
    """The lane of the next dispatch: lateral on stagnation, within `max_stagnant` switches."""
    if not esc.stagnant:
        return esc.lane
    budget = gate.task.budget
    if len(esc.switches) >= budget.max_stagnant:
        raise Refusal(
            "stagnation_limit_reached",
            f"{esc.stagnant_count} identical failures in lane {esc.lane} after {len(esc.switches)} "
            f"lane switch(es); max_stagnant is {budget.max_stagnant}",
            gate.task.path,
            lane=esc.lane,
            fingerprint=esc.stagnant_fingerprint,
        )
    return LATERAL[esc.lane]


def _lane_switch(gate: Gate, esc: EscalationState, dispatch_id: str, folder: str) -> tuple[dict[str, Any], str] | None:
    """On stagnation: the lane switch record (not yet journaled) and the evidence packet as prompt text."""
    if not esc.stagnant:
        return None
    to = LATERAL[esc.lane]
    receipts = [c["receipt_id"] for c in esc.counted[-esc.stagnant_count :]]
    reason = (
        f"stagnation: the last {esc.stagnant_count} verifications after dispatches in lane {esc.lane} "
        f"({', '.join(receipts)}) failed with the same fingerprint {str(esc.stagnant_fingerprint)[:16]}"
    )
    packet = evidence_packet(gate, esc, to, reason, dispatch_id)
    path = os.path.join(folder, "evidence.json")
    data = canonical_bytes(packet)
    atomic_write(path, data)
    switch = {
        "from": esc.lane,
        "to": to,
        "reason": reason,
        "fingerprint": esc.stagnant_fingerprint,
        "stagnant_count": esc.stagnant_count,
        "receipt_ids": receipts,
        "dispatch_id": dispatch_id,
        "evidence_file": path,
        "evidence_sha256": sha256_hex(data),
    }
    return switch, render_evidence(packet, path)


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
    gate.record("state_tampered", dispatch_id=dispatch_id, **details)
    raise Refusal("state_tampered", "; ".join(reasons), paths[0], **details)


def dispatch(
    workspace: str,
    task_path: str,
    argv: Sequence[str] | None = None,
    state_dir: str | None = None,
    *,
    model: str | None = None,
    catalog_path: str | None = None,
    pricing_path: str | None = None,
) -> dict[str, Any]:
    """Run the worker in the workspace: `argv`, or the catalog worker of `model` (an id or "auto").

    Returns the dispatch's end record. On stagnation the lane switches first
    and the worker gets an evidence packet (`harness.proctor.escalation`).
    """
    refuse_nested("dispatch")
    if model is not None and argv:
        raise Refusal("worker_choice_conflict", "give either --model or --command, not both")
    if model is None and not argv:
        raise Refusal("worker_command_missing", "give --model ID|auto, or the worker's argv after --command --")
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
        decision = choose_lane(gate.task)
        preflight: list[dict[str, Any]] = []
        if decision.production:
            if decision.lane == "flash" and not decision.explicit:
                raise Refusal(
                    "flash_lane_refused_for_production",
                    f"the task names {', '.join(decision.production_entrypoints)}; give an explicit lane and reason",
                    gate.task.path,
                )
            preflight = check_preflight(gate.task, time.time())
        esc = escalation_state(gate.pin["lane"]["lane"], gate.events)
        lane = _next_lane(gate, esc)
        choice = None if model is None else _choose_model(model, lane, esc, catalog_path, pricing_path)
        seq = len(started) + 1
        dispatch_id = f"d{seq:03d}-{secrets.token_hex(4)}"
        folder = ensure_private_dir(gate.state.path("dispatches", dispatch_id))
        switch = _lane_switch(gate, esc, dispatch_id, folder)
        prompt_file = os.path.join(folder, "prompt.md")
        prompt = gate.task.prompt.encode("utf-8")
        if switch:
            prompt += switch[1].encode("utf-8")
        atomic_write(prompt_file, prompt)
        heartbeat = os.path.join(folder, "heartbeat.json")
        output = os.path.join(folder, "output.log")
        env = _worker_env(gate, dispatch_id, prompt_file, heartbeat)
        if switch:
            env["PROCTOR_EVIDENCE_FILE"] = switch[0]["evidence_file"]
        if choice is not None:
            assert choice.model.worker is not None
            argv = choice.model.worker.render(
                model=choice.model.id, workspace=gate.workspace, prompt_file=prompt_file, python=sys.executable
            )
            upstream = choice.model.effective_base_url()
            wire_name = f"{gate.task.task_id}/{dispatch_id}"
            proxied: AbstractContextManager[dict[str, Any]] = metering_proxy(
                upstream, os.path.join(folder, "wire.jsonl"), wire_name
            )
        else:
            proxied = nullcontext({})
        assert argv is not None
        with proxied as metering:
            model_fields: dict[str, Any] = {}
            if choice is not None:
                env.update(worker_env(choice.model, choice.catalog, metering["base_url"]))
                model_fields = {
                    "model": choice.model.id,
                    "api_model": choice.model.api_model,
                    "provider": choice.model.provider,
                    "api_shape": choice.model.api_shape,
                    "pricing_key": choice.model.pricing_key,
                    "model_choice": choice.record,
                    "catalog": {"path": choice.catalog.path, "sha256": choice.catalog.sha256},
                    "upstream": upstream,
                    "metering": "proxy",
                    "wire_log": metering["wire_log"],
                    "wire_name": metering["wire_name"],
                }
            if switch:
                gate.record("lane_switch", **switch[0])
            provider_switch = _provider_switch(esc, started, lane, choice)
            if provider_switch:
                gate.record("provider_switch", dispatch_id=dispatch_id, **provider_switch)
            gate.record(
                "dispatch_start",
                dispatch_id=dispatch_id,
                seq=seq,
                argv=list(argv),
                lane=lane,
                proctor_pid=os.getpid(),
                prompt_sha256=sha256_hex(prompt),
                heartbeat=heartbeat,
                timeout_s=budget.timeout_s,
                preflight=preflight,
                evidence_file=switch[0]["evidence_file"] if switch else None,
                **model_fields,
            )
            watched = _state_entries(gate, dispatch_id)
            try:
                result = run_group(
                    argv,
                    cwd=gate.workspace,
                    env=env,
                    timeout_s=budget.timeout_s,
                    output_path=output,
                )
            except OSError as exc:
                gate.record("dispatch_end", dispatch_id=dispatch_id, seq=seq, spawn_error=str(exc), detached_pids=[])
                raise Refusal("worker_spawn_failed", f"cannot start the worker: {exc.strerror or exc}", argv[0]) from None
        tampered = _state_changes(gate, dispatch_id, watched)
        wire, wire_forged = _wire_end(metering) if "proxy" in metering else (None, None)
        tree = tree_signature(gate.workspace)
        end = {"exit_code": result.exit_code, "timed_out": result.timed_out}
        gate.record(
            "dispatch_end",
            dispatch_id=dispatch_id,
            seq=seq,
            output_sha256=sha256_hex(read_bytes(output)),
            tree_after=tree.digest,
            provider_failure=is_provider_failure(end),
            **({"wire": wire} if wire is not None else {}),
            **result.to_json(),
        )
        if tampered or wire_forged:
            _refuse_tampering(gate, dispatch_id, tampered, wire, wire_forged)
    return {
        "ok": result.exit_code == 0 and not result.timed_out,
        "dispatch_id": dispatch_id,
        "seq": seq,
        "lane": lane,
        "lane_switch": switch[0] if switch else None,
        "model": model_fields.get("model"),
        "wire_log": model_fields.get("wire_log"),
        "provider_failure": is_provider_failure(end),
        "output_file": output,
        "tree_after": tree.to_json(),
        **result.to_json(),
    }
