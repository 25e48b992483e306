"""The gate's journal events: one frozen dataclass per kind, written by `Gate.record`.

The manual: docs/records.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final

from harness.errors import Code, LogRefusal
from harness.records._shape import CHAIN_KEYS, Key, keys_of, read, write

__all__ = [
    "EVENT_TYPES",
    "AcceptEvent",
    "AckEvent",
    "DispatchEnd",
    "DispatchStart",
    "InitEvent",
    "JournalEvent",
    "LaneSwitch",
    "OverrideEvent",
    "ProviderSwitch",
    "PurgeEvent",
    "RecordEvent",
    "RefusedEvent",
    "StateTampered",
    "TamperEvent",
    "TargetedRepair",
    "VerifyEvent",
    "event_from_json",
]

_ENVELOPE: Final = ("event", "t", "at")


class JournalEvent:
    """Base of every event kind: `KIND` is the line's `event`; `OPTIONAL` keys are omitted when None."""

    KIND: ClassVar[str]
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    LEGACY: ClassVar[frozenset[str]] = frozenset()
    SPREAD: ClassVar[tuple[str, tuple[str, ...]] | None] = None
    """A dict field written spread into the line, last, and the keys read back into it."""

    def fields(self) -> dict[str, Any]:
        """The event's own fields in declaration order, tuples as lists; a `SPREAD` field's keys last."""
        out = write(self, self.OPTIONAL)
        if self.SPREAD is None:
            return out
        name = self.SPREAD[0]
        out.pop(name, None)
        return {**out, **(getattr(self, name) or {})}


_MODEL_KEYS: Final = ("model", "api_model", "provider", "api_shape", "pricing_key", "model_choice", "catalog",
                      "upstream", "metering", "worker_network", "wire_log", "wire_name", "worker", "allowance")  # fmt: skip
_PROCESS_KEYS: Final = ("exit_code", "signal", "timed_out", "duration_s", "cpu_s", "process_tracking")


@dataclass(frozen=True)
class InitEvent(JournalEvent):
    KIND: ClassVar[str] = "init"
    task_id: str
    task_sha256: str
    pin_sha256: str
    baseline_tree: str
    sealed: tuple[str, ...]
    hidden: tuple[str, ...]
    lane: str


@dataclass(frozen=True)
class DispatchStart(JournalEvent):
    """A dispatch began; `model` holds the catalog fields of a `--model` dispatch (spread into the line)."""

    KIND: ClassVar[str] = "dispatch_start"
    LEGACY: ClassVar[frozenset[str]] = frozenset({"sandbox", "evidence_file", "preflight"})
    SPREAD: ClassVar[tuple[str, tuple[str, ...]] | None] = ("model", _MODEL_KEYS)
    dispatch_id: str
    seq: int
    argv: tuple[str, ...]
    lane: str
    proctor_pid: int
    prompt_sha256: str
    heartbeat: str
    timeout_s: float
    preflight: tuple[dict[str, Any], ...]
    evidence_file: str | None
    sandbox: dict[str, Any] | None
    model: dict[str, Any] | None = None


@dataclass(frozen=True)
class DispatchEnd(JournalEvent):
    """A dispatch ended: normally (output, tree, process fields) or with `spawn_error`."""

    KIND: ClassVar[str] = "dispatch_end"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"output_sha256", "tree_after", "provider_failure", "wire", "spawn_error", "process", "output_bytes",
         "output_truncated_from", "end_error"}
    )
    SPREAD: ClassVar[tuple[str, tuple[str, ...]] | None] = ("process", _PROCESS_KEYS)
    dispatch_id: str
    seq: int
    output_sha256: str | None = None
    tree_after: str | None = None
    provider_failure: bool | None = None
    wire: dict[str, Any] | None = None
    spawn_error: str | None = None
    detached_pids: tuple[int, ...] = ()
    process: dict[str, Any] | None = None
    output_bytes: int | None = None
    output_truncated_from: int | None = None
    """The output's size before it was cut to `OUTPUT_CAP` (docs/gated-path.md); None: not cut."""
    end_error: str | None = None
    """Why the tree after the run or the output could not be read (the dispatch is then refused)."""


@dataclass(frozen=True)
class LaneSwitch(JournalEvent):
    KIND: ClassVar[str] = "lane_switch"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"switch_class"})
    from_lane: Annotated[str, Key("from")]
    to_lane: Annotated[str, Key("to")]
    reason: str
    fingerprint: str | None
    stagnant_count: int
    receipt_ids: tuple[str, ...]
    dispatch_id: str
    evidence_file: str
    evidence_sha256: str
    switch_class: str | None = None
    """The switch decision's class, "stagnation" (docs/models.md, `harness/gate/decision.py`); absent on older lines."""


@dataclass(frozen=True)
class ProviderSwitch(JournalEvent):
    KIND: ClassVar[str] = "provider_switch"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"switch_class"})
    dispatch_id: str
    from_provider: str | None
    to_provider: str | None
    model: str
    lane: str
    reason: str
    switch_class: str | None = None
    """"provider_failure" (docs/models.md); absent on older lines."""


@dataclass(frozen=True)
class TargetedRepair(JournalEvent):
    """A localized defect after broad success: the next dispatch repairs it in the same lane and model."""

    KIND: ClassVar[str] = "targeted_repair"
    dispatch_id: str
    lane: str
    model: str | None
    reason: str
    receipt_id: str | None
    fingerprint: str | None
    failing_tests: tuple[str, ...]
    tests_expected: int | None
    repair: int
    """Targeted repairs since the last lane switch, this one included (at most `MAX_TARGETED_REPAIRS`)."""
    evidence_file: str
    evidence_sha256: str
    switch_class: str = "localized_defect"


@dataclass(frozen=True)
class StateTampered(JournalEvent):
    KIND: ClassVar[str] = "state_tampered"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"wire_log"})
    dispatch_id: str
    paths: tuple[str, ...]
    wire_log: str | None = None


@dataclass(frozen=True)
class TamperEvent(JournalEvent):
    KIND: ClassVar[str] = "tamper"
    paths: tuple[str, ...]
    action: str


@dataclass(frozen=True)
class PurgeEvent(JournalEvent):
    """verify or accept removed what the tree signature excludes (bytecode caches) from the workspace."""

    KIND: ClassVar[str] = "purge"
    action: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class VerifyEvent(JournalEvent):
    KIND: ClassVar[str] = "verify"
    LEGACY: ClassVar[frozenset[str]] = frozenset({"fingerprint", "sandbox"})
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"tests_expected", "tests_failing"})
    receipt_id: str
    receipt_sha256: str
    passed: bool
    tree: str
    tamper_detected: bool
    dispatch_seq: int
    fingerprint: str | None
    sandbox: str | None
    tests_expected: int | None = None
    """The per-test report's expected test count; None without a complete, untampered report."""
    tests_failing: tuple[str, ...] | None = None
    """The expected ids that did not pass and any test that failed (with `tests_expected`)."""


@dataclass(frozen=True)
class OverrideEvent(JournalEvent):
    KIND: ClassVar[str] = "override"
    override: str
    receipt_id: str


@dataclass(frozen=True)
class AcceptEvent(JournalEvent):
    KIND: ClassVar[str] = "accept"
    LEGACY: ClassVar[frozenset[str]] = frozenset({"guarantee"})
    receipt_id: str
    tree: str
    dispatch_seq: int
    overrides: tuple[str, ...]
    guarantee: str | None


@dataclass(frozen=True)
class AckEvent(JournalEvent):
    KIND: ClassVar[str] = "ack"
    dispatch_id: str


@dataclass(frozen=True)
class RecordEvent(JournalEvent):
    KIND: ClassVar[str] = "record"
    line: int
    row_sha256: str
    cost_status: str


@dataclass(frozen=True)
class RefusedEvent(JournalEvent):
    KIND: ClassVar[str] = "refused"
    action: str
    refusal: str
    message: str


EVENT_TYPES: Final[dict[str, type[JournalEvent]]] = {
    cls.KIND: cls
    for cls in (InitEvent, DispatchStart, DispatchEnd, LaneSwitch, ProviderSwitch, TargetedRepair, StateTampered, TamperEvent,
                PurgeEvent, VerifyEvent, OverrideEvent, AcceptEvent, AckEvent, RecordEvent, RefusedEvent)
}  # fmt: skip


def event_from_json(line: object, path: str | None = None) -> JournalEvent:
    """Read one journal line strictly into its kind's type; `log_record_invalid` names the problem."""
    if not isinstance(line, dict):
        raise LogRefusal(Code.LOG_RECORD_INVALID, "a journal event must be a JSON object", path)
    kind = line.get("event")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise LogRefusal(Code.LOG_RECORD_INVALID, f"unknown journal event {kind!r}", path)
    body = {k: v for k, v in line.items() if k not in _ENVELOPE and k not in CHAIN_KEYS}
    if cls.SPREAD is not None:
        name, keys = cls.SPREAD
        spread = {k: body.pop(k) for k in keys if k in body}
        body[name] = spread or None
    optional = frozenset(keys_of(cls)[n] for n in cls.LEGACY | cls.OPTIONAL)
    return read(cls, body, code=Code.LOG_RECORD_INVALID, path=path, optional=optional)
