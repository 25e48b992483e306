"""A repository-task attempt's work (`repo-task-work.v1`, inside its attempt record) and its receipt
(`proctor-task-receipt.v1`, the stage's receipt bound into the final).

A `repo_task` suite's attempt is one run of the gated path (docs/run.md, "Suite kinds"): its attempt
record carries `work` (what the worker did, where its files are kept in the stage folder) instead of
one HTTP response, and its final's receipt is a task receipt.

The manual: docs/records.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from harness.errors import Code
from harness.records._shape import Fields, keys_of, kind_is, optional_keys, read, write

__all__ = ["CASCADE_SWITCH_CLASSES", "MAX_CASCADE_STEPS", "TASK_RECEIPT_SCHEMA", "WORK_FILES", "WORK_KIND",
           "AttemptWork", "CascadeGate", "CascadeStep", "CascadeWork", "TaskReceipt", "step_wire"]

WORK_KIND: Final = "repo-task-work.v1"
TASK_RECEIPT_SCHEMA: Final = "proctor-task-receipt.v1"
MAX_CASCADE_STEPS: Final = 12
"""The most steps a live cascade's work folder names files for (each system once, and each system but the last
repeated by targeted repairs: `harness.gate.decision.MAX_TARGETED_REPAIRS`, within the task's `max_dispatches`)."""
WORK_FILES: Final = ("diff.patch", "verify.json", "wire.jsonl",
                     *(f"wire.s{n}.jsonl" for n in range(2, MAX_CASCADE_STEPS + 1)),
                     *(f"gate.s{n}.output" for n in range(1, MAX_CASCADE_STEPS)))
"""The files a work folder may keep: the worker's diff against the snapshot, the gate's receipt (machine
paths made portable), and the metering proxy's wire log of every model request the worker made; a live
cascade keeps one wire log per step (its first step's is `wire.jsonl`, step n's `wire.s<n>.jsonl`) and
the output of each visible-test gate it ran (`gate.s<n>.output`)."""
CASCADE_SWITCH_CLASSES: Final = ("first", "localized_defect", "escalation")
"""A cascade step's `switch_class`: its first step; a targeted repair by the same system (the gated path's rule,
`harness.gate.decision.decide_next`, found a localized defect); a step on the next system."""


def step_wire(step: int) -> str:
    """The work file holding a cascade step's wire log (step 1's is the attempt's `wire.jsonl`)."""
    return "wire.jsonl" if step == 1 else f"wire.s{step}.jsonl"


@dataclass(frozen=True)
class CascadeGate:
    """The visible-test gate after a cascade step: its verdict and its own cost (v's time part)."""

    passed: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_sha256: str
    fingerprint: str | None = None
    """A failed gate's failure fingerprint (absent in records made before targeted repairs)."""
    tests_expected: int | None = None
    """The visible tests' per-test report: how many were expected (None: no complete, untampered report)."""
    tests_failing: tuple[str, ...] | None = None
    """The ids of the visible tests that did not pass (None as `tests_expected`)."""


@dataclass(frozen=True)
class CascadeStep:
    """One system's step of a live cascade: its dispatch, what it spent, and the gate after it (if any)."""

    system: str
    model: str
    dispatch_id: str | None
    exit_code: int | None
    timed_out: bool
    exchanges: int
    cost_usd: float | None
    """The step's metered spend (None: unknown); the attempt's `cost_usd` is the sum over steps."""
    wire: str | None
    """Its wire log's name in the work folder (`step_wire`), or None when it made no request."""
    budget_stop: bool
    gate: CascadeGate | None
    """The visible-test gate on the tree it left; None for the last step (its tree is judged by the hidden tests)."""
    switch_class: str | None = None
    """Why this step ran (`CASCADE_SWITCH_CLASSES`); absent in records made before targeted repairs (every step
    then ran on the next system)."""


@dataclass(frozen=True)
class CascadeWork:
    """A live cascade attempt (docs/run.md, "Cascade arms"): the systems it was declared with and the steps
    that ran, cheapest first; the attempt's verdict is the hidden tests' on the tree the last step left."""

    systems: tuple[str, ...]
    steps: tuple[CascadeStep, ...]


@dataclass(frozen=True)
class AttemptWork:
    """What one gated-path attempt did: its dispatch, the worker's exit, the requests it made, the verdict."""

    kind: Annotated[str, kind_is(WORK_KIND)]
    folder: str
    """The attempt's work folder, relative to the stage folder (`work/<run_id>.r<rerun>.a<attempt>`)."""
    dispatch_id: str | None
    exit_code: int | None
    timed_out: bool
    provider_failure: bool
    exchanges: int
    """The model requests the metering proxy recorded (each one metered into the attempt's cost)."""
    files: dict[str, str]
    """File name in the work folder -> its sha256 (names from `WORK_FILES`)."""
    passed: bool | None
    """The gate's verdict; None when nothing was verified."""
    refusal: str | None
    """The gate's refusal that ended the attempt (a worker's scope violation, say), or None."""
    queued_s: float
    """Seconds from its admission to its work starting (part of its `latency_s`; older runs waited here for
    the runner's one gated path at a time)."""
    cascade: CascadeWork | None = None
    """A live cascade's steps (absent for a single-system arm)."""

    def to_json(self) -> dict[str, Any]:
        return write(self, omit_none=frozenset({"cascade"}))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], path: str | None = None, line: int | None = None) -> AttemptWork:
        work = read(cls, obj, code=Code.ATTEMPT_INVALID, path=path, line=line, ignore=frozenset())
        f = Fields(obj, line, path, Code.ATTEMPT_INVALID)
        for name, digest in work.files.items():
            if name not in WORK_FILES or not isinstance(digest, str) or len(digest) != 64:
                raise f.bad(f"work.files: {name!r} is not one of {', '.join(WORK_FILES)} with a sha256")
        if not work.folder.startswith("work/") or ".." in work.folder.split("/"):
            raise f.bad("work.folder must lie under work/ in the stage folder")
        if work.cascade is not None:
            _check_cascade(obj["cascade"], f)
        steps = MAX_CASCADE_STEPS if work.cascade is None else len(work.cascade.steps)
        beyond = sorted(n for n in work.files if _step_of(n) > steps)
        if beyond:  # a cascade's files name only the steps it recorded
            raise f.bad(f"work.files: {', '.join(beyond)} name(s) a step beyond the {steps} recorded")
        return work


def _step_of(name: str) -> int:
    """The cascade step a work file belongs to (`wire.s<n>.jsonl`, `gate.s<n>.output`; 1 for the others)."""
    for prefix, suffix in (("wire.s", ".jsonl"), ("gate.s", ".output")):
        if name.startswith(prefix) and name.endswith(suffix):
            return int(name[len(prefix):-len(suffix)])
    return 1


def _exact(obj: Mapping[str, Any], cls: type, where: str, f: Fields) -> None:
    keys = set(keys_of(cls).values())
    if not keys - optional_keys(cls) <= set(obj) <= keys:
        raise f.bad(f"{where} must hold exactly {', '.join(sorted(keys))} (those with a default may be absent)")


def _check_cascade(doc: Mapping[str, Any], f: Fields) -> None:
    """A cascade's nested objects hold exactly their fields, at least one step, each wire log a work file, each
    step's class one of `CASCADE_SWITCH_CLASSES`."""
    _exact(doc, CascadeWork, "work.cascade", f)
    if not doc["steps"] or len(doc["steps"]) > MAX_CASCADE_STEPS:
        raise f.bad(f"work.cascade.steps must hold the steps that ran (1 to {MAX_CASCADE_STEPS})")
    for i, step in enumerate(doc["steps"], start=1):
        _exact(step, CascadeStep, f"work.cascade.steps[{i - 1}]", f)
        if step.get("switch_class") not in (None, *CASCADE_SWITCH_CLASSES):
            raise f.bad(f"work.cascade.steps[{i - 1}].switch_class must be one of {', '.join(CASCADE_SWITCH_CLASSES)}")
        if step["wire"] not in (None, step_wire(i)):
            raise f.bad(f"work.cascade.steps[{i - 1}].wire must be {step_wire(i)!r} or null")
        if step["gate"] is not None:
            _exact(step["gate"], CascadeGate, f"work.cascade.steps[{i - 1}].gate", f)


@dataclass(frozen=True)
class TaskReceipt:
    """How one repository-task attempt was judged: the sealed verifier's verdict on a fresh copy."""

    suite: str
    private_sha256: str | None
    item: str
    task_sha256: str
    run_id: str
    rerun: int
    attempt_sha256: str
    passed: bool
    refusal: str | None
    work: str
    files: dict[str, str]
    tree: str | None
    baseline_tree: str | None
    exit_code: int | None
    timed_out: bool
    results: dict[str, Any] | None
    suspicious_code: list[Any] | None
    tamper_detected: bool
    verifier_nondiscriminating: bool
    sandbox: dict[str, Any] | None
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"schema": TASK_RECEIPT_SCHEMA, **write(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], path: str | None = None) -> TaskReceipt:
        """Read a task receipt strictly (`receipt_invalid`)."""
        Fields(obj, None, path, Code.RECEIPT_INVALID).shape({"schema": kind_is(TASK_RECEIPT_SCHEMA)})
        return read(cls, obj, code=Code.RECEIPT_INVALID, path=path, ignore=frozenset({"schema"}))
