"""What `notebooks/run_study.ipynb` calls besides its tables (`display`): the progress display, the checks, papermill.

The manual: docs/notebooks.md.
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import AuditRefusal, Code, Refusal, as_code
from harness.evidence.chain_read import read_log
from harness.evidence.clock import Clock
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import loads_strict, read_bytes, sha256_hex
from harness.evidence.lock import InvocationLock
from harness.evidence.paths import repo_root, resolve
from harness.evidence.portable import shown_path
from harness.notebooks import lab
from harness.notebooks.display import Table, progress_table
from harness.run.anchors import OUTPUT_REASONS, output_manifest_name
from harness.run.layout import LOGS, log_seed, stage_folder
from harness.run.summary import RunProgress, RunSummary

__all__ = [
    "INTERRUPTED_ENAMES",
    "KERNEL_NAME",
    "ExecutedNotebook",
    "PapermillRun",
    "PreflightFailed",
    "StageIncomplete",
    "StageInterrupted",
    "anchor_executed",
    "anchor_notebook",
    "anchor_outputs",
    "execute_and_anchor",
    "execute_notebook",
    "interrupted_name",
    "kernel_pid",
    "require_complete",
    "require_preflight",
    "run_papermill",
    "run_with_progress",
    "study_base_urls",
]

KERNEL_NAME: Final = lab.KERNEL_NAME
"""The kernel papermill starts, as JupyterLab does: `proctor`, this environment's Python
(`harness.notebooks.lab.project_kernel` installs it into sys.prefix when missing)."""

_MAX_NOTEBOOK_BYTES: Final = 256 * 1024 * 1024


class StageIncomplete(Exception):
    """A run ended without a standing final for every cell (`proctor run` would exit 1).

    Raised by `require_complete` so that papermill exits non-zero; the files are
    intact and running the same notebook again resumes the stage.
    """


class StageInterrupted(StageIncomplete):
    """A run stopped by a signal (an interrupt of the kernel, SIGINT/SIGTERM to `proctor batch` or
    papermill): what was under way finished and was saved; running the same notebook again resumes.
    `execute_notebook` keeps the executed copy under its own name (`<stem>.interrupted-<n>.ipynb`)."""


class PreflightFailed(Exception):
    """The preflight found a problem that would stop the run (an unreachable endpoint, a missing
    credential, a spent budget...): raised by `require_preflight` before any provider call."""


# --------------------------------------------------------------------------
# Paths


def study_base_urls(prereg_dir: str | os.PathLike[str], base_url: str) -> dict[str, str] | None:
    """`{catalog id: base_url}` for every system's model in the design; None when `base_url` is empty.

    Raises the design reader's refusal when `design.toml` cannot be read.
    """
    if not base_url:
        return None
    from harness.prereg.design import load_design

    design = load_design(os.path.join(os.fspath(prereg_dir), "design.toml"))
    return {s.model: base_url for s in design.systems}


def require_preflight(summary: RunSummary, *, dry_run: bool) -> None:
    """Stop a real run (not a dry run) whose preflight found a problem, before any provider call.

    Raises the refusal the run itself would raise (`Refusal`, e.g. `prereg_not_frozen`) when a
    problem carries one, else `PreflightFailed` naming every problem.
    """
    if dry_run or summary.ok:
        return
    for p in summary.problems:
        if p.get("refusal"):
            raise Refusal(as_code(str(p["refusal"])), str(p.get("message")), p.get("path"))
    said = "; ".join(f"{p.get('check')}: {p.get('message')}" for p in summary.problems) or "no problem named"
    raise PreflightFailed(f"the preflight of stage {summary.stage} found {len(summary.problems)} problem(s), "
                          f"nothing was run: {said}")


def require_complete(summary: RunSummary) -> None:
    """Raise `StageIncomplete` when a run (not a dry run or preflight) did not complete (`StageInterrupted`
    when a signal stopped it)."""
    if summary.mode == "run" and summary.exit_code != 0:
        if any(s.get("cause") == "interrupt" for s in summary.stops):
            raise StageInterrupted(f"stage {summary.stage} of {summary.study} was interrupted: admission stopped, "
                                   f"the attempts under way finished and were saved; run the same notebook "
                                   f"again to resume")
        causes = ", ".join(f"{s.get('system') or 'all'}: {s.get('cause')}" for s in summary.stops) or "none logged"
        raise StageIncomplete(f"stage {summary.stage} of {summary.study} did not complete (stops: {causes}); "
                              f"run the same notebook again to resume")


# --------------------------------------------------------------------------
# Running a stage with a progress display


def run_with_progress(
    prereg_dir: str | os.PathLike[str],
    stage: str,
    results_dir: str | os.PathLike[str],
    *,
    show: Callable[[Table], Any],
    base_urls: Mapping[str, str] | None = None,
    resume_paused: bool = False,
    every_s: float = 0.5,
    engine: str = "local",
    address: str | None = None,
) -> RunSummary:
    """`run_stage` on a worker thread while this thread shows `progress_table` at most every `every_s`.

    The display is updated from the calling thread (a kernel's main thread), so its
    output belongs to the calling cell. A `Refusal` (or any error) from the runner
    is raised here. A KeyboardInterrupt (papermill's or Jupyter's interrupt) or a
    SIGTERM while the run is under way is the runner's first signal: admission stops,
    attempts under way finish, the run logs its stop and end and anchors, and the
    summary is returned (not complete: `require_complete` raises `StageInterrupted`).
    A second one exits the process at once (128 + the signal number), as `proctor run`.
    """
    from harness.run.runner import run_stage
    from harness.run.upkeep import Interrupts

    latest: list[RunProgress] = []
    guard = threading.Lock()
    outcome: list[RunSummary | BaseException] = []
    interrupts = Interrupts()

    def record(progress: RunProgress) -> None:
        with guard:
            latest[:] = [progress]

    finished = threading.Event()  # not Thread.join: a KeyboardInterrupt in join can leave the thread "stopped"

    def target() -> None:
        try:
            outcome.append(run_stage(prereg_dir, stage, results_dir, resume_paused=resume_paused,
                                     base_urls=base_urls, progress=record, interrupts=interrupts,
                                     engine=engine, address=address))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            finished.set()

    shown: RunProgress | None = None
    worker = threading.Thread(target=target, name="proctor-notebook-run", daemon=True)
    with _terminate_as_interrupt(), _orphan_as_interrupt(interrupts, finished):
        worker.start()
        while not finished.is_set():
            try:
                finished.wait(timeout=every_s)
                with guard:
                    now = latest[0] if latest else None
                if now is not None and now is not shown:
                    show(progress_table(now))
                    shown = now
            except KeyboardInterrupt:
                interrupts.deliver(int(signal.SIGINT))
            except _Terminated as got:
                if interrupts.count == 0:  # after an interrupt it is papermill's shutdown, not a second signal
                    interrupts.deliver(got.signum)
    interrupts.detach()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    show(progress_table(result.progress))
    return result


@contextlib.contextmanager
def _orphan_as_interrupt(interrupts: Any, finished: threading.Event) -> Iterator[None]:
    """ipykernel's parent poller ends a kernel whose parent (papermill, killed by SIGTERM) has gone, with
    `os._exit` within a second. While a run is under way that is the run's first signal (SIGTERM) instead,
    and the kernel exits once the run has stopped gracefully (logged its stop and end, anchored)."""
    try:
        from ipykernel import parentpoller
    except ImportError:  # not in a kernel
        yield
        return
    real = os  # the module the poller calls `os._exit` on

    class _Os:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def _exit(self, code: int) -> None:
            if interrupts.count == 0:
                interrupts.deliver(int(signal.SIGTERM))
            finished.wait()
            real._exit(code)

    setattr(parentpoller, "os", _Os())  # noqa: B010 (a module's global, replaced while the run is under way)
    try:
        yield
    finally:
        setattr(parentpoller, "os", real)  # noqa: B010


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """In the main thread, SIGTERM raises `_Terminated` (as SIGINT raises KeyboardInterrupt) while a run is
    under way; papermill's own shutdown sends it after interrupting the kernel, and then it is not counted
    again (the kernel's first interrupt already stopped the run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------
# papermill and the anchor of an executed copy


def _notebook_defaults(notebook: str) -> dict[str, Any]:
    import papermill

    found = papermill.inspect_notebook(notebook)
    out: dict[str, Any] = {}
    for name, info in found.items():
        try:
            out[name] = ast.literal_eval(str(info.get("default")))
        except (ValueError, SyntaxError):
            continue
    return out


def _last_time(folder: str, study: str, stage: str) -> float:
    latest = 0.0
    for name in ("anchors", "run"):
        path = os.path.join(folder, f"{name}.jsonl")
        if os.path.lexists(path):
            for rec in read_log(path, log_seed(study, stage, name)):
                at = rec.get("at")
                if isinstance(at, (int, float)) and not isinstance(at, bool):
                    latest = max(latest, float(at))
    return latest


def anchor_outputs(
    folder: str, study: str, stage: str, reason: str, named: Mapping[str, str | os.PathLike[str]],
    *, prereg: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Append one `anchor.v1` record with `named` ({manifest name: path}) to the stage's `anchors.jsonl`.

    The record also anchors every chained log of the stage (lines and head), is
    written under the stage's invocation lock (`invocation_locked` while a run
    holds it) and at a time no earlier than any time in the anchor and run logs.
    When the stage's design registers `run.anchor_remote`, a snapshot of the stage
    folder is then pushed there (synchronously, still under the lock, never forced),
    so `proctor audit` has a witness of this anchor line too.

    Args:
        reason: one of `OUTPUT_REASONS` (the audit refuses any other in an anchor).
        prereg: the preregistration folder whose design may register a remote; default:
            the one under `<repository root>/prereg/` whose FROZEN.json has the sha256 the
            stage's plan records (no push when none is found).

    Returns:
        The record as appended; with a registered remote, plus `push`: the push's
        outcome (`ok`, `commit` or `error`). A failed push keeps the anchor.
    """
    from harness.evidence.chain import ChainedLog
    from harness.run.anchor_push import push_stage
    from harness.run.anchors import anchor_record

    if reason not in OUTPUT_REASONS:
        raise AuditRefusal(Code.ANCHOR_REASON_INVALID, f"reason {reason!r} is not one of {', '.join(OUTPUT_REASONS)}",
                      os.path.join(folder, "anchors.jsonl"))
    remote = _registered_remote(folder, prereg)
    with InvocationLock(os.path.join(folder, ".invocation.lock")):
        at = Clock(floor=_last_time(folder, study, stage)).now()
        logs = {log: (os.path.join(folder, f"{log}.jsonl"), log_seed(study, stage, log))
                for log in LOGS if log != "anchors"}
        record = anchor_record(at, reason, logs, {name: os.fspath(p) for name, p in named.items()})
        written = ChainedLog(os.path.join(folder, "anchors.jsonl"), log_seed(study, stage, "anchors")).append(record)
        if remote is None:
            return written
        outcome = push_stage(folder, f"{study}/{stage}", remote[0], label=reason, timeout_s=remote[1])
    return {**written, "push": outcome}


def _registered_remote(folder: str, prereg: str | os.PathLike[str] | None) -> tuple[str, float] | None:
    """(the resolved `run.anchor_remote`, its timeout) of the stage's design, or None when none is registered."""
    from harness.audit.results import find_prereg
    from harness.prereg.design import load_design
    from harness.run.anchor_push import resolve_remote
    from harness.run.attempts import read_plan

    if prereg is None:
        try:
            frozen = read_plan(os.path.join(folder, "plan.jsonl")).header.get("frozen_sha256")
            prereg = find_prereg(str(frozen), repo_root())
        except Refusal:
            return None
    design = load_design(os.path.join(os.fspath(prereg), "design.toml"))
    if design.run.anchor_remote is None:
        return None
    return resolve_remote(design.run.anchor_remote, design.path), design.run.anchor_timeout_s


def anchor_notebook(folder: str, study: str, stage: str, executed: str | os.PathLike[str]) -> dict[str, Any]:
    """Append the `notebook` anchor of an executed copy to the stage's `anchors.jsonl`; returns the record."""
    return anchor_outputs(folder, study, stage, "notebook",
                          {output_manifest_name(folder, executed, "notebook"): executed})


def execute_notebook(
    notebook: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    parameters: Mapping[str, Any],
    *,
    cwd: str | os.PathLike[str],
) -> dict[str, Any]:
    """Run `notebook` with papermill into `out_path` and anchor the executed copy's sha256.

    Args:
        notebook: the parameterised notebook (e.g. `notebooks/run_study.ipynb`).
        out_path: where the executed copy goes, normally inside the stage's results folder.
        parameters: papermill parameters (paths may be `os.PathLike`); `prereg`, `stage`
            and `results` (the notebook's defaults where missing, relative paths taken
            from the repository root found from `cwd`) name the stage folder whose
            `anchors.jsonl` gets the anchor.
        cwd: the kernel's working folder.

    Returns:
        `{"ok": True, "notebook": out path, "sha256": ..., "anchor": the anchor record or None}`.

    Raises:
        papermill.PapermillExecutionError: a cell raised (a refusal, an incomplete run),
            after the executed copy was saved and anchored (when its stage folder exists
            and is not held by a run); an interrupted run's copy is first moved to
            `<stem>.interrupted-<n>.ipynb` (`execute_and_anchor`).
        Refusal: the anchor could not be written after a successful execution.
    """
    got = execute_and_anchor(notebook, out_path, parameters, cwd=cwd)
    if got.error is not None:
        raise got.error
    return {"ok": True, "notebook": got.path, "sha256": got.sha256, "anchor": got.anchor}


INTERRUPTED_ENAMES: Final = frozenset({"StageInterrupted", "KeyboardInterrupt"})
"""A cell error with one of these names is an interrupted run: its executed copy is kept under its own name."""


@dataclass(frozen=True)
class ExecutedNotebook:
    """A notebook executed by papermill and anchored (`execute_and_anchor`).

    Attributes:
        path: the executed copy as kept (absolute): the `out_path` asked for, or
            `<stem>.interrupted-<n>.ipynb` beside it when the run was interrupted.
        sha256: the sha256 of its bytes.
        anchor: the `anchor.v1` record appended to the stage's `anchors.jsonl`, or None.
        error: the cell error (`papermill.PapermillExecutionError`), or None.
        interrupted: the cell error is an interrupt (`INTERRUPTED_ENAMES`).
    """

    path: str
    sha256: str
    anchor: dict[str, Any] | None
    error: Exception | None
    interrupted: bool


def interrupted_name(out_path: str | os.PathLike[str]) -> str:
    """`<stem>.interrupted-<n>.ipynb` beside `out_path`, with the first n (from 1) not taken."""
    out = os.path.abspath(os.fspath(out_path))
    stem = out[:-len(".ipynb")] if out.endswith(".ipynb") else out
    n = 1
    while os.path.lexists(f"{stem}.interrupted-{n}.ipynb"):
        n += 1
    return f"{stem}.interrupted-{n}.ipynb"


def execute_and_anchor(
    notebook: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    parameters: Mapping[str, Any],
    *,
    cwd: str | os.PathLike[str],
    kernels: list[Any] | None = None,
) -> ExecutedNotebook:
    """`execute_notebook` without raising the cell error: it is returned in `error`.

    An interrupted run's executed copy is moved to `interrupted_name(out_path)` before it is
    anchored, so that the resume's executed copy (at `out_path`) never replaces it.

    Raises:
        Refusal: the anchor could not be written after a successful execution.
    """
    run = run_papermill(notebook, out_path, parameters, cwd=cwd, kernels=kernels)
    ename = getattr(run.error, "ename", None)
    interrupted = run.error is not None and ename in INTERRUPTED_ENAMES
    path = run.path
    if interrupted:
        path = interrupted_name(run.path)
        os.rename(run.path, path)
    try:
        given = {**_notebook_defaults(os.path.abspath(os.fspath(notebook))), **run.parameters}
        anchor = _anchor_for(given, path, cwd)
    except Refusal:
        if run.error is None:
            raise
        anchor = None  # the notebook's own error is the one to report
    return ExecutedNotebook(path, run.sha256, anchor, run.error, interrupted)


@dataclass(frozen=True)
class PapermillRun:
    """A notebook executed by papermill: the executed copy and the cell error, if a cell raised.

    Attributes:
        path: the executed copy (absolute).
        sha256: the sha256 of its bytes as saved.
        parameters: the parameters passed (paths made text).
        error: the `papermill.PapermillExecutionError` a cell raised (its `ename`, `evalue`), or None.
    """

    path: str
    sha256: str
    parameters: Mapping[str, Any]
    error: Exception | None


def run_papermill(
    notebook: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    parameters: Mapping[str, Any],
    *,
    cwd: str | os.PathLike[str],
    kernels: list[Any] | None = None,
) -> PapermillRun:
    """Run `notebook` with papermill (kernel `KERNEL_NAME`) into `out_path`; nothing is anchored.

    A cell that raises is returned as `error` after the executed copy (with the
    error in it) is saved; any other papermill error (no kernel, a missing
    parameter) is raised. `kernels`, when given, gets the kernel manager as it is
    made (`kernel_pid` names its process, for a caller that forwards signals to it).
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    lab.project_kernel()  # papermill runs the notebook on this Python, under the name JupyterLab uses
    source = os.path.abspath(os.fspath(notebook))
    out = os.path.abspath(os.fspath(out_path))
    plain = _relative_parameters(parameters, cwd)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    failure: Exception | None = None
    extra: dict[str, Any] = {} if kernels is None else {"kernel_manager_class": _tracked_manager(kernels)}
    try:
        papermill.execute_notebook(source, out, parameters=dict(plain), kernel_name=KERNEL_NAME,
                                   progress_bar=False, log_output=False, cwd=os.fspath(cwd), **extra)
    except PapermillExecutionError as exc:
        failure = exc
    _relative_metadata(out, cwd)
    digest = sha256_hex(read_bytes(out, max_bytes=_MAX_NOTEBOOK_BYTES))
    return PapermillRun(out, digest, plain, failure)


def _relative_parameters(parameters: Mapping[str, Any], cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """The parameters as papermill writes them into the executed copy: a path under the repository root
    (from which the notebooks take relative paths) given relative to it, so that the copy names no folder
    of this machine; a path outside it stays as given (and the audit names it, `absolute_path`)."""
    root = os.path.realpath(repo_root(cwd))
    plain = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in parameters.items()}
    return {k: shown_path(os.path.realpath(v), root) if isinstance(v, str) and os.path.isabs(v)
            and os.path.realpath(v).startswith(root.rstrip(os.sep) + os.sep) else v for k, v in plain.items()}


def _relative_metadata(out: str, cwd: str | os.PathLike[str]) -> None:
    """papermill records the notebook's input and output paths: keep them relative to the kernel's
    folder (`shown_path`), so that the executed copy names no folder of this machine."""
    import nbformat

    nb = nbformat.read(out, as_version=nbformat.NO_CONVERT)  # type: ignore[no-untyped-call]
    meta = nb.get("metadata", {}).get("papermill", {})
    changed = False
    for key in ("input_path", "output_path"):
        if isinstance(meta.get(key), str) and os.path.isabs(meta[key]):
            meta[key] = shown_path(meta[key], cwd)
            changed = True
    if changed:
        atomic_write(out, nbformat.writes(nb).encode("utf-8"), mode=0o644)  # type: ignore[no-untyped-call]


def anchor_executed(executed: str | os.PathLike[str], *, cwd: str | os.PathLike[str] | None = None) -> ExecutedNotebook:
    """Anchor a copy that a plain `papermill` command executed (`proctor anchor-notebook`).

    The notebook's own papermill metadata names its parameters (`prereg`, `stage`, `results`,
    relative paths taken from the repository root found from `cwd`, default the working
    folder) and whether a cell raised. An interrupted copy (a cell error in `INTERRUPTED_ENAMES`, or
    no error but cells papermill never completed: it kills the kernel a few seconds after an
    interrupt) is first moved to `interrupted_name(executed)`, as `execute_and_anchor` does.

    Raises:
        NotebookRefusal: `notebook_not_executed` when the file is not a notebook papermill executed, names no
            stage, or its stage folder does not exist.
    """
    path = os.path.abspath(os.fspath(executed))
    doc = loads_strict(read_bytes(path, max_bytes=_MAX_NOTEBOOK_BYTES), path=path)
    meta = doc.get("metadata", {}).get("papermill") if isinstance(doc.get("metadata"), dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("parameters"), dict):
        raise Refusal(Code.NOTEBOOK_NOT_EXECUTED, f"{path} has no papermill metadata: it was not executed by "
                      "papermill", path)
    given = {**_notebook_defaults(path), **meta["parameters"]}  # its own cell tagged parameters: the defaults
    ename = _error_name(doc)
    # papermill kills the kernel a few seconds after interrupting it: the copy then shows no error but cells
    # that never completed (the run itself stopped gracefully in the kernel, its logs say so)
    # (papermill then marks them "completed" all the same, but they have no end time)
    cut = ename is None and any(isinstance(c, dict) and c.get("cell_type") == "code"
                                and (c.get("metadata", {}).get("papermill") or {}).get("end_time") is None
                                for c in doc.get("cells", []))
    interrupted = ename in INTERRUPTED_ENAMES or cut
    found = _stage_of(given, os.getcwd() if cwd is None else os.fspath(cwd))
    if found is None:
        raise Refusal(Code.NOTEBOOK_NOT_EXECUTED, f"{path}: its parameters name no stage folder that exists "
                      f"(prereg, stage, results: {[given.get(k) for k in ('prereg', 'stage', 'results')]})", path)
    if interrupted:
        kept = interrupted_name(path)
        os.rename(path, kept)
        path = kept
    anchor = anchor_notebook(*found, path)
    return ExecutedNotebook(path, sha256_hex(read_bytes(path, max_bytes=_MAX_NOTEBOOK_BYTES)), anchor, None,
                            interrupted)


def _error_name(doc: Mapping[str, Any]) -> str | None:
    for cell in doc.get("cells", []):
        for out in cell.get("outputs", []) if isinstance(cell, dict) else []:
            if isinstance(out, dict) and out.get("output_type") == "error":
                return str(out.get("ename"))
    return None


def _tracked_manager(kernels: list[Any]) -> type[Any]:
    from jupyter_client.manager import AsyncKernelManager

    class Tracked(AsyncKernelManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            kernels.append(self)

    return Tracked


def kernel_pid(manager: Any) -> int | None:
    """The process id of a kernel manager's kernel, or None when it has none (not started, or ended)."""
    provisioner = getattr(manager, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    process = getattr(provisioner, "process", None)
    if not isinstance(pid, int) or process is None or process.poll() is not None:
        return None
    return pid


def _anchor_for(given: Mapping[str, Any], out: str, cwd: str | os.PathLike[str]) -> dict[str, Any] | None:
    found = _stage_of(given, cwd)
    return None if found is None else anchor_notebook(*found, out)


def _stage_of(given: Mapping[str, Any], cwd: str | os.PathLike[str]) -> tuple[str, str, str] | None:
    """(stage folder, study, stage) that the parameters name, when that folder exists."""
    from harness.prereg.design import load_design

    if not all(isinstance(given.get(k), str) for k in ("prereg", "stage", "results")):
        return None
    root = repo_root(cwd)
    try:
        study = load_design(os.path.join(resolve(given["prereg"], root), "design.toml")).study_id
    except Refusal:
        return None
    folder = stage_folder(resolve(given["results"], root), study, given["stage"])
    if not os.path.isdir(folder):
        return None
    return folder, study, given["stage"]
