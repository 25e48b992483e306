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
from harness.records._shape import Fields, kind_is, read, write

__all__ = ["TASK_RECEIPT_SCHEMA", "WORK_FILES", "WORK_KIND", "AttemptWork", "TaskReceipt"]

WORK_KIND: Final = "repo-task-work.v1"
TASK_RECEIPT_SCHEMA: Final = "proctor-task-receipt.v1"
WORK_FILES: Final = ("diff.patch", "verify.json", "wire.jsonl")
"""The files a work folder may keep: the worker's diff against the snapshot, the gate's receipt (machine
paths made portable), and the metering proxy's wire log of every model request the worker made."""


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

    def to_json(self) -> dict[str, Any]:
        return write(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], path: str | None = None, line: int | None = None) -> AttemptWork:
        work = read(cls, obj, code=Code.ATTEMPT_INVALID, path=path, line=line, ignore=frozenset())
        f = Fields(obj, line, path, Code.ATTEMPT_INVALID)
        for name, digest in work.files.items():
            if name not in WORK_FILES or not isinstance(digest, str) or len(digest) != 64:
                raise f.bad(f"work.files: {name!r} is not one of {', '.join(WORK_FILES)} with a sha256")
        if not work.folder.startswith("work/") or ".." in work.folder.split("/"):
            raise f.bad("work.folder must lie under work/ in the stage folder")
        return work


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
