"""`proctor dispatch`: run one worker in the workspace under the task's budget, and journal it.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, ProviderRefusal, Refusal
from harness.evidence.fsutil import atomic_write, ensure_private_dir
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.tree import TreeEntry, diff_trees, scan_tree, tree_signature
from harness.gate.escalation import (
    LATERAL,
    EscalationState,
    escalation_state,
    evidence_packet,
    is_provider_failure,
    render_evidence,
)
from harness.gate.lanes import choose_lane
from harness.gate.state import NESTED_ENV, refuse_nested
from harness.gate.task import Task
from harness.gate.workspace import Gate, check_pin, gated
from harness.providers.catalog import (
    Catalog,
    CatalogModel,
    load_catalog,
    resolve_model,
    worker_env,
)
from harness.workers.process import run_group
from harness.workers.sandbox import (
    IN_SANDBOX,
    PROXY_SOCKET_ENV,
    View,
    find_program,
    named_paths,
    resolve_sandbox,
    sandbox_env,
)

__all__ = ["AUTO_MODEL", "check_preflight", "dispatch", "metering_proxy", "socket_base_url", "withheld_paths"]

AUTO_MODEL = "auto"
"""`--model auto`: the cheapest catalog model of the current lane."""


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


def withheld_paths(gate: Gate) -> tuple[str, ...]:
    """What a sandbox never shows, even beneath a path a worker names: the state folders and hidden inputs."""
    found = [gate.state.root, os.path.join(os.path.dirname(gate.workspace), ".runner-state")]
    if os.path.basename(os.path.dirname(gate.state.root)) == ".runner-state":
        found.append(os.path.dirname(gate.state.root))
    found += [os.path.realpath(os.path.join(gate.task.folder, h["from"])) for h in gate.pin["hidden"]]
    return tuple(dict.fromkeys(found))


@contextmanager
def metering_proxy(upstream: str, out: str, name: str, *, unix: bool = False) -> Iterator[dict[str, Any]]:
    """Run the metering proxy in front of `upstream` for the block.

    Yields a dict: `base_url` (what the worker must use), `wire_log` (the
    chained wire log `out`, seed `proctor-wire:<name>`), with `unix` the
    `socket` it also listens on (in a private folder, removed afterwards)
    and, once the block has ended, `proxy` (the proxy's summary: exchanges
    recorded, failures).
    """
    from harness.meter.proxy import start_proxy

    folder = tempfile.mkdtemp(prefix="proctor-proxy-") if unix else None
    try:
        sock = os.path.join(folder, "proxy.sock") if folder is not None else None
        proxy = start_proxy(upstream, out, port=0, name=name, unix_socket=sock)
        metering: dict[str, Any] = {"base_url": proxy.url, "wire_log": out, "wire_name": name, "socket": sock}
        try:
            yield metering
        finally:
            metering["proxy"] = proxy.close()
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def socket_base_url(proxy_url: str) -> str:
    """The base URL a worker uses over the proxy's Unix socket: the host is ignored, the path kept."""
    from urllib.parse import urlsplit

    return "http://localhost" + urlsplit(proxy_url).path


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
            raise ProviderRefusal(Code.MODEL_HAS_NO_WORKER, f"{named.id!r} has no [model.worker] argv in the catalog", catalog.path)
        return _ModelChoice(named, catalog, {"mode": "explicit", "model_lane": named.lane})
    from harness.meter.priced_catalog import cheapest_in_lane
    from harness.meter.pricing import load_pricing

    pricing = load_pricing(pricing_path)
    excluded = esc.excluded_providers(lane)
    model, considered = cheapest_in_lane(catalog, lane, pricing, excluded)
    if model is None:
        raise ProviderRefusal(
            Code.NO_MODEL_FOR_LANE,
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
        raise ProviderRefusal(
            Code.STAGNATION_LIMIT_REACHED,
            f"{esc.stagnant_count} identical failures in lane {esc.lane} after {len(esc.switches)} "
            f"lane switch(es); max_stagnant is {budget.max_stagnant}",
            gate.task.path,
            lane=esc.lane,
            fingerprint=esc.stagnant_fingerprint,
        )
    return LATERAL[esc.lane]


def _lane_switch(
    gate: Gate, esc: EscalationState, dispatch_id: str, folder: str, shown_dir: str
) -> tuple[dict[str, Any], str] | None:
    """On stagnation: the lane switch record (not yet journaled) and the evidence packet as prompt text
    (naming the packet where the worker sees it, in `shown_dir`)."""
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
    return switch, render_evidence(packet, os.path.join(shown_dir, "evidence.json"))


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
    raise GateRefusal(Code.STATE_TAMPERED, "; ".join(reasons), paths[0], **details)


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
) -> dict[str, Any]:
    """Run the worker in the workspace: `argv`, or the catalog worker of `model` (an id or "auto").

    Returns the dispatch's end record. On stagnation the lane switches first
    and the worker gets an evidence packet (`harness.gate.escalation`).
    `sandbox`: "bwrap" or "none" (default: `PROCTOR_SANDBOX`, else bwrap).
    """
    refuse_nested("dispatch")
    if model is not None and argv:
        raise ProviderRefusal(Code.WORKER_CHOICE_CONFLICT, "give either --model or --command, not both")
    if model is None and not argv:
        raise GateRefusal(Code.WORKER_COMMAND_MISSING, "give --model ID|auto, or the worker's argv after --command --")
    with gated(workspace, task_path, state_dir) as gate, gate.journaling_refusals("dispatch"):
        check_pin(gate.task, gate.pin)
        box = resolve_sandbox(sandbox)
        budget = gate.task.budget
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
        lane = _next_lane(gate, esc)
        choice = None if model is None else _choose_model(model, lane, esc, catalog_path, pricing_path)
        seq = len(started) + 1
        dispatch_id = f"d{seq:03d}-{secrets.token_hex(4)}"
        folder = ensure_private_dir(gate.state.path("dispatches", dispatch_id))
        sandboxed = box.kind == "bwrap"
        seen = IN_SANDBOX if sandboxed else folder  # where the worker finds what it is given
        switch = _lane_switch(gate, esc, dispatch_id, folder, seen)
        prompt_file = os.path.join(folder, "prompt.md")
        prompt = gate.task.prompt.encode("utf-8")
        if switch:
            prompt += switch[1].encode("utf-8")
        atomic_write(prompt_file, prompt)
        beats = ensure_private_dir(os.path.join(folder, "heartbeat"))
        heartbeat = os.path.join(beats, "heartbeat.json")
        output = os.path.join(folder, "output.log")
        given = _worker_vars(
            gate, dispatch_id, os.path.join(seen, "prompt.md"), os.path.join(seen, "heartbeat", "heartbeat.json")
        )
        placed = [(prompt_file, os.path.join(IN_SANDBOX, "prompt.md"))]
        if switch:
            given["PROCTOR_EVIDENCE_FILE"] = os.path.join(seen, "evidence.json")
            placed.append((switch[0]["evidence_file"], os.path.join(IN_SANDBOX, "evidence.json")))
        network = "none"
        if choice is not None:
            assert choice.model.worker is not None
            argv = choice.model.worker.render(
                model=choice.model.id, workspace=gate.workspace, prompt_file=given["PROCTOR_PROMPT_FILE"],
                python=sys.executable,
            )
            network = choice.model.worker.network
            upstream = choice.model.effective_base_url()
            wire_name = f"{gate.task.task_id}/{dispatch_id}"
            proxied: AbstractContextManager[dict[str, Any]] = (
                metering_proxy(upstream, os.path.join(folder, "wire.jsonl"), wire_name, unix=sandboxed)
                if network == "proxy" else nullcontext({})
            )
        else:
            proxied = nullcontext({})
        assert argv is not None
        with proxied as metering:
            model_fields: dict[str, Any] = {}
            if choice is not None:
                if metering.get("socket"):
                    given.update(worker_env(choice.model, choice.catalog, socket_base_url(metering["base_url"])))
                    given[PROXY_SOCKET_ENV] = os.path.join(IN_SANDBOX, "proxy", "proxy.sock")
                    placed.append((os.path.dirname(metering["socket"]), os.path.join(IN_SANDBOX, "proxy")))
                else:
                    given.update(worker_env(choice.model, choice.catalog, metering.get("base_url", upstream)))
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
            env = sandbox_env(os.environ, given, sandboxed=sandboxed)
            program = find_program(argv[0], gate.workspace, env)
            readable = named_paths(argv, program)
            if choice is not None:
                readable += (choice.catalog.path,)
            view = View(
                cwd=gate.workspace, writable=(gate.workspace,), readable=readable, placed=tuple(placed),
                placed_writable=((beats, os.path.join(IN_SANDBOX, "heartbeat")),), withheld=withheld_paths(gate),
            )
            wrapped = box.wrap(argv, view, env)
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
                sandbox=wrapped.record,
                **model_fields,
            )
            watched = _state_entries(gate, dispatch_id)
            try:
                if sandboxed and program is None:
                    raise FileNotFoundError(2, "No such file or directory", argv[0])
                result = run_group(
                    wrapped.argv,
                    cwd=gate.workspace,
                    env=env,
                    timeout_s=budget.timeout_s,
                    output_path=output,
                    sandboxed=wrapped.sandboxed,
                )
            except OSError as exc:
                gate.record("dispatch_end", dispatch_id=dispatch_id, seq=seq, spawn_error=str(exc), detached_pids=[])
                raise GateRefusal(Code.WORKER_SPAWN_FAILED, f"cannot start the worker: {exc.strerror or exc}", argv[0]) from None
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
        "sandbox": wrapped.record,
        **result.to_json(),
    }
