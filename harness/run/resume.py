"""Resume: check an attempts log against its plan and schedule what each run is owed.

The manual: docs/running.md.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from harness.errors import Code, InputRefusal, LogRefusal, Refusal, RunRefusal
from harness.evidence.chain_read import read_log, seed_hash
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import canonical_bytes, canonical_line, sha256_hex
from harness.records.attempt import validate_attempt, validate_run_attempt
from harness.records.plan import Plan, PlanCell
from harness.run.attempts import read_plan

__all__ = [
    "ERROR_CLASSES",
    "MAX_TRANSPORT_RETRIES",
    "RESUME_HEADER_KIND",
    "RESUME_RUN_KIND",
    "STATES",
    "TRANSPORT_CODES",
    "AttemptsLog",
    "RunState",
    "load_attempts",
    "resume",
    "schedule",
    "schedule_lines",
]

RESUME_HEADER_KIND: Final = "resume-header.v1"
RESUME_RUN_KIND: Final = "resume-run.v1"
STATES: Final = ("delivered", "pending", "exhausted", "final_error")
MAX_TRANSPORT_RETRIES: Final = 3
"""At most three transport retries: four attempts in all."""

TRANSPORT_CODES: Final = ("transport", "timeout", "rate_limited", "server_error", "runner_lost")
ERROR_CLASSES: Final[Mapping[str, str]] = {
    **dict.fromkeys(TRANSPORT_CODES, "provider"),
    **dict.fromkeys(("auth", "billing", "quota"), "operator"),
    **dict.fromkeys(("context_length", "content_filter"), "model"),
    **dict.fromkeys(("bad_request", "malformed_response"), "inconclusive"),
    **dict.fromkeys(("AttemptDeadline", "harness_error"), "harness"),
    "budget_stop": "ceiling",
}
"""The failure class of every attempt error code."""

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class RunState:
    """Where one run stands.

    Attributes:
        state: one of `STATES`.
        next_attempt: the attempt number owed (pending only), else None.
        attempts: how many attempts the log holds for it.
        failure_class: the class of its last error (`ERROR_CLASSES`), else None.
        error_code: its last attempt's error code, else None.
        lines: the attempts log lines of its attempts, in order.
        rerun: in a runner's attempts log (records with `rerun`), the rerun these
            attempts belong to (the latest one logged); None in a plain log.
    """

    run_id: str
    state: str
    next_attempt: int | None
    attempts: int
    failure_class: str | None = None
    error_code: str | None = None
    lines: tuple[int, ...] = ()
    rerun: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The `resume-run.v1` line (with `rerun` when the log was a runner's)."""
        out: dict[str, Any] = {
            "kind": RESUME_RUN_KIND,
            "run_id": self.run_id,
            "state": self.state,
            "next_attempt": self.next_attempt,
            "attempts": self.attempts,
            "class": self.failure_class,
            "error_code": self.error_code,
        }
        if self.rerun is not None:
            out["rerun"] = self.rerun
        return out


def _is_repair(record: Mapping[str, Any]) -> bool:
    """A torn-tail repair the chained log recorded: evidence about the log, not an attempt."""
    return record.get("event") == "log_repair" and "kind" not in record


def _selected(plan: Plan, stage: str | None) -> dict[str, PlanCell]:
    if stage is None:
        return dict(plan.by_run_id)
    if stage not in plan.stages:
        known = ", ".join(repr(s) for s in plan.stages)
        raise RunRefusal(Code.RESUME_STAGE_UNKNOWN, f"the plan has no stage {stage!r} (it has {known})", plan.path)
    return {r.run_id: r for r in plan.requests if r.stage == stage}


def _check_line(
    record: Mapping[str, Any],
    line: int,
    plan: Plan,
    runs: Mapping[str, PlanCell],
    earlier: Sequence[tuple[int, Mapping[str, Any]]] | None,
    limit: int,
    path: str | None,
) -> None:
    """Check one valid attempt record against the plan and the run's earlier attempts."""
    run_id, number = record["run_id"], record["attempt"]

    def bad(message: str, code: Code) -> Refusal:
        return Refusal(code, f"line {line}: {message}", path, line=line, run_id=run_id, attempt=number)

    request = runs.get(run_id)
    if request is None or earlier is None:
        other = plan.by_run_id.get(run_id)
        why = "is not in the plan" if other is None else f"belongs to stage {other.stage!r}"
        raise bad(f"run id {run_id!r} {why}", Code.ATTEMPT_UNKNOWN_RUN_ID)
    if record["request_sha256"] != request.request_sha256:
        raise bad(
            f"request_sha256 {record['request_sha256']} is not the plan's {request.request_sha256}",
            Code.ATTEMPT_REQUEST_CHANGED,
        )
    if earlier:
        last = earlier[-1][1]
        if last["outcome"] == "delivered":
            raise bad(f"attempt {number} follows the delivered attempt {last['attempt']}", Code.ATTEMPT_AFTER_DELIVERY)
        if last["error_code"] not in TRANSPORT_CODES:
            raise bad(
                f"attempt {number} follows attempt {last['attempt']}'s final error {last['error_code']}",
                Code.ATTEMPT_AFTER_FINAL,
            )
        if len(earlier) >= limit:
            raise bad(
                f"attempt {number} follows {limit} transport-class errors (at most {limit} attempts)",
                Code.ATTEMPT_LIMIT_EXCEEDED,
            )
    if number != len(earlier) + 1:
        what = "repeats an earlier attempt" if number <= len(earlier) else "skips a number"
        raise bad(f"attempt {number} {what}: expected attempt {len(earlier) + 1}", Code.ATTEMPT_NUMBERING_INVALID)


_ANY_RERUN: Final = 2**31
"""The bound on `rerun` resume checks: the plan does not carry the registered reruns."""


def _rerun_of(record: Mapping[str, Any], line: int, path: str | None) -> int | None:
    """The record's rerun (a runner's attempts log), or None (a plain log); the record is validated."""
    if "rerun" not in record:
        validate_attempt(record, line, path=path)
        return None
    validate_run_attempt(record, line, reruns=_ANY_RERUN, path=path)
    rerun: int = record["rerun"]
    return rerun


def _check_rerun(record: Mapping[str, Any], line: int, rerun: int, current: int | None,
                 earlier: Sequence[tuple[int, Mapping[str, Any]]], path: str | None) -> bool:
    """Whether `record` starts the run's next rerun; refuses a rerun out of order or after a standing end."""
    base = 0 if current is None else current
    if rerun == base and (current is not None or rerun == 0):
        return False
    run_id, number = record["run_id"], record["attempt"]

    def bad(message: str, code: Code) -> Refusal:
        return Refusal(code, f"line {line}: {message}", path, line=line, run_id=run_id, attempt=number, rerun=rerun)

    if current is None or rerun != current + 1:
        expected = 0 if current is None else f"{current} or {current + 1}"
        raise bad(f"rerun {rerun} out of order: expected rerun {expected}", Code.ATTEMPT_NUMBERING_INVALID)
    if not earlier:  # a rerun's first attempt is logged before anything else of it
        raise bad(f"rerun {rerun} follows rerun {current}, which has no attempt", Code.ATTEMPT_NUMBERING_INVALID)
    last = earlier[-1][1]
    if last["outcome"] == "delivered":
        raise bad(f"rerun {rerun} follows rerun {current}'s delivered attempt {last['attempt']}",
                  Code.ATTEMPT_AFTER_DELIVERY)
    if ERROR_CLASSES.get(last["error_code"]) == "model":
        raise bad(f"rerun {rerun} follows rerun {current}'s model failure {last['error_code']} (it stands)",
                  Code.ATTEMPT_AFTER_FINAL)
    return True


def _state(run_id: str, history: Sequence[tuple[int, Mapping[str, Any]]], limit: int,
           rerun: int | None = None) -> RunState:
    state = _plain_state(run_id, history, limit)
    return state if rerun is None else replace(state, rerun=rerun)


def _plain_state(run_id: str, history: Sequence[tuple[int, Mapping[str, Any]]], limit: int) -> RunState:
    n = len(history)
    if n == 0:
        return RunState(run_id, "pending", 1, 0)
    lines = tuple(line for line, _ in history)
    last = history[-1][1]
    if last["outcome"] == "delivered":
        return RunState(run_id, "delivered", None, n, lines=lines)
    code = last["error_code"]
    cls = ERROR_CLASSES[code]
    if code not in TRANSPORT_CODES:
        return RunState(run_id, "final_error", None, n, cls, code, lines)
    if n < limit:
        return RunState(run_id, "pending", n + 1, n, cls, code, lines)
    return RunState(run_id, "exhausted", None, n, cls, code, lines)


def schedule(
    plan: Plan,
    attempts: Sequence[Mapping[str, Any]],
    *,
    stage: str | None = None,
    transport_retries: int = MAX_TRANSPORT_RETRIES,
    path: str | None = None,
) -> list[RunState]:
    """The state of every run of `plan` (of `stage`, when given) after `attempts`, in plan order.

    Args:
        plan: the plan the attempts were made for.
        attempts: the attempts log's records in log order (line i+1 is attempts[i]);
            recorded torn-tail repairs are skipped. A runner's own log (records
            with `rerun`) is read rerun by rerun: attempts are numbered within
            their rerun, a rerun starts after the previous one ended without a
            delivery or a model failure, and each run's state is its latest rerun's.
        stage: only this stage's runs (its own attempts log), or every run.
        transport_retries: the registered retries after a transport-class error, 0 to 3.
        path: the attempts log, named in refusals.

    Raises:
        Refusal: naming the first bad line (see the module docstring), or
            `resume_stage_unknown`.
    """
    if isinstance(transport_retries, bool) or not 0 <= transport_retries <= MAX_TRANSPORT_RETRIES:
        raise ValueError(f"transport_retries must be 0 to {MAX_TRANSPORT_RETRIES}")
    limit = transport_retries + 1
    runs = _selected(plan, stage)
    history: dict[str, list[tuple[int, Mapping[str, Any]]]] = {run_id: [] for run_id in runs}
    reruns: dict[str, int] = {}
    for line, record in enumerate(attempts, start=1):
        if isinstance(record, Mapping) and _is_repair(record):
            continue
        rerun = _rerun_of(record, line, path)
        earlier = history.get(record["run_id"])
        if rerun is not None and earlier is not None:
            if _check_rerun(record, line, rerun, reruns.get(record["run_id"]), earlier, path):
                earlier = history[record["run_id"]] = []
            reruns[record["run_id"]] = rerun
        _check_line(record, line, plan, runs, earlier, limit, path)
        assert earlier is not None
        earlier.append((line, record))
    return [_state(run_id, history[run_id], limit, reruns.get(run_id)) for run_id in runs]


# --------------------------------------------------------------------------
# I/O at the edges


@dataclass(frozen=True)
class AttemptsLog:
    """An attempts log read whole: its records, the sha256 of exactly the bytes verified, its head."""

    path: str
    seed: str | None
    records: list[dict[str, Any]]
    sha256: str
    head: str


def load_attempts(path: PathArg, expected_seed: str) -> AttemptsLog:
    """Read and verify a chained attempts log; its seed must be `expected_seed` (if it has a line)."""
    p = os.fspath(path)
    records = read_log(p)
    # Every verified line is canonical, so re-encoding the records gives back exactly the
    # bytes that were hashed and chained: the log is read once.
    lines = [canonical_bytes(r) for r in records]
    seed = records[0]["seed"] if records else None
    if seed is not None and seed != expected_seed:
        raise LogRefusal(
            Code.LOG_SEED_MISMATCH,
            f"line 1: the attempts log was started as {seed!r}, this plan's is {expected_seed!r}",
            p, line=1,
        )
    head = sha256_hex(lines[-1]) if lines else seed_hash(expected_seed)
    return AttemptsLog(p, seed, records, sha256_hex(b"".join(x + b"\n" for x in lines)), head)


def schedule_lines(
    plan: Plan, states: Sequence[RunState], log: AttemptsLog | None, *, stage: str | None, transport_retries: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The `resume-header.v1` object and the `resume-run.v1` objects of a schedule."""
    counts = Counter(s.state for s in states)
    classes = Counter(s.failure_class for s in states if s.state == "final_error")
    header: dict[str, Any] = {
        "kind": RESUME_HEADER_KIND,
        "study": plan.study,
        "scope": plan.scope,
        "stage": stage,
        "plan_sha256": plan.sha256,
        "attempts_seed": plan.attempts_seed(stage),
        "transport_retries": transport_retries,
        "max_attempts": transport_retries + 1,
        "runs": len(states),
        "counts": {state: counts.get(state, 0) for state in STATES},
        "final_error_classes": dict(sorted((str(k), v) for k, v in classes.items())),
    }
    if log is not None:
        header.update(attempts_sha256=log.sha256, attempts_lines=len(log.records), attempts_head=log.head)
    return header, [s.to_json() for s in states]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _write(out: str, data: bytes) -> None:
    try:
        atomic_write(out, data, mode=0o644)
    except FileNotFoundError:
        raise InputRefusal(Code.FOLDER_MISSING, "the output's folder does not exist", out) from None
    except IsADirectoryError:
        raise InputRefusal(Code.NOT_A_REGULAR_FILE, "the output is a folder", out) from None
    except PermissionError:
        raise LogRefusal(Code.FILE_UNWRITABLE, "permission denied", out) from None


def resume(
    plan_path: PathArg,
    attempts_path: PathArg | None,
    out_path: PathArg,
    *,
    stage: str | None = None,
    transport_retries: int = MAX_TRANSPORT_RETRIES,
) -> dict[str, Any]:
    """Check the attempts log against the plan and write the schedule to `out_path` atomically.

    Args:
        plan_path: the plan file.
        attempts_path: the chained attempts log, or None before any attempt was made.
        out_path: where the canonical JSONL schedule goes (never the plan or the log).
        stage: schedule only this stage's runs; the log's seed must then name it.
        transport_retries: the registered retries after a transport-class error (0 to 3).

    Returns:
        The result printed by `proctor resume`: the hashes and the counts.
    """
    out = os.fspath(out_path)
    inputs = [os.fspath(plan_path)] + ([] if attempts_path is None else [os.fspath(attempts_path)])
    if any(os.path.abspath(out) == os.path.abspath(p) or _same_file(out, p) for p in inputs):
        raise RunRefusal(Code.RESUME_OUT_CONFLICT, "the output would overwrite an input", out)
    plan = read_plan(plan_path)
    _selected(plan, stage)  # an unknown stage is named before the log's seed is compared
    log = None if attempts_path is None else load_attempts(attempts_path, plan.attempts_seed(stage))
    states = schedule(
        plan, [] if log is None else log.records, stage=stage,
        transport_retries=transport_retries, path=None if log is None else log.path,
    )
    header, runs = schedule_lines(plan, states, log, stage=stage, transport_retries=transport_retries)
    data = b"".join(canonical_line(obj) for obj in (header, *runs))
    _write(out, data)
    result: dict[str, Any] = {
        "ok": True,
        "out": out,
        "schedule_sha256": sha256_hex(data),
        **{k: v for k, v in header.items() if k != "kind"},
    }
    return result
