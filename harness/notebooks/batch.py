"""`proctor batch`: parameterised notebooks run in order with papermill, stopping at the first failure.

The manual: docs/notebooks.md.
"""

from __future__ import annotations

import contextlib
import keyword
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, NotebookRefusal, Refusal
from harness.evidence.jsonio import loads_strict, read_bytes, read_json
from harness.notebooks.stage import kernel_pid

__all__ = ["BatchJob", "load_batch", "run_batch"]

PathArg = str | os.PathLike[str]

_BATCH_KEYS: Final = frozenset({"jobs"})
_JOB_KEYS: Final = frozenset({"notebook", "out", "parameters", "cwd"})
_REQUIRED: Final = ("notebook", "out", "parameters")
_MAX_BATCH_BYTES: Final = 4 * 1024 * 1024
_MAX_NOTEBOOK_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class BatchJob:
    """One job of a batch: run `notebook` with `parameters` into `out`, the kernel in `cwd`.

    Attributes:
        number: the job's place in the batch, from 1.
        notebook: the notebook's absolute path.
        out: the executed copy's absolute path.
        parameters: the papermill parameters, as given.
        cwd: the kernel's working folder (absolute).
        shown: `notebook -> out` as written in the batch file, for progress lines.
    """

    number: int
    notebook: str
    out: str
    parameters: Mapping[str, Any]
    cwd: str
    shown: str


def _invalid(path: str, field: str, message: str, code: Code = Code.BATCH_INVALID) -> Refusal:
    return Refusal(code, f"{field}: {message}", path, field=field)


def _text(value: Any, path: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise _invalid(path, field, "must be a non-empty path")
    return value


def _declared_parameters(notebook: str, path: str, field: str) -> set[str]:
    import papermill

    doc = loads_strict(read_bytes(notebook, max_bytes=_MAX_NOTEBOOK_BYTES), path=notebook)
    if not isinstance(doc.get("cells"), list) or doc.get("nbformat") != 4:
        raise _invalid(path, field, f"{notebook} is not a version 4 notebook (no list of cells)")
    try:
        return set(papermill.inspect_notebook(notebook))
    except Exception as exc:  # papermill's reader: a notebook it cannot parse
        raise _invalid(path, field, f"{notebook} is not a notebook papermill can read: {exc}") from None


def _job(raw: Any, index: int, path: str, folder: str) -> BatchJob:
    where = f"jobs[{index}]"
    if not isinstance(raw, dict):
        raise _invalid(path, where, f"must be an object, found {type(raw).__name__}")
    unknown = sorted(set(raw) - _JOB_KEYS)
    if unknown:
        raise _invalid(path, f"{where}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(_JOB_KEYS))})")
    for key in _REQUIRED:
        if key not in raw:
            raise _invalid(path, f"{where}.{key}", "missing")
    notebook_text = _text(raw["notebook"], path, f"{where}.notebook")
    out_text = _text(raw["out"], path, f"{where}.out")
    params = raw["parameters"]
    if not isinstance(params, dict):
        raise _invalid(path, f"{where}.parameters", f"must be an object, found {type(params).__name__}")
    for name in params:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise _invalid(path, f"{where}.parameters.{name}", "not a Python name")
    cwd = os.path.normpath(os.path.join(folder, _text(raw["cwd"], path, f"{where}.cwd"))) if "cwd" in raw else folder
    if "cwd" in raw and not os.path.isdir(cwd):
        raise _invalid(path, f"{where}.cwd", f"{cwd} is not a folder")
    notebook = os.path.normpath(os.path.join(folder, os.path.expanduser(notebook_text)))
    if not os.path.isfile(notebook):
        raise NotebookRefusal(Code.BATCH_NOTEBOOK_MISSING, f"{where}.notebook: no notebook at {notebook}", notebook,
                      field=f"{where}.notebook")
    out = os.path.normpath(os.path.join(folder, os.path.expanduser(out_text)))
    if not out.endswith(".ipynb"):
        raise _invalid(path, f"{where}.out", "the executed copy must end in .ipynb")
    if os.path.realpath(out) == os.path.realpath(notebook):
        raise _invalid(path, f"{where}.out", "would overwrite the notebook itself")
    declared = _declared_parameters(notebook, path, f"{where}.notebook")
    for name in params:
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none: it has no cell tagged parameters"
            raise _invalid(path, f"{where}.parameters.{name}", f"not a parameter of {notebook_text} ({known})")
    return BatchJob(index + 1, notebook, out, dict(params), cwd, f"{notebook_text} -> {out_text}")


def load_batch(path: PathArg) -> list[BatchJob]:
    """Read and check a batch file whole (see the module docstring); the jobs in order.

    Raises:
        Refusal: the strict reader's refusals (`invalid_json`, `json_duplicate_key`, ...),
            `batch_invalid` with `field` (the JSON path of the bad field) or
            `batch_notebook_missing`.
    """
    where = os.path.abspath(os.fspath(path))
    doc = read_json(where, max_bytes=_MAX_BATCH_BYTES).value
    unknown = sorted(set(doc) - _BATCH_KEYS)
    if unknown:
        raise _invalid(where, unknown[0], "unknown key (a batch file holds only jobs)")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise _invalid(where, "jobs", "must be a list of jobs")
    if not jobs:
        raise _invalid(where, "jobs", "is empty: nothing to run")
    folder = os.path.dirname(where)
    out = [_job(raw, i, where, folder) for i, raw in enumerate(jobs)]
    seen: dict[str, int] = {}
    for job in out:
        key = os.path.realpath(job.out)
        if key in seen:
            raise _invalid(where, f"jobs[{job.number - 1}].out",
                           f"job {seen[key]} already writes {job.out}")
        seen[key] = job.number
    return out


def _error_fields(exc: BaseException) -> tuple[str, str]:
    ename = getattr(exc, "ename", None)
    evalue = getattr(exc, "evalue", None)
    if isinstance(ename, str) and isinstance(evalue, str):
        return ename, evalue
    return type(exc).__name__, str(exc)


def run_batch(
    path: PathArg,
    *,
    progress: Callable[[str], None] | None = None,
    on_exit: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every job of the batch file at `path` in order, stopping at the first failure.

    Args:
        path: the batch file.
        progress: called with whole lines (ending in a newline): as a job starts
            (`[2/5] a.ipynb -> b.ipynb ...`) and as it ends (`[2/5] a.ipynb -> b.ipynb ... ok 3.2 s`,
            `... FAILED ValueError`, `... INTERRUPTED StageInterrupted`); whole lines, because the kernel
            writes to the same stderr.
        on_exit: called with the stop record when a second signal exits the process at once
            (with 128 + the signal number).

    Signals (when called from the main thread): the first SIGINT/SIGTERM is forwarded to the
    running kernel as an interrupt, which the run notebook turns into the runner's graceful
    stop; the job ends interrupted (its executed copy kept as `<stem>.interrupted-<n>.ipynb`
    and anchored), no later job runs, and the result has `stopped: interrupt`. A second
    signal interrupts the kernel again (it exits at once) and ends this process at once.

    Returns:
        `{"ok": True, "batch", "jobs": [{job, notebook, out, sha256, anchored, seconds}]}`, or
        `{"ok": False, ..., "failed": {job, notebook, executed, ename, evalue}}` with the jobs
        that ran before it (the CLI's exit 1).

    Raises:
        Refusal: a bad batch file (`load_batch`), before any job runs; an anchor that
            could not be written after a job succeeded (named with the job's number).
    """
    batch = os.path.abspath(os.fspath(path))
    jobs = load_batch(batch)
    state = _BatchState(batch, len(jobs))
    if threading.current_thread() is not threading.main_thread():
        return _run_jobs(jobs, state, progress or (lambda _line: None))
    outcome: list[dict[str, Any] | BaseException] = []

    def target() -> None:
        try:
            outcome.append(_run_jobs(jobs, state, progress or (lambda _line: None)))
        except BaseException as exc:
            outcome.append(exc)

    def handler(signum: int, frame: Any) -> None:
        state.signals += 1
        for manager in list(state.kernels):
            pid = kernel_pid(manager)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
        if state.signals >= 2:
            try:
                if on_exit is not None:
                    on_exit(state.exit_record(signum))
            finally:
                os._exit(128 + signum)

    worker = threading.Thread(target=target, name="proctor-batch", daemon=True)
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.start()
        while worker.is_alive():
            worker.join(timeout=0.2)
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


class _BatchState:
    """What the signal handler needs: the kernels started, the signals seen, the jobs done."""

    def __init__(self, batch: str, n_jobs: int) -> None:
        self.batch = batch
        self.n_jobs = n_jobs
        self.kernels: list[Any] = []
        self.signals = 0
        self.done: list[dict[str, Any]] = []
        self.job = 0

    def exit_record(self, signum: int) -> dict[str, Any]:
        return {"ok": False, "exit_code": 128 + signum, "batch": self.batch, "stopped": "second_signal",
                "signum": signum, "job": self.job, "jobs": list(self.done),
                "note": f"exited at once during job {self.job} of {self.n_jobs}: its kernel was interrupted "
                        "twice and exits at once; run the batch again to resume the stage"}


def _run_jobs(jobs: list[BatchJob], state: _BatchState, say: Callable[[str], None]) -> dict[str, Any]:
    from harness.notebooks.stage import execute_and_anchor

    done = state.done
    for job in jobs:
        if state.signals:
            return {"ok": False, "batch": state.batch, "jobs": done, "stopped": "interrupt",
                    "message": f"interrupted before job {job.number} of {len(jobs)}; later jobs did not run"}
        state.job = job.number
        head = f"[{job.number}/{len(jobs)}] {job.shown} ..."
        say(f"{head}\n")
        start = time.monotonic()
        try:
            got = execute_and_anchor(job.notebook, job.out, job.parameters, cwd=job.cwd, kernels=state.kernels)
        except Refusal as exc:
            say(f"{head} REFUSED {exc.code}\n")
            raise Refusal(exc.code, f"job {job.number} ({job.shown}): {exc.message}", exc.path,
                          **{**exc.details, "job": job.number}) from None
        except Exception as exc:  # a dead kernel, a missing kernel: the job failed
            return _failed(job, len(jobs), state, exc, job.out if os.path.exists(job.out) else None, say, head)
        if got.error is not None:  # a cell raised (papermill's execution error)
            return _failed(job, len(jobs), state, got.error, got.path, say, head)
        seconds = time.monotonic() - start
        say(f"{head} ok {seconds:.1f} s\n")
        done.append({"job": job.number, "notebook": job.notebook, "out": got.path, "sha256": got.sha256,
                     "anchored": got.anchor is not None, "seconds": round(seconds, 3)})
    return {"ok": True, "batch": state.batch, "jobs": done}


def _failed(job: BatchJob, n_jobs: int, state: _BatchState, exc: BaseException, executed: str | None,
            say: Callable[[str], None], head: str) -> dict[str, Any]:
    ename, evalue = _error_fields(exc)
    say(f"{head} {'INTERRUPTED' if state.signals else 'FAILED'} {ename}\n")
    failed = {"job": job.number, "notebook": job.notebook, "executed": executed, "ename": ename, "evalue": evalue}
    out = {"ok": False, "batch": state.batch, "jobs": state.done, "failed": failed,
           "message": f"job {job.number} of {n_jobs} failed ({job.shown}): {ename}: "
                      f"{evalue.splitlines()[0] if evalue else ''}; later jobs did not run"}
    if state.signals:
        out["stopped"] = "interrupt"
    return out
