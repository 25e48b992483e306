"""Refusals and exit codes: the contract every command keeps (docs/refusals.md).

`Code` names every refusal; `AREAS` groups the codes, and each area raises its own `Refusal`
subclass. `python -m harness.errors` prints docs/refusals.md.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import pairwise
from typing import Any, Final, cast

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the thing checked failed (a verifier failed, an audit found a break)
EXIT_USAGE: Final = 2
EXIT_REFUSED: Final = 3
EXIT_INTERNAL: Final = 4

__all__ = [
    "AREAS",
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "Area",
    "AuditRefusal",
    "Code",
    "EvalRefusal",
    "GateRefusal",
    "InputRefusal",
    "LogRefusal",
    "MeterRefusal",
    "NotebookRefusal",
    "PreregRefusal",
    "ProviderRefusal",
    "Refusal",
    "RunRefusal",
    "TaskRefusal",
    "TreeRefusal",
    "WorkerRefusal",
    "as_code",
    "refusals_markdown",
]


class Code(StrEnum):
    """Every refusal code, grouped by area (the groups are `AREAS`); a member is its stable string."""

    # reading inputs: a file or JSON input cannot be read as strict JSON
    FILE_MISSING = "file_missing"
    DANGLING_LINK = "dangling_link"
    LINK_LOOP = "link_loop"
    NOT_A_REGULAR_FILE = "not_a_regular_file"
    FILE_UNREADABLE = "file_unreadable"
    FILE_TOO_LARGE = "file_too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    JSON_DUPLICATE_KEY = "json_duplicate_key"
    JSON_NON_FINITE = "json_non_finite"
    JSON_TOO_DEEP = "json_too_deep"
    JSON_NOT_OBJECT = "json_not_object"

    # money: a cost is not a valid amount of money
    INVALID_COST = "invalid_cost"
    COST_OVERFLOW = "cost_overflow"

    # chained logs: a hash-chained log cannot be read, verified or appended
    LOG_BROKEN = "log_broken"
    LOG_TORN_TAIL = "log_torn_tail"
    LOG_SEED_MISMATCH = "log_seed_mismatch"
    LOG_SEED_INVALID = "log_seed_invalid"
    LOG_SEED_UNKNOWN = "log_seed_unknown"
    LOG_RECORD_INVALID = "log_record_invalid"
    LOG_RECORD_RESERVED = "log_record_reserved"
    LOG_CHANGED = "log_changed"
    LOG_LOCKED = "log_locked"
    LOG_WRITE_FAILED = "log_write_failed"
    FILE_UNWRITABLE = "file_unwritable"

    # trees: a folder tree cannot be signed
    WORKSPACE_MISSING = "workspace_missing"
    NOT_A_DIRECTORY = "not_a_directory"
    TREE_UNREADABLE = "tree_unreadable"
    TREE_CHANGED_DURING_SCAN = "tree_changed_during_scan"
    TREE_FILE_TOO_LARGE = "tree_file_too_large"
    EXCLUSION_INVALID = "exclusion_invalid"
    MANIFEST_INVALID = "manifest_invalid"

    # task file: the task file is invalid or changed
    TASK_INVALID = "task_invalid"
    SCOPE_EMPTY = "scope_empty"
    VERIFIER_ARGV_NOT_ARRAY = "verifier_argv_not_array"
    TASK_MISMATCH = "task_mismatch"

    # init: `proctor init` cannot set up the gated path
    WORKSPACE_IS_NOT_REPO_ROOT = "workspace_is_not_repo_root"
    GIT_UNAVAILABLE = "git_unavailable"
    ALREADY_INITIALIZED = "already_initialized"
    STATE_DIR_INSIDE_WORKSPACE = "state_dir_inside_workspace"
    STATE_DIR_INVALID = "state_dir_invalid"
    SEAL_TARGET_MISSING = "seal_target_missing"
    HIDDEN_INPUT_MISSING = "hidden_input_missing"
    HIDDEN_INPUT_INSIDE_WORKSPACE = "hidden_input_inside_workspace"
    HIDDEN_INPUT_INVALID = "hidden_input_invalid"

    # any gated command: the gated path's state is missing, locked or tampered with
    NOT_INITIALIZED = "not_initialized"
    INVOCATION_LOCKED = "invocation_locked"
    LOCK_UNAVAILABLE = "lock_unavailable"
    NESTED_CALL_REFUSED = "nested_call_refused"
    STATE_TAMPERED = "state_tampered"
    VERIFIER_CHANGED_SINCE_INIT = "verifier_changed_since_init"
    TASK_CHANGED_SINCE_INIT = "task_changed_since_init"
    JOURNAL_SHORTENED = "journal_shortened"
    JOURNAL_REWRITTEN = "journal_rewritten"

    # dispatch: a worker cannot be dispatched
    DISPATCH_BUDGET_EXHAUSTED = "dispatch_budget_exhausted"
    FLASH_LANE_REFUSED_FOR_PRODUCTION = "flash_lane_refused_for_production"
    PREFLIGHT_RECEIPT_REQUIRED = "preflight_receipt_required"
    PREFLIGHT_RECEIPT_STALE = "preflight_receipt_stale"
    WORKER_COMMAND_MISSING = "worker_command_missing"
    WORKER_SPAWN_FAILED = "worker_spawn_failed"
    GIT_DIR_CHANGED = "git_dir_changed"

    # verify: the verifier cannot be run safely
    VERIFICATION_INPUT_CHANGED = "verification_input_changed"
    MODULE_SHADOW_DETECTED = "module_shadow_detected"
    UNSAFE_WORKSPACE_ENTRY = "unsafe_workspace_entry"
    SCOPE_VIOLATION = "scope_violation"
    UNSUPPORTED_SPECIAL_FILE = "unsupported_special_file"
    TREE_CHANGED_DURING_VERIFY = "tree_changed_during_verify"

    # accept: the work cannot be accepted
    RECEIPT_MISSING = "receipt_missing"
    RECEIPT_NOT_PASSING = "receipt_not_passing"
    RECEIPT_STALE = "receipt_stale"
    RECEIPT_TAMPERED = "receipt_tampered"
    RECEIPT_INVALID = "receipt_invalid"
    TAMPER_DETECTED = "tamper_detected"
    DISPATCH_AFTER_RECEIPT = "dispatch_after_receipt"
    ZERO_DISPATCH_NONDISCRIMINATING = "zero_dispatch_nondiscriminating"
    DETACHED_PAYLOAD = "detached_payload"
    SUSPICIOUS_CODE = "suspicious_code"

    # journal: an orphaned dispatch cannot be acknowledged
    UNKNOWN_DISPATCH_ID = "unknown_dispatch_id"
    DISPATCH_NOT_ORPHANED = "dispatch_not_orphaned"
    ALREADY_ACKNOWLEDGED = "already_acknowledged"

    # providers: a provider request cannot be built
    UNKNOWN_API_SHAPE = "unknown_api_shape"
    SETTING_UNSUPPORTED = "setting_unsupported"
    MODEL_ID_INVALID = "model_id_invalid"
    BASE_URL_INVALID = "base_url_invalid"
    CREDENTIAL_MALFORMED = "credential_malformed"
    TRANSPORT_INVALID = "transport_invalid"

    # catalog and model choice: the model catalog or a model choice is invalid
    CATALOG_INVALID = "catalog_invalid"
    UNKNOWN_MODEL = "unknown_model"
    MODEL_HAS_NO_WORKER = "model_has_no_worker"
    NO_MODEL_FOR_LANE = "no_model_for_lane"
    WORKER_CHOICE_CONFLICT = "worker_choice_conflict"
    RESUME_UNSUPPORTED = "resume_unsupported"
    STAGNATION_LIMIT_REACHED = "stagnation_limit_reached"

    # pricing and wire: the pricing file or a wire log is invalid
    PRICING_INVALID = "pricing_invalid"
    PRICING_DUPLICATE_KEY = "pricing_duplicate_key"
    PRICING_YAML_FORBIDDEN = "pricing_yaml_forbidden"
    PRICING_YAML_INVALID = "pricing_yaml_invalid"
    WIRE_RECORD_INVALID = "wire_record_invalid"
    WIRE_SEED_MISMATCH = "wire_seed_mismatch"
    WIRE_LOG_BROKEN = "wire_log_broken"
    WIRE_LOG_TAMPERED = "wire_log_tampered"
    WIRE_LOG_UNRECORDED = "wire_log_unrecorded"

    # proxy: the metering proxy cannot start
    PROXY_UPSTREAM_INVALID = "proxy_upstream_invalid"
    PROXY_NOT_LOOPBACK = "proxy_not_loopback"
    PROXY_PORT_UNAVAILABLE = "proxy_port_unavailable"
    ALLOWANCE_INVALID = "allowance_invalid"

    # record: `proctor record` cannot record the run
    PRICING_WITHOUT_WIRE = "pricing_without_wire"

    # sandbox: the bwrap sandbox cannot be used
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    SANDBOX_INVALID = "sandbox_invalid"

    # delegate: `proctor delegate` cannot run the task
    PRODUCTION_TASK_IN_MODEL_MODE = "production_task_in_model_mode"
    RESTORE_INCOMPLETE = "restore_incomplete"
    DELEGATE_TASK_EMPTY = "delegate_task_empty"
    TIMEOUT_INVALID = "timeout_invalid"

    # llm-edit worker: the llm-edit worker cannot start
    PROMPT_FILE_MISSING = "prompt_file_missing"
    SCOPE_INVALID = "scope_invalid"
    SCOPE_FILE_NOT_TEXT = "scope_file_not_text"
    REPAIR_TURNS_INVALID = "repair_turns_invalid"
    TESTS_ARGV_INVALID = "tests_argv_invalid"

    # agent arms: an arm's worker or its agent command template is invalid
    ARM_WORKER_UNKNOWN = "arm_worker_unknown"
    ARM_WORKER_INVALID = "arm_worker_invalid"
    AGENT_TEMPLATE_SHELL_STRING = "agent_template_shell_string"
    AGENT_TEMPLATE_SHELL_SYNTAX = "agent_template_shell_syntax"
    AGENT_TEMPLATE_EMPTY = "agent_template_empty"
    AGENT_TEMPLATE_PLACEHOLDER_UNKNOWN = "agent_template_placeholder_unknown"
    AGENT_TEMPLATE_INVALID = "agent_template_invalid"
    ARM_WORKER_NOT_REPO_TASK = "arm_worker_not_repo_task"

    # simulator: the provider simulator cannot start
    SIM_HOST_NOT_LOOPBACK = "sim_host_not_loopback"
    SIM_PORT_UNAVAILABLE = "sim_port_unavailable"
    SIM_LATENCY_SCALE_INVALID = "sim_latency_scale_invalid"
    SIM_SYSTEMS_INVALID = "sim_systems_invalid"
    SIM_SYSTEM_DUPLICATE_NAME = "sim_system_duplicate_name"
    SIM_ANSWERS_INVALID = "sim_answers_invalid"
    SIM_ANSWERS_DUPLICATE_MATCH = "sim_answers_duplicate_match"
    SIM_TASK_INVALID = "sim_task_invalid"
    SIM_TASKS_EMPTY = "sim_tasks_empty"

    # folders: a folder cannot be read
    FOLDER_MISSING = "folder_missing"
    NOT_A_FOLDER = "not_a_folder"
    FOLDER_UNREADABLE = "folder_unreadable"

    # eval suites: an eval suite, packet or private part is invalid
    PACKET_INVALID = "packet_invalid"
    PACKET_FORBIDDEN_KEY = "packet_forbidden_key"
    PACKET_DUPLICATE_ITEM = "packet_duplicate_item"
    PACKET_BLANK_RECORD = "packet_blank_record"
    PACKET_SHA256_MISMATCH = "packet_sha256_mismatch"
    PRIVATE_INVALID = "private_invalid"
    PRIVATE_SHA256_MISMATCH = "private_sha256_mismatch"
    PRIVATE_ITEMS_MISMATCH = "private_items_mismatch"
    SUITE_INVALID = "suite_invalid"
    SUITE_SOURCE_MISSING = "suite_source_missing"
    SUITE_SOURCE_MISMATCH = "suite_source_mismatch"
    SUITE_ITEM_UNKNOWN = "suite_item_unknown"
    SUITE_ITEM_UNVERIFIABLE = "suite_item_unverifiable"
    SUITE_KIND_UNKNOWN = "suite_kind_unknown"
    SUITE_PACKAGE_SPEC_INVALID = "suite_package_spec_invalid"
    SUITE_PACKAGE_UNKNOWN = "suite_package_unknown"
    SUITE_ITEM_CHANGED = "suite_item_changed"
    SUITE_SNAPSHOT_UNCLEAN = "suite_snapshot_unclean"

    # design: the study design is invalid
    DESIGN_INVALID = "design_invalid"
    UNKNOWN_STAGE = "unknown_stage"
    DRAFT_INVALID = "draft_invalid"
    DRAFT_FOLDER_EXISTS = "draft_folder_exists"
    DRAFT_UNKNOWN_SUITE = "draft_unknown_suite"
    CASCADE_SYSTEM_UNKNOWN = "cascade_system_unknown"
    CASCADE_TOO_SHORT = "cascade_too_short"
    CASCADE_NOT_REPO_TASK = "cascade_not_repo_task"

    # preregistration: the preregistration is not frozen, changed or invalid
    PREREG_NOT_FROZEN = "prereg_not_frozen"
    PREREG_CHANGED_SINCE_FREEZE = "prereg_changed_since_freeze"
    PREREG_ALREADY_FROZEN = "prereg_already_frozen"
    PREREG_UNEXPECTED_ENTRY = "prereg_unexpected_entry"
    PREREG_LOCKED = "prereg_locked"
    PREREG_TEXT_EMPTY = "prereg_text_empty"
    SYSTEMS_MANIFEST_INVALID = "systems_manifest_invalid"
    SYSTEMS_MANIFEST_MISMATCH = "systems_manifest_mismatch"
    SYSTEMS_CATALOG_MISMATCH = "systems_catalog_mismatch"
    SYSTEM_UNPRICED = "system_unpriced"
    FROZEN_INVALID = "frozen_invalid"
    AMENDMENTS_INVALID = "amendments_invalid"
    AMENDMENTS_COUNT_MISMATCH = "amendments_count_mismatch"
    AMENDMENT_EMPTY = "amendment_empty"
    AMENDMENT_REASON_EMPTY = "amendment_reason_empty"
    AMENDMENT_CHANGES_STUDY = "amendment_changes_study"
    AMENDMENT_NOTE_CHANGES_FILES = "amendment_note_changes_files"
    DRAW_EXCEEDS_PACKET = "draw_exceeds_packet"
    GO_INVALID = "go_invalid"
    GO_BY_EMPTY = "go_by_empty"

    # plan: the study plan is invalid
    PLAN_INVALID = "plan_invalid"
    PLAN_OUT_FORBIDDEN = "plan_out_forbidden"

    # attempts and resume: an attempt record or a resume is invalid
    ATTEMPT_INVALID = "attempt_invalid"
    ATTEMPT_UNKNOWN_RUN_ID = "attempt_unknown_run_id"
    ATTEMPT_REQUEST_CHANGED = "attempt_request_changed"
    ATTEMPT_NUMBERING_INVALID = "attempt_numbering_invalid"
    ATTEMPT_RESPONSE_HASH_MISMATCH = "attempt_response_hash_mismatch"
    ATTEMPT_AFTER_DELIVERY = "attempt_after_delivery"
    ATTEMPT_AFTER_FINAL = "attempt_after_final"
    ATTEMPT_LIMIT_EXCEEDED = "attempt_limit_exceeded"
    RESUME_STAGE_UNKNOWN = "resume_stage_unknown"
    RESUME_OUT_CONFLICT = "resume_out_conflict"

    # study runner: a stage cannot be run
    RUN_PLAN_CHANGED = "run_plan_changed"
    AMENDMENT_CHANGES_STAGE = "amendment_changes_stage"
    RUN_ARCHIVE_MISMATCH = "run_archive_mismatch"
    RUN_FINAL_INVALID = "run_final_invalid"
    RUN_LOG_INVALID = "run_log_invalid"
    RUN_PREFLIGHT_FAILED = "run_preflight_failed"
    GO_REQUIRED = "go_required"
    ENGINE_INVALID = "engine_invalid"
    ENGINE_UNAVAILABLE = "engine_unavailable"

    # report: the report cannot be built
    REPORT_REFUSED = "report_refused"

    # results folders: a results folder cannot be found
    RESULTS_NOT_FOUND = "results_not_found"
    RESULTS_MIXED = "results_mixed"
    PREREG_NOT_FOUND = "prereg_not_found"

    # local model: the local model server cannot be used
    LOCAL_MODEL_UNAVAILABLE = "local_model_unavailable"
    LOCAL_MODEL_PORT_UNAVAILABLE = "local_model_port_unavailable"
    LOCAL_MODEL_ALREADY_RUNNING = "local_model_already_running"
    LOCAL_MODEL_NOT_RUNNING = "local_model_not_running"
    LOCAL_MODEL_START_FAILED = "local_model_start_failed"
    LOCAL_MODEL_START_TIMEOUT = "local_model_start_timeout"
    LOCAL_MODEL_STATE_INVALID = "local_model_state_invalid"
    LOCAL_MODEL_FILE_INVALID = "local_model_file_invalid"

    # audit and anchors: an anchor cannot be written
    ANCHOR_REASON_INVALID = "anchor_reason_invalid"

    # analyze and batch: a notebook or batch cannot be run
    ANALYSIS_REFUSED = "analysis_refused"
    ANALYSIS_FAILED = "analysis_failed"
    BATCH_INVALID = "batch_invalid"
    BATCH_NOTEBOOK_MISSING = "batch_notebook_missing"
    NOTEBOOK_NOT_EXECUTED = "notebook_not_executed"
    KERNEL_NOT_PROJECT = "kernel_not_project"

    # CLI: the command line itself
    USAGE_ERROR = "usage_error"
    INTERNAL_ERROR = "internal_error"


def as_code(text: str) -> Code:
    """The `Code` spelt `text`, for a code read back from JSON; a text that is no code is kept as is."""
    member = Code._value2member_map_.get(text)
    return cast(Code, text) if member is None else cast(Code, member)


class Refusal(Exception):
    """A named, stable refusal of bad input or a forbidden action (exit code 3).

    `Refusal(code, ...)` gives an instance of the code's area class (e.g. a `LogRefusal` for
    `Code.LOG_BROKEN`), so `except LogRefusal` catches every refusal of its area. An area class
    keeps the `__name__` "Refusal" (its `__qualname__` is its own): `type(exc).__name__` is written
    into run logs, batch records and executed notebooks, and those bytes do not change.

    Args:
        code: the stable code (docs/refusals.md).
        message: what was wrong, for a person.
        path: the file or folder involved, if any.
        details: extra JSON-safe fields reported beside the refusal.
    """

    code: Code

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__name__ = "Refusal"

    def __new__(cls, code: Code, *args: Any, **kwargs: Any) -> Refusal:
        area_class = _CLASS_OF.get(code, cls)
        if cls is Refusal:
            return Exception.__new__(area_class)
        if not issubclass(cls, area_class):
            raise TypeError(f"refusal code {code!s} belongs to {area_class.__qualname__}, not {cls.__qualname__}")
        return Exception.__new__(cls)

    def __init__(
        self,
        code: Code,
        message: str,
        path: str | os.PathLike[str] | os.PathLike[bytes] | bytes | None = None,
        **details: Any,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = as_code(code)
        self.message = message
        self.path = None if path is None else _path_text(path)
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """The refusal object printed under `--json`."""
        out: dict[str, Any] = {"ok": False, "refusal": str(self.code), "message": self.message}
        if self.path is not None:
            out["path"] = self.path
        out.update(self.details)
        return out


class InputRefusal(Refusal):
    """A file, folder or amount of money that cannot be read as what it must be."""


class LogRefusal(Refusal):
    """A hash-chained log that cannot be read, verified or appended."""


class TreeRefusal(Refusal):
    """A folder tree that cannot be signed."""


class TaskRefusal(Refusal):
    """A task file that is invalid or changed."""


class GateRefusal(Refusal):
    """The gated path (init, dispatch, verify, accept, record, delegate) refuses."""


class WorkerRefusal(Refusal):
    """The sandbox or the llm-edit worker cannot run."""


class ProviderRefusal(Refusal):
    """A provider, the catalog, the simulator or the local model refuses."""


class MeterRefusal(Refusal):
    """Pricing, wire logs or the metering proxy refuse."""


class EvalRefusal(Refusal):
    """An eval suite, packet or private part that is invalid."""


class PreregRefusal(Refusal):
    """A design, preregistration or plan that is invalid, not frozen or changed."""


class RunRefusal(Refusal):
    """The stage runner, its attempts or a resume refuse."""


class AuditRefusal(Refusal):
    """The report, the results walk or an anchor refuse."""


class NotebookRefusal(Refusal):
    """An analysis notebook or a batch of notebooks cannot run."""


@dataclass(frozen=True)
class Area:
    """One row of docs/refusals.md: the codes of one area and the class that raises them."""

    title: str
    description: str
    refusal: type[Refusal]
    first: Code
    """The area's first code; its codes run in `Code`'s body up to the next area's first."""
    also: tuple[Code, ...] = ()  # codes of other areas this area raises too
    codes: tuple[Code, ...] = ()
    """Filled in by `_runs`."""


def _runs(*areas: Area) -> tuple[Area, ...]:
    """Each area with its `codes`: the run of `Code`'s body from its `first` to the next area's."""
    body = list(Code)
    starts = [body.index(area.first) for area in areas] + [len(body)]
    return tuple(replace(area, codes=tuple(body[a:b])) for area, (a, b) in zip(areas, pairwise(starts), strict=True))


AREAS: Final[tuple[Area, ...]] = _runs(
    Area("reading inputs", "a file or JSON input cannot be read as strict JSON", InputRefusal,
         Code.FILE_MISSING),
    Area("money", "a cost is not a valid amount of money", InputRefusal, Code.INVALID_COST),
    Area("chained logs", "a hash-chained log cannot be read, verified or appended", LogRefusal,
         Code.LOG_BROKEN, also=(Code.FOLDER_MISSING,)),
    Area("trees", "a folder tree cannot be signed", TreeRefusal, Code.WORKSPACE_MISSING),
    Area("task file", "the task file is invalid or changed", TaskRefusal, Code.TASK_INVALID),
    Area("init", "`proctor init` cannot set up the gated path", GateRefusal,
         Code.WORKSPACE_IS_NOT_REPO_ROOT),
    Area("any gated command", "the gated path's state is missing, locked or tampered with", GateRefusal,
         Code.NOT_INITIALIZED),
    Area("dispatch", "a worker cannot be dispatched", GateRefusal, Code.DISPATCH_BUDGET_EXHAUSTED),
    Area("verify", "the verifier cannot be run safely", GateRefusal,
         Code.VERIFICATION_INPUT_CHANGED),
    Area("accept", "the work cannot be accepted", GateRefusal, Code.RECEIPT_MISSING),
    Area("journal", "an orphaned dispatch cannot be acknowledged", GateRefusal,
         Code.UNKNOWN_DISPATCH_ID),
    Area("providers", "a provider request cannot be built", ProviderRefusal,
         Code.UNKNOWN_API_SHAPE),
    Area("catalog and model choice", "the model catalog or a model choice is invalid", ProviderRefusal,
         Code.CATALOG_INVALID),
    Area("pricing and wire", "the pricing file or a wire log is invalid", MeterRefusal,
         Code.PRICING_INVALID),
    Area("proxy", "the metering proxy cannot start", MeterRefusal, Code.PROXY_UPSTREAM_INVALID),
    Area("record", "`proctor record` cannot record the run", GateRefusal,
         Code.PRICING_WITHOUT_WIRE),
    Area("sandbox", "the bwrap sandbox cannot be used (dispatch, verify, delegate, evals verify, run)", WorkerRefusal,
         Code.SANDBOX_UNAVAILABLE),
    Area("delegate", "`proctor delegate` cannot run the task", GateRefusal,
         Code.PRODUCTION_TASK_IN_MODEL_MODE),
    Area("llm-edit worker", "the llm-edit worker cannot start", WorkerRefusal,
         Code.PROMPT_FILE_MISSING, also=(Code.SCOPE_EMPTY,)),
    Area("agent arms", "an arm's worker or its agent command template is invalid", WorkerRefusal,
         Code.ARM_WORKER_UNKNOWN),
    Area("simulator", "the provider simulator cannot start", ProviderRefusal,
         Code.SIM_HOST_NOT_LOOPBACK),
    Area("folders", "a folder cannot be read", InputRefusal, Code.FOLDER_MISSING),
    Area("eval suites", "an eval suite, packet or private part is invalid", EvalRefusal,
         Code.PACKET_INVALID),
    Area("design", "the study design is invalid", PreregRefusal, Code.DESIGN_INVALID),
    Area("preregistration", "the preregistration is not frozen, changed or invalid", PreregRefusal,
         Code.PREREG_NOT_FROZEN, also=(Code.UNKNOWN_MODEL,)),
    Area("plan", "the study plan is invalid", PreregRefusal, Code.PLAN_INVALID),
    Area("attempts and resume", "an attempt record or a resume is invalid", RunRefusal,
         Code.ATTEMPT_INVALID),
    Area("study runner", "a stage cannot be run", RunRefusal, Code.RUN_PLAN_CHANGED,
         also=(Code.INVOCATION_LOCKED, Code.PREREG_NOT_FROZEN, Code.PREREG_CHANGED_SINCE_FREEZE, Code.GO_INVALID)),
    Area("report", "the report cannot be built", AuditRefusal, Code.REPORT_REFUSED),
    Area("results folders", "a results folder cannot be found", AuditRefusal,
         Code.RESULTS_NOT_FOUND),
    Area("local model", "the local model server cannot be used", ProviderRefusal,
         Code.LOCAL_MODEL_UNAVAILABLE),
    Area("audit and anchors", "an anchor cannot be written", AuditRefusal,
         Code.ANCHOR_REASON_INVALID),
    Area("analyze and batch", "a notebook or batch cannot be run", NotebookRefusal,
         Code.ANALYSIS_REFUSED),
    Area("CLI", "the command line itself", Refusal, Code.USAGE_ERROR),
)
"""Every area, in the order of `Code`'s body; each code belongs to exactly one area."""

NOTES: Final[dict[Code, str]] = {
    Code.SANDBOX_UNAVAILABLE: "bwrap missing or unable to run here; says why",
    Code.SANDBOX_INVALID: "an unknown `PROCTOR_SANDBOX`",
    Code.REPORT_REFUSED: "lists every problem: file, line, rule",
    Code.ENGINE_INVALID: "an `--engine` other than local or ray, an `--address` without ray, or the ray engine for a suite kind it does not run",
    Code.ENGINE_UNAVAILABLE: "the `[ray]` extra is not installed, or the cluster has no node to run on",
    Code.LOCAL_MODEL_UNAVAILABLE: "the `[local]` extra is not installed",
    Code.LOCAL_MODEL_START_FAILED: "with the tail of the server's log",
    Code.LOCAL_MODEL_START_TIMEOUT: "with the tail of the server's log",
    Code.ANCHOR_REASON_INVALID: "`anchor_outputs` given a reason the audit would not accept",
    Code.ANALYSIS_REFUSED: "with `notebook_refusal`",
    Code.ANALYSIS_FAILED: "with `ename`, `evalue`",
    Code.BATCH_INVALID: "with `field`",
    Code.DRAFT_INVALID: "a new-study parameter, with `field`",
    Code.DRAFT_FOLDER_EXISTS: "a draft never writes over a folder that holds anything",
    Code.DRAFT_UNKNOWN_SUITE: "no `evals/<suite>/SUITE.json`, with `known`",
    Code.NOTEBOOK_NOT_EXECUTED: "`proctor anchor-notebook` given a file papermill did not execute, or one naming no stage",
    Code.KERNEL_NOT_PROJECT: "Jupyter finds a `proctor` kernelspec running another Python",
    Code.USAGE_ERROR: "exit 2",
    Code.INTERNAL_ERROR: "exit 4",
}
"""A few words beside a code in the docs' table."""

_CLASS_OF: Final[dict[str, type[Refusal]]] = {code: area.refusal for area in AREAS for code in area.codes}


def _path_text(path: str | os.PathLike[str] | os.PathLike[bytes] | bytes) -> str:
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "backslashreplace")
    try:
        data = raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate outside the surrogateescape range, e.g. from JSON
        return raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return data.decode("utf-8", "backslashreplace")


_DOC_HEAD = """\
# Refusal codes and exit codes

<!-- generated by `python -m harness.errors` from harness/errors.py; do not edit -->

| exit code | meaning |
|---|---|
| 0 | success |
| 1 | the thing checked failed (a verifier failed, a log is broken, an audit found a break) |
| 2 | usage error (`usage_error`) |
| 3 | refused: a refusal below |
| 4 | internal error (`internal_error`) |

A refusal is printed under `--json` as
`{"ok": false, "refusal": "<code>", "message": "...", "path": "..."}`, with any extra fields
beside it. Bad input never produces a traceback. In Python, a refusal is a `Refusal`
(`harness.errors`) whose `code` is a `Code`; each area's refusals are instances of its class.
An audit's break is exit 1 with `problems`, not a refusal; the simulator answers an unknown
model with an HTTP 404 body `model_not_found`, not a refusal.

| area | class | when | codes |
|---|---|---|---|
"""


def refusals_markdown() -> str:
    """docs/refusals.md: the exit codes, then one table row per area of `AREAS`."""
    rows = []
    for area in AREAS:
        codes = [f"`{c}`" + (f" ({NOTES[c]})" if c in NOTES else "") for c in area.codes]
        if area.also:
            codes.append("and " + ", ".join(f"`{c}`" for c in area.also))
        rows.append(f"| {area.title} | `{area.refusal.__qualname__}` | {area.description} | {', '.join(codes)} |\n")
    return _DOC_HEAD + "".join(rows)


if __name__ == "__main__":
    sys.stdout.write(refusals_markdown())
