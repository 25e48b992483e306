"""The `repo_task` kind: one attempt is one run of the gated path on a fresh workspace.

A fresh workspace is copied from the item's snapshot (checked against the packet's tree signature)
into a temporary folder outside the results and committed as a git baseline; `init` pins the task
file and seals its verifier and hidden tests (checked against the suite's private part); one
`dispatch` runs the system's catalog worker in the sandbox under the attempt deadline, every model
request through the metering proxy in front of the system's base URL; `verify` judges the tree on a
fresh copy. The attempt's work folder in the stage folder keeps the diff, the gate's receipt (machine
paths made portable) and the proxy's wire log; the attempt's cost is the metered sum of that wire.
Its final's receipt (`proctor-task-receipt.v1`) carries the verdict.

The manual: docs/run.md ("Suite kinds").
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from harness.errors import Code, Refusal
from harness.evals.suite import Packet, load_packet
from harness.evals.verify_humaneval import VerifierUnavailable
from harness.evidence.fsutil import atomic_write
from harness.evidence.git import run_git
from harness.evidence.jsonio import canonical_line, read_bytes, read_json, sha256_hex
from harness.evidence.money import sum_costs
from harness.evidence.portable import machine_names, portable_text, portable_value
from harness.evidence.tree import tree_signature
from harness.gate.decision import DispatchOutcome, SwitchDecision, Verification, decide_next
from harness.meter.allowance import Allowance
from harness.meter.cost import Cost, meter, total_cost
from harness.meter.pricing import Price, PricingTable, load_pricing
from harness.meter.wire import exchange_error_code, read_wire
from harness.providers.catalog import BUNDLED_CATALOG
from harness.records.attempt import PROVIDER_ERROR_CODES, Attempt, validate_attempt
from harness.records.plan import PlanCell
from harness.records.usage import TokenUsage
from harness.records.work import (
    MAX_CASCADE_STEPS,
    WORK_FILES,
    AttemptWork,
    CascadeGate,
    CascadeStep,
    CascadeWork,
    TaskReceipt,
    step_wire,
)
from harness.run.kinds.base import KindHost, RemoteWork, SuiteKind, VerifyHost
from harness.run.layout import receipt_name
from harness.run.ledger import CellState
from harness.workers.arm import ArmWorker

if TYPE_CHECKING:
    from harness.evals.verify_pool import VerifierPool
    from harness.run.rules import Room

__all__ = ["CascadeSystem", "RepoTaskKind", "WorkOrder", "carry_out", "checkout", "evidence_packet", "keep_work",
           "node_work", "perform", "perform_on_node", "repair_section", "tree_diff", "work_folder"]

log = logging.getLogger("harness.run.kinds.repo_task")
NODE_GRACE_S: Final = 60.0
"""With the ray engine, past the attempt deadline and the task's verify timeout, how long the driver still waits
for a node's result before it closes the attempt (`RepoTaskKind.node_limit_s`; docs/ray.md)."""
PROVIDER_FAILURE_EXIT: Final = 75
"""A worker's exit when its provider failed (`harness.workers.llm_edit.EXIT_PROVIDER_FAILED`)."""
_SKIP: Final = frozenset({".git", "__pycache__", ".pytest_cache"})


def work_folder(run_id: str, rerun: int, attempt: int) -> str:
    """The attempt's work folder, relative to the stage folder."""
    return f"work/{run_id}.r{rerun}.a{attempt}"


@dataclass(frozen=True)
class WorkOrder:
    """Everything one gated-path attempt needs, resolved by the kind before the work starts."""

    cell: PlanCell
    rerun: int
    attempt: int
    started: float
    task_path: str | None
    """The item's task file (a `workspace` item); None for a `snapshot` item, whose task is laid out
    from the suite's private part (`harness.evals.mutants.write_task`)."""
    snapshot: str
    """The workspace folder to copy (a `workspace` item), or the suite folder (a `snapshot` item)."""
    snapshot_tree: str
    catalog_path: str
    upstream: str
    price: Price | None
    deadline_s: float
    stage_folder: str
    worker: ArmWorker | None = None
    """The arm's own worker (the design's `arms[].worker`); None: the system's catalog worker."""
    allowance: Allowance | None = None
    """What the attempt may spend through its proxy (the room when it gets its turn); None: no limit inside it."""
    queued_s: float = 0.0
    """How long from its admission until the order was made (part of its latency)."""
    sandbox: str | None = None
    """The sandbox the dispatch and the verify run in (the ray engine's, on a node); None: `PROCTOR_SANDBOX`,
    else bwrap, as a local run."""
    cascade: tuple[CascadeSystem, ...] = ()
    """A live cascade's systems, cheapest first (empty: a single-system arm, the cell's system)."""
    targeted_repair: bool = False
    """A cascade arm that registered `targeted_repair`: a localized defect is repaired by the same system first."""
    escalate: Callable[[str, float], Allowance | None] | None = None
    """A cascade's allowance for its next system, given that system and what the steps before it spent (the local
    engine: asked of the driver's ledger between the steps)."""
    escalations: tuple[Allowance, ...] = ()
    """A cascade's allowance for each later system (the ray engine's: a node cannot ask the driver), fixed when
    the order is made with the earlier steps taken to spend their whole allowance (`RepoTaskKind.fixed_escalations`)."""
    verify_timeout_s: float = 600.0
    """The task's verify timeout (its `budget.verify_timeout_s`): with the deadline, what bounds the attempt."""


@dataclass(frozen=True)
class CascadeSystem:
    """One system of a live cascade as its step needs it: slot, catalog model id, upstream URL, price."""

    system: str
    model: str
    upstream: str
    price: Price | None


def _files(root: str) -> dict[str, str]:
    """Relative path -> absolute path of every file or link below `root` (caches and `.git` left out)."""
    out: dict[str, str] = {}
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not os.path.islink(os.path.join(here, d)))
        links = [d for d in os.listdir(here) if os.path.islink(os.path.join(here, d))
                 and os.path.isdir(os.path.join(here, d))]
        for name in sorted({*names, *links}):
            if name.endswith(".pyc"):
                continue
            path = os.path.join(here, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = path
    return out


def _content(path: str | None) -> bytes | None:
    if path is None:
        return None
    if os.path.islink(path):
        return b"link -> " + os.fsencode(os.readlink(path))
    return read_bytes(path)


def tree_diff(before: str, after: str) -> bytes:
    """A unified diff from the folder `before` to `after` (text files by line, others by sha256)."""
    a, b = _files(before), _files(after)
    out: list[str] = []
    for rel in sorted({*a, *b}):
        old, new = _content(a.get(rel)), _content(b.get(rel))
        if old == new:
            continue
        try:
            old_text = None if old is None else old.decode("utf-8")
            new_text = None if new is None else new.decode("utf-8")
        except UnicodeDecodeError:
            digest = [None if x is None else sha256_hex(x) for x in (old, new)]
            out.append(f"Binary files a/{rel} and b/{rel} differ (sha256 {digest[0]} -> {digest[1]})\n")
            continue
        out.extend(difflib.unified_diff(
            [] if old_text is None else old_text.splitlines(keepends=True),
            [] if new_text is None else new_text.splitlines(keepends=True),
            "/dev/null" if old is None else f"a/{rel}", "/dev/null" if new is None else f"b/{rel}"))
        if out and not out[-1].endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out).encode("utf-8")


def _baseline(ws: str) -> None:
    """Commit the fresh workspace as the baseline, in a git repository proctor made itself."""
    who = {f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER")
           for what, value in (("NAME", "proctor runner"), ("EMAIL", "runner@proctor.invalid"))}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the item's snapshot"]):
        run_git(args, git_dir=os.path.join(ws, ".git"), work_tree=ws, env=who).check_returncode()


def _metered(wire: str | None, price: Price | None) -> tuple[Cost, TokenUsage | None, int, str | None, str | None]:
    """(cost, tokens, exchanges, model snapshot, last error code) of a dispatch's wire log; a request its
    allowance stopped counts as an exchange that cost nothing. The last exchange's error is classified from its
    recorded bytes as a completion's response is (`exchange_error_code`), not by the proxy's status alone."""
    if wire is None or not os.path.lexists(wire):
        return Cost(0.0), TokenUsage(), 0, None, None
    records = read_wire(wire)
    sent = [r for r in records if r.sent]  # a budget stop never left the proxy: $0, no tokens
    cost = total_cost(meter(r.usage, price) for r in sent) if sent else Cost(0.0)
    tokens: TokenUsage | None = TokenUsage()
    for r in sent:
        tokens = None if tokens is None or r.usage is None else tokens + r.usage
    snapshot = next((r.model_snapshot for r in reversed(records) if r.model_snapshot), None)
    error = exchange_error_code(records[-1]) if records else None
    return cost, tokens, len(records), snapshot, error


def carry_out(order: WorkOrder) -> dict[str, Any]:
    """Run one gated-path attempt (blocking; several may run at once in one process: each `run_group` sweeps
    only its own processes), keep its work folder in the stage folder and return its attempt record
    (`ended` still to stamp).

    A set-up failure (the snapshot or task changed, init refused, the worker could not start) is a
    `harness_error`; a worker whose provider failed (exit 75) ends as the last request's provider error; a
    refusal of what the worker left (a scope violation, a tampered state folder) is delivered, judged not
    passed.
    """
    record, files = perform(order)
    keep_work(order.stage_folder, AttemptWork.from_json(record["work"]).folder, files)
    return record


def keep_work(stage_folder: str, folder: str, files: dict[str, bytes]) -> None:
    """Write an attempt's work files (the diff, the gate's receipt, the wire log) into its work folder."""
    target = os.path.join(stage_folder, folder)
    os.makedirs(target, exist_ok=True)
    for name, data in sorted(files.items()):
        atomic_write(os.path.join(target, name), data, mode=0o644)


def checkout() -> str:
    """The proctor checkout this process runs from (the folder holding `harness/`)."""
    here = os.path.abspath(__file__)  # <checkout>/harness/run/kinds/repo_task.py
    for _ in range(4):
        here = os.path.dirname(here)
    return here


def perform_on_node(order: WorkOrder, driver_checkout: str,
                    credentials: dict[str, str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """`perform` on a node of the ray engine (docs/ray.md, "Repository tasks"): the order's paths under the
    driver's checkout are taken in the node's own (the suite is hashed evidence: a workspace item's snapshot
    is checked against the packet's tree signature here, as on the driver), the credentials the worker needs are set for the call
    only, and the metering proxy runs here, beside the worker. Nothing is written but a temporary folder:
    the record and the files come back to the driver, which checks and writes them."""
    here = checkout()

    def rebase(path: str) -> str:
        inside = os.path.relpath(path, driver_checkout)
        return path if inside == ".." or inside.startswith("../") else os.path.join(here, inside)

    local = dataclasses.replace(order, snapshot=rebase(order.snapshot), catalog_path=rebase(order.catalog_path),
                                task_path=None if order.task_path is None else rebase(order.task_path))
    saved = {name: os.environ.get(name) for name in credentials}
    os.environ.update(credentials)
    try:
        return perform(local)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _found_wire(state: str, taken: Sequence[str | None]) -> str | None:
    """The wire log of a refused dispatch (it returns no result): the first in `state` that has one and is not
    an earlier step's (`taken`)."""
    root = os.path.join(state, "dispatches")
    if not os.path.isdir(root):
        return None
    found = [os.path.join(root, d, "wire.jsonl") for d in sorted(os.listdir(root))]
    return next((w for w in found if os.path.lexists(w) and w not in taken), None)


def evidence_packet(system: str, gate: CascadeGate, output: bytes) -> str:
    """What the next system of a cascade is told after a failed gate: the end of the visible tests' output
    (`EVIDENCE_TAIL` characters; the gate never lays the hidden tests, so none of them can show in it)."""
    from harness.gate.visible import EVIDENCE_TAIL

    how = "timed out" if gate.timed_out else f"failed (exit {gate.exit_code})"
    tail = output.decode("utf-8", "replace")[-EVIDENCE_TAIL:]
    return (f"\n\n## Evidence from an earlier attempt\n\nA cheaper system ({system}) worked on this task first; "
            f"its changes are in the workspace. On its tree the visible tests {how}. The end of their output:\n\n"
            f"```text\n{tail}\n```\n")


def repair_section(decision: SwitchDecision, output: bytes) -> str:
    """What a cascade's system is told for a targeted repair (the gated path's rule found a localized defect):
    only the failing visible tests' failure sections from the gate's output (`failing_test_evidence`)."""
    from harness.gate.evidence import failing_test_evidence, render_repair

    tests = failing_test_evidence(output.decode("utf-8", "replace"), decision.failing_tests)
    return render_repair({"failing_tests": tests, "tests_expected": decision.tests_expected}, None)


def _outcome(system: CascadeSystem, switch_class: str, number: int, gate: CascadeGate) -> DispatchOutcome:
    """A cascade step and its failed gate as the switch rule's history reads a dispatch and its verification
    (the system is the lane; the gate's output file names the verification)."""
    return DispatchOutcome(lane=system.system, model=system.model,
                           switch_class="localized_defect" if switch_class == "localized_defect" else "first",
                           verification=Verification(receipt_id=f"gate.s{number}", passed=gate.passed,
                                                     fingerprint=gate.fingerprint, tests_expected=gate.tests_expected,
                                                     tests_failing=gate.tests_failing))


def _max_dispatches(task_path: str) -> int:
    """The task's `budget.max_dispatches`: a cascade's steps are its dispatches."""
    from harness.gate.task import load_task

    return load_task(task_path).budget.max_dispatches


def perform(order: WorkOrder) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The attempt's work, written nowhere but a temporary folder: (its attempt record, its work files by
    name). `carry_out` keeps the files; the ray engine runs this on a node (`perform_on_node`)."""
    from harness.gate.dispatch import dispatch
    from harness.gate.initialize import init_workspace
    from harness.gate.verify import verify
    from harness.gate.visible import gate_visible

    r = order.cell
    folder = work_folder(r.run_id, order.rerun, order.attempt)
    tmp = tempfile.mkdtemp(prefix="proctor-attempt-")
    ws, state = os.path.join(tmp, "workspace"), os.path.join(tmp, "state")
    names = {os.path.realpath(tmp): "<attempt>", tmp: "<attempt>", **machine_names()}
    files: dict[str, bytes] = {}
    result: Any = None
    refusal: str | None = None
    passed: bool | None = None
    error: tuple[str, str] | None = None
    task_path = order.task_path or os.path.join(tmp, "task", "task.json")
    before = order.snapshot if order.task_path is not None else os.path.join(tmp, "before")
    systems = order.cascade or (CascadeSystem(r.system, r.model, order.upstream, order.price),)
    steps: list[CascadeStep] = []
    costs: list[Cost] = []
    tokens: TokenUsage | None = TokenUsage()
    exchanges, snapshot, last_error = 0, None, None
    wires: list[str | None] = []
    began = 0.0
    try:
        try:
            if order.task_path is not None:
                shutil.copytree(order.snapshot, ws, symlinks=True)
                if tree_signature(ws).digest != order.snapshot_tree:
                    raise VerifierUnavailable(f"the snapshot of item {r.item} is not the packet's tree")
                _baseline(ws)
            else:  # a snapshot item: the workspace (a git baseline) and task made from the private part
                from harness.evals.mutants import mutant_item, write_task
                from harness.evals.suite import load_suite

                task_path = write_task(mutant_item(load_suite(order.snapshot), r.item), os.path.join(tmp, "task"))
                ws = os.path.join(tmp, "task", "workspace")
                shutil.copytree(ws, before, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            init_workspace(ws, task_path, state)
        except (Refusal, OSError, VerifierUnavailable) as exc:
            error = ("harness_error", f"the workspace could not be set up: {exc}")
        prompt, spent = r.prompt, 0.0
        index, number, switch_class = 0, 0, "first"
        base, system_spent = order.allowance, 0.0  # the allowance of this system's first step, what its steps spent
        ran: list[DispatchOutcome] = []  # this system's gated steps, as the switch rule reads them
        dispatches = _max_dispatches(task_path) if error is None and order.targeted_repair else 0
        while error is None and index < len(systems):
            system = systems[index]
            number += 1
            allowance = base
            if switch_class == "escalation" and order.escalate is not None:
                allowance = base = order.escalate(system.system, spent)
            elif switch_class == "escalation" and order.escalations:  # fixed by the driver at order time
                allowance = base = order.escalations[index - 1]
            elif switch_class == "localized_defect" and base is not None:  # the same system's room, less its steps
                allowance = dataclasses.replace(base, limit_usd=max(0.0, sum_costs([base.limit_usd, -system_spent])))
            # the attempt deadline runs from the first dispatch (the gate's time counts against later steps)
            began = time.monotonic() if number == 1 else began
            left = order.deadline_s if number == 1 else order.deadline_s - (time.monotonic() - began)
            if number > 1 and left <= 1.0:
                break  # no time left for another step: the tree the last step left is judged
            wire: str | None = None
            result = None
            try:
                result = dispatch(ws, task_path, state_dir=state, model=system.model,
                                  catalog_path=order.catalog_path, upstream_url=system.upstream,
                                  timeout_s=left, prompt_text=prompt, worker=order.worker, allowance=allowance,
                                  sandbox=order.sandbox)
                wire = result.wire_log
            except Refusal as exc:
                if exc.code in (Code.STATE_TAMPERED, Code.GIT_DIR_CHANGED):
                    refusal, passed = exc.code.value, False  # the worker's doing: judged, not passed
                else:
                    error = ("harness_error", f"the dispatch was refused: {exc.code.value}: {exc.message}")
                wire = _found_wire(state, wires)
            wires.append(wire)
            cost, used, made, model_snapshot, step_error = _metered(wire, system.price)
            costs.append(cost)
            spent += cost.total or 0.0
            system_spent += cost.total or 0.0
            tokens = None if tokens is None or used is None else tokens + used
            exchanges += made
            snapshot, last_error = model_snapshot or snapshot, step_error if made else last_error
            if wire is not None and os.path.lexists(wire):
                files[step_wire(number)] = read_bytes(wire)
            provider_failed = result is not None and result.process.exit_code == PROVIDER_FAILURE_EXIT
            if error is None and result is not None and result.budget_stop:  # stopped by its allowance: not judged
                assert allowance is not None
                error = ("budget_stop", f"the metering proxy stopped a request that could cross the attempt's "
                                        f"allowance ${allowance.limit_usd:.6g} (its system's cap or the ceiling)")
            elif error is None and provider_failed:
                code = (last_error if last_error in PROVIDER_ERROR_CODES else
                        "transport" if exchanges == 0 else "malformed_response")
                error = (str(code), f"the worker's provider failed (exit {PROVIDER_FAILURE_EXIT}); "
                                    f"last request: {last_error}")
            gate: CascadeGate | None = None
            step_class, next_class = switch_class, "escalation"
            if error is None and refusal is None and order.cascade and index < len(systems) - 1:
                try:
                    seen = gate_visible(ws, task_path, state)
                except Refusal as exc:  # what the worker left cannot even be gated: judged, not passed
                    refusal, passed = exc.code.value, False
                else:  # kept, and shown to the next step, without this machine's folders
                    shown = portable_text(seen.output.decode("utf-8", "replace"), names).encode("utf-8")
                    files[f"gate.s{number}.output"] = shown
                    gate = CascadeGate(passed=seen.passed, exit_code=seen.exit_code, timed_out=seen.timed_out,
                                       duration_s=seen.duration_s, output_sha256=sha256_hex(shown),
                                       fingerprint=seen.fingerprint, tests_expected=seen.tests_expected,
                                       tests_failing=seen.tests_failing)
                    if not gate.passed:
                        ran.append(_outcome(system, step_class, number, gate))
                        # the gated path's rule; a repair only while the later systems keep a dispatch each
                        decision = decide_next(system.system, ran, 0)
                        if (decision.switch_class == "localized_defect"
                                and number + 1 + (len(systems) - 1 - index) <= dispatches):
                            next_class = "localized_defect"
                            prompt = r.prompt + repair_section(decision, shown)
                        else:
                            prompt = r.prompt + evidence_packet(system.system, gate, shown)
            steps.append(CascadeStep(
                system=system.system, model=system.model, dispatch_id=None if result is None else result.dispatch_id,
                exit_code=None if result is None else result.process.exit_code,
                timed_out=bool(result is not None and result.process.timed_out), exchanges=made,
                cost_usd=cost.total, wire=step_wire(number) if step_wire(number) in files else None,
                budget_stop=bool(result is not None and result.budget_stop), gate=gate, switch_class=step_class))
            if gate is None or gate.passed:
                break
            switch_class = next_class
            if next_class == "escalation":
                index, ran, system_spent = index + 1, [], 0.0
        if error is None and refusal is None:
            try:
                verdict = verify(ws, task_path, state, sandbox=order.sandbox)
            except Refusal as exc:  # what the worker left cannot be verified: not passed
                refusal, passed = exc.code.value, False
            else:
                passed = verdict.receipt.passed
                files["verify.json"] = canonical_line(portable_value(verdict.receipt.to_json(), names))
        if error is None:
            files["diff.patch"] = tree_diff(before, ws)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cost = costs[0] if len(costs) == 1 else total_cost(costs) if costs else Cost(0.0)
    work = AttemptWork(
        kind="repo-task-work.v1", folder=folder, dispatch_id=None if result is None else result.dispatch_id,
        exit_code=None if result is None else result.process.exit_code,
        timed_out=bool(result is not None and result.process.timed_out),
        provider_failure=bool(result is not None and result.provider_failure), exchanges=exchanges,
        files={name: sha256_hex(data) for name, data in sorted(files.items())}, passed=passed, refusal=refusal,
        queued_s=round(order.queued_s, 6),
        cascade=None if not order.cascade else CascadeWork(systems=tuple(s.system for s in order.cascade),
                                                           steps=tuple(steps)),
    )
    outcome: dict[str, Any] = ({"outcome": "delivered", "text": None} if error is None else
                               {"outcome": "error", "error_code": error[0], "error_message": error[1]})
    return _attempt_record(order, work, outcome, snapshot, tokens, cost), files


class RepoTaskKind(SuiteKind):
    """One gated-path run per attempt; the receipt's verdict is the outcome."""

    name = "repo_task"

    def __init__(self, suite_dir: str) -> None:
        super().__init__(suite_dir)
        self.root = os.path.dirname(os.path.dirname(os.path.abspath(suite_dir)))  # task paths are relative to it
        self._packet: Packet | None = None
        self._pricing: PricingTable | None = None
        # each attempt under way: what it may spend, by system, in step order (the first part holds the reserve)
        self._claims: dict[tuple[str, int, int], list[tuple[str, float]]] = {}
        """The allowances of this kind's attempts under way (`claim`)."""

    def allowance(self, host: KindHost, system: str, room_usd: float) -> Allowance:
        """The attempt's allowance: `room_usd`, metered with the run's pricing under the system's pricing key;
        a request with no output cap counts as the reserve (or, with a zero reserve, the whole room)."""
        if self._pricing is None:
            self._pricing = load_pricing(host.s.pricing_path)
        model = host.s.models[system]
        reserve = host.s.design.budgets.reserve_per_item_usd
        return Allowance(limit_usd=room_usd, pricing=self._pricing, reserve_usd=reserve or max(room_usd, 1e-9),
                         keys={model.api_model: model.pricing_key, model.id: model.pricing_key})

    def claim(self, host: KindHost, system: str, key: tuple[str, int, int]) -> float:
        """The allowance of an attempt about to start, held until its record is written (docs/run.md, "Budgets
        inside an attempt"): the room (`room_now`, which counts every other attempt under way at the reserve)
        less what the other attempts running hold beyond it, shared among the run's lanes (`lanes_per_system`
        x systems) but never below the reserve: the attempts running at once never take a system over its cap
        or the run over the ceiling. With one lane and one system it is the whole room."""
        self._claims.pop(key, None)
        return self._share(host, key, system, host.room_now(system))

    def _share(self, host: KindHost, key: tuple[str, int, int], system: str, room: Room) -> float:
        """`claim`'s rule on a room, for `key`'s next part on `system` (held as that part): less what the other
        attempts' parts hold beyond the reserve their first part holds in `room`, against `system`'s cap the
        parts on `system` and against the ceiling every part (this attempt's earlier steps are in `room`, as the
        cascade's `spent`); shared among the lanes, never below the reserve."""
        reserve = host.s.design.budgets.reserve_per_item_usd
        mine = self._claims.get(key, [])
        held = [(s, max(0.0, c - reserve) if n == 0 else c)  # a later part holds no reserve: all of it counts
                for k, parts in list(self._claims.items()) if k != key for n, (s, c) in enumerate(parts)]
        free = min(sum_costs([room.cap, *(-c for s, c in held if s == system)]),
                   sum_costs([room.ceiling, *(-c for _, c in held)]))
        free = max(0.0, free)
        share = free / max(1, host.rules.lanes_per_system * len(host.s.systems))
        claim = min(free, max(reserve, share))
        self._claims[key] = [*mine, (system, claim)]
        return claim

    def packet(self, host: KindHost) -> Packet:
        if self._packet is None:
            d = host.s.design
            self._packet = load_packet(d.packet_path, d.packet_sha256)
        return self._packet

    def order(self, host: KindHost, r: PlanCell, rerun: int, number: int, started: float,
              room_usd: float | None = None, *, queued_s: float = 0.0) -> WorkOrder:
        """Resolve the item's snapshot, task file (checked against the private part), the arm's worker (None:
        the system's catalog worker) and, given `room_usd`, the attempt's allowance."""
        from harness.gate.task import load_task

        item = self.packet(host).get(r.item)
        private = host.private()[r.item].record
        frozen = host.s.frozen
        catalog = str(BUNDLED_CATALOG) if frozen.catalog_sha256 is None else os.path.join(frozen.path, "catalog.toml")
        common: dict[str, Any] = {
            "cell": r, "rerun": rerun, "attempt": number, "started": started, "catalog_path": catalog,
            "upstream": host.s.base_urls[r.system], "price": host.s.prices[r.system],
            "deadline_s": host.rules.attempt_deadline_s, "stage_folder": host.s.folder,
            "worker": host.s.design.arm(r.arm).worker,
            "allowance": None if room_usd is None else self.allowance(host, r.system, room_usd),
            "queued_s": queued_s, **self._cascade(host, r, room_usd, (r.run_id, rerun, number))}
        if item.workspace is None and isinstance(private.get("snapshot"), dict):  # made from the private part
            from harness.evals.mutants import TASK_BUDGET

            return WorkOrder(task_path=None, snapshot=self.suite_dir, snapshot_tree="",
                             verify_timeout_s=float(TASK_BUDGET["verify_timeout_s"]), **common)
        if item.workspace is None or not isinstance(private.get("task"), str):
            raise VerifierUnavailable(f"item {r.item} is not a repository task (no workspace or task file)")
        task_path = os.path.join(self.root, private["task"])
        task = load_task(task_path)
        if task.sha256 != private.get("task_sha256"):
            raise VerifierUnavailable(f"item {r.item}: the task file is not the one the suite sealed")
        for h in private.get("hidden", []):
            source = os.path.join(task.folder, h["from"])
            if sha256_hex(read_bytes(source)) != h["sha256"]:
                raise VerifierUnavailable(f"item {r.item}: hidden input {h['from']} is not the one the suite sealed")
        return WorkOrder(task_path=task_path, snapshot=os.path.join(self.root, item.workspace),
                         snapshot_tree=str(item.metadata.get("workspace_tree")),
                         verify_timeout_s=task.budget.verify_timeout_s, **common)

    def _cascade(self, host: KindHost, r: PlanCell, room_usd: float | None,
                 key: tuple[str, int, int]) -> dict[str, Any]:
        """A cascade arm's systems and its escalation allowance (docs/run.md, "Cascade arms").

        Each step is booked to its own system (`harness.run.rules.booked_spend`): a later step's allowance is
        its own system's room now (`escalation_room`: that system's cap and the ceiling, the earlier steps'
        spend counted against the ceiling), shared as `claim` shares a room (`_share`); the attempt's claim
        becomes that allowance. No room: its first request is a budget stop and the attempt ends `budget_stop`.
        On the ray engine the allowances are fixed when the order is made instead (`fixed_escalations`)."""
        arm = host.s.design.arm(r.arm)
        cascade = arm.cascade
        if cascade is None:
            return {}
        systems = tuple(CascadeSystem(slot, host.s.models[slot].id, host.s.base_urls[slot], host.s.prices[slot])
                        for slot in cascade)
        if room_usd is None:
            return {"cascade": systems, "targeted_repair": arm.targeted_repair}

        def escalate(system: str, spent: float) -> Allowance:
            return self.allowance(host, system, self._share(host, key, system, host.escalation_room(system, spent)))

        return {"cascade": systems, "escalate": escalate, "targeted_repair": arm.targeted_repair}

    def fixed_escalations(self, host: KindHost, order: WorkOrder, key: tuple[str, int, int]) -> WorkOrder:
        """The order for a node, which cannot ask the driver between a cascade's steps (docs/ray.md, "Cascade
        arms on a cluster"): no callback; each later system's allowance fixed now, its room
        (`escalation_room`) with the earlier steps taken to spend their whole allowance (`spent` = the sum of
        their limits), shared as `claim` shares a room, each held as a part of the attempt's claim on its system
        (together what it may spend in all). No allowance (no limit inside the attempt): none fixed, as the callback gives none."""
        order = dataclasses.replace(order, escalate=None)
        if not order.cascade or order.allowance is None:
            return order
        limits = [order.allowance.limit_usd]
        fixed: list[Allowance] = []
        for system in order.cascade[1:]:
            room = host.escalation_room(system.system, sum_costs(limits))
            fixed.append(self.allowance(host, system.system, self._share(host, key, system.system, room)))
            limits.append(fixed[-1].limit_usd)
        return dataclasses.replace(order, escalations=tuple(fixed))

    def preflight(self, verifiers: VerifierPool | None = None) -> list[tuple[str, str]]:
        """Every item checks whole (`check_task_suite`) and the sandbox can run here (no warm verifiers:
        `verifiers` is not used)."""
        from harness.evals.tasks import check_task_suite
        from harness.workers.sandbox import resolve_sandbox

        problems = []
        try:
            check_task_suite(self.suite_dir)
        except Refusal as exc:
            problems.append(("suite", f"{exc.code.value}: {exc.message}"))
        try:
            resolve_sandbox()
        except Refusal as exc:
            problems.append(("verifier", f"the gated path's sandbox cannot run: {exc.code.value}: {exc.message}"))
        return problems

    async def attempt(self, host: KindHost, state: CellState, lane: int) -> dict[str, Any] | None:
        r, rerun, number = state.request, state.rerun, state.next_attempt()
        begun = await host.begin_attempt(r, rerun, number, lane)
        if begun is None:
            return None
        started, _ = begun
        waited = time.monotonic()
        key = (r.run_id, rerun, number)
        try:
            try:
                order = self.order(host, r, rerun, number, started, self.claim(host, r.system, key),
                                   queued_s=time.monotonic() - waited)
            except (Refusal, OSError, VerifierUnavailable) as exc:
                record = _harness_error(r, rerun, number, started, f"the item cannot be set up: {exc}")
            else:
                remote = getattr(host, "remote", None)
                if remote is None:
                    record = await asyncio.to_thread(carry_out, order)
                else:
                    record, node = await self._on_node(host, remote, order, key)
                    await host.end_attempt(r, lane, record, node=node)
                    return record
            await host.end_attempt(r, lane, record)
        finally:
            self._claims.pop(key, None)  # its spend is recorded (or the run is ending)
        return record

    async def _on_node(self, host: KindHost, remote: RemoteWork, order: WorkOrder,
                       key: tuple[str, int, int]) -> tuple[dict[str, Any], str | None]:
        """The attempt's work on a node of the ray engine (`perform_on_node`), its result checked and its files
        written here, the driver: (the attempt record, the node). A lost node is the attempt's `runner_lost`
        (its intent resolved as a crash's: retried, costing the reserve), and so is a node that hangs: no result
        within `node_limit_s` closes the attempt (a result that still comes is ignored and logged); a result
        that does not hold together is a `harness_error` costing what the driver meters from the wire the node
        returned."""
        from harness.run.remote import AttemptOverdue, NodeLost

        r = order.cell
        model = host.s.models[r.system]
        secret = os.environ.get(model.credential_env) if model.credential_env else None
        credentials = {model.credential_env: secret} if model.credential_env and secret else {}
        order = dataclasses.replace(self.fixed_escalations(host, order, key), sandbox=remote.sandbox)
        try:
            (record, files), node, kept = await remote.arun(key, perform_on_node, order, checkout(), credentials,
                                                            limit_s=self.node_limit_s(order))
        except NodeLost as exc:
            return _lost(r, order.rerun, order.attempt, order.started,
                         f"the Ray node doing the attempt's work was lost before its result came back ({exc})"), None
        except AttemptOverdue as exc:
            return _lost(r, order.rerun, order.attempt, order.started, f"the Ray node doing the attempt's work "
                         f"did not answer: {exc}"), None
        if not kept:  # never, as built: only this coroutine closes a repo_task attempt (overdue: raised above)
            raise VerifierUnavailable(f"attempt {key} was closed before node {node}'s result came back")
        return node_work(order, record, files, node), node

    @staticmethod
    def node_limit_s(order: WorkOrder) -> float:
        """How long the driver waits for a node's result: the node stops the worker at the attempt deadline and
        the verify at the task's verify timeout, so past both and a grace (`NODE_GRACE_S`: the workspace, the
        copies, Ray's scheduling) the node is taken to hang."""
        return order.deadline_s + order.verify_timeout_s + NODE_GRACE_S

    def verify(self, host: VerifyHost, state: CellState) -> tuple[str, str, bool]:
        _, attempt, sha = state.current()[-1]
        r = state.request
        work = AttemptWork.from_json(attempt["work"])
        folder = os.path.join(host.s.folder, work.folder)
        for name, digest in work.files.items():
            if sha256_hex(read_bytes(os.path.join(folder, name))) != digest:
                raise VerifierUnavailable(f"{work.folder}/{name} is not the file its attempt recorded")
        gate: dict[str, Any] = {}
        if "verify.json" in work.files:
            gate = read_json(os.path.join(folder, "verify.json")).value
        private = host.private()[r.item].record
        manifest = read_json(os.path.join(self.suite_dir, "SUITE.json")).value
        receipt = TaskReceipt(
            suite=host.s.design.suite_name, private_sha256=manifest.get("private_sha256"), item=r.item,
            task_sha256=str(gate.get("task_sha256") or private.get("task_sha256")), run_id=r.run_id, rerun=state.rerun, attempt_sha256=sha,
            passed=work.passed is True, refusal=work.refusal, work=work.folder, files=dict(work.files),
            tree=gate.get("tree"), baseline_tree=gate.get("baseline_tree"), exit_code=gate.get("exit_code"),
            timed_out=bool(gate.get("timed_out")), results=gate.get("results"),
            suspicious_code=gate.get(Code.SUSPICIOUS_CODE.value),
            tamper_detected=bool(gate.get(Code.TAMPER_DETECTED.value)),
            verifier_nondiscriminating=bool(gate.get("verifier_nondiscriminating")), sandbox=gate.get("sandbox"),
            at=host.clock.now(),
        )
        name = receipt_name(r.run_id, state.rerun)
        data = canonical_line(receipt.to_json())
        path = os.path.join(host.s.folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, data, mode=0o644)
        return name, sha256_hex(data), receipt.passed


def node_work(order: WorkOrder, record: dict[str, Any], files: dict[str, bytes], node: str) -> dict[str, Any]:
    """A node's attempt record made the driver's: its work files written into the stage folder, their sha256
    and the spend taken from the bytes here (each wire metered with the driver's price of its step's system,
    never the node's figures), the attempt named as the order named it. A record for another attempt, a
    cascade not the order's, a file name not of a work folder, or a verdict the gate's receipt contradicts is
    a `harness_error` (the spend still metered; a cascade's later wires then at its last system's price)."""
    r = order.cell
    folder = work_folder(r.run_id, order.rerun, order.attempt)
    problem, work = None, None
    if (record.get("run_id"), record.get("rerun"), record.get("attempt")) != (r.run_id, order.rerun, order.attempt):
        problem = f"it names attempt {record.get('run_id')}.r{record.get('rerun')}.a{record.get('attempt')}"
    else:
        try:
            work = AttemptWork.from_json(record["work"])
        except (Refusal, KeyError, TypeError, ValueError) as exc:
            problem = f"its work record does not read: {exc}"
    systems = tuple(s.system for s in order.cascade)
    if problem is None and work is not None and (
            (work.cascade.systems if work.cascade else ()) != systems
            or any(step.system not in systems for step in (work.cascade.steps if work.cascade else ()))):
        problem = f"its cascade is not the order's ({systems or 'none'})"
    steps = work.cascade.steps if problem is None and work is not None and work.cascade is not None else ()
    ran = MAX_CASCADE_STEPS if order.cascade else 1
    names = set(WORK_FILES) if order.cascade else {"diff.patch", "verify.json", "wire.jsonl"}
    if problem is None and not set(files) <= names:
        problem = f"its files {sorted(files)} are not a work folder's"
    safe = {n: d for n, d in files.items() if n in names and isinstance(d, bytes)}
    keep_work(order.stage_folder, folder, safe)
    prices = {s.system: s.price for s in order.cascade}
    price_of = [prices[s.system] for s in steps] or [order.price] + [
        order.cascade[-1].price if order.cascade else order.price] * (ran - 1)
    metered = []
    try:
        for n, price in enumerate(price_of, 1):
            wire = os.path.join(order.stage_folder, folder, step_wire(n)) if step_wire(n) in safe else None
            metered.append(_metered(wire, price))
    except Refusal as exc:
        metered = [(Cost(None, status="usage_unknown", reason="the wire is unreadable"), None, 0, None, None)]
        problem = problem or f"its wire log cannot be read: {exc.code.value}"
    costs = [m[0] for m in metered]
    cost = costs[0] if len(costs) == 1 else total_cost(costs)
    tokens: TokenUsage | None = TokenUsage()
    for m in metered:
        tokens = None if tokens is None or m[1] is None else tokens + m[1]
    exchanges = sum(m[2] for m in metered)
    snapshot = next((m[3] for m in reversed(metered) if m[3]), None)
    try:
        if (problem is None and work is not None and "verify.json" in safe
                and json.loads(safe["verify.json"]).get("passed", work.passed) != work.passed):
            problem = "its verdict is not its receipt's"
    except (TypeError, ValueError, AttributeError) as exc:
        problem = f"its receipt does not read: {exc}"
    if work is None or problem is not None:
        log.warning("node %s: the result for %s does not hold (%s): a harness_error", node, folder, problem)
        outcome: dict[str, Any] = {"outcome": "error", "error_code": "harness_error",
                                   "error_message": f"the result from node {node} does not hold: {problem}"}
        work = AttemptWork(kind="repo-task-work.v1", folder=folder, dispatch_id=None, exit_code=None, timed_out=False,
                           provider_failure=False, exchanges=exchanges, passed=None, refusal=None,
                           queued_s=round(order.queued_s, 6), files={})
    else:
        outcome = {k: record[k] for k in ("outcome", "text", "error_code", "error_message") if k in record}
        if work.cascade is not None:  # each step's spend and exchanges as the driver metered its wire
            work = dataclasses.replace(work, cascade=dataclasses.replace(work.cascade, steps=tuple(
                dataclasses.replace(step, cost_usd=m[0].total, exchanges=m[2])
                for step, m in zip(work.cascade.steps, metered, strict=True))))
    work = dataclasses.replace(work, folder=folder, exchanges=exchanges,
                               files={n: sha256_hex(d) for n, d in sorted(safe.items())} if problem is None else {})
    return _attempt_record(order, work, outcome, snapshot, tokens, cost)


def _attempt_record(order: WorkOrder, work: AttemptWork, outcome: dict[str, Any], snapshot: str | None,
                    tokens: TokenUsage | None, cost: Cost) -> dict[str, Any]:
    """A repository-task attempt's record (`ended` still to stamp), checked like every attempt record."""
    r = order.cell
    record = Attempt(
        run_id=r.run_id, attempt=order.attempt, request_sha256=r.request_sha256, started=order.started,
        ended=order.started, latency_s=0.0, http_status=None, response_raw=None, response_sha256=None,
        provider_request_id=None, model_snapshot=snapshot, finish_reason=None,
        tokens=None if tokens is None else tokens.to_json(), usage_unknown=tokens is None,
        cost_usd="unknown" if cost.total is None else cost.total, cost_status=cost.status,
        rerun=order.rerun, work=work.to_json(), **outcome,
    ).to_json()
    validate_attempt({k: v for k, v in record.items() if k != "rerun"}, None)
    return record


def _lost(r: PlanCell, rerun: int, number: int, started: float, message: str) -> dict[str, Any]:
    """The ray node doing the attempt's work died (or hung) before its result came back: resolved as a crash's
    intent is (`runner_lost`, its cost unknown: counted as the reserve, class provider), so the cell is retried."""
    from harness.run.attempts import error_attempt

    record = error_attempt(
        r, number, error_code="runner_lost", started=started, ended=started, error_message=message,
        cost=Cost(None, status="usage_unknown", reason="the node was lost with the work under way"),
    )
    record["rerun"] = rerun
    return record


def _harness_error(r: PlanCell, rerun: int, number: int, started: float, message: str) -> dict[str, Any]:
    """An attempt that never reached the worker: no work, no spend."""
    return Attempt(
        run_id=r.run_id, attempt=number, request_sha256=r.request_sha256, outcome="error", started=started,
        ended=started, latency_s=0.0, http_status=None, response_raw=None, response_sha256=None,
        provider_request_id=None, model_snapshot=None, finish_reason=None, tokens=TokenUsage().to_json(),
        usage_unknown=False, cost_usd=0.0, cost_status="metered", error_code="harness_error",
        error_message=message, rerun=rerun,
    ).to_json()
