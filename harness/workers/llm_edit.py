"""`proctor worker llm-edit`: the smallest real agent.

The manual: docs/models.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, Refusal, TaskRefusal, WorkerRefusal
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.providers.edit_format import parse_files, render_files
from harness.workers.arm import MAX_REPAIR_TURNS
from harness.workers.process import ProcessResult, run_group
from harness.workers.sandbox import PROXY_SOCKET_ENV

__all__ = [
    "EXIT_BUDGET_STOP", "EXIT_PROVIDER_FAILED", "MAX_FAILURE_BYTES", "TESTS_ARGV_ENV", "EditOutcome", "Turn",
    "build_prompt", "repair_prompt", "run_llm_edit", "run_visible_tests",
]

EXIT_PROVIDER_FAILED: Final = 75
EXIT_BUDGET_STOP: Final = 76
"""The metering proxy answered a turn's request with a budget stop: the attempt's allowance is spent."""
MAX_FILE_BYTES: Final = 256 * 1024
MAX_FAILURE_BYTES: Final = 8 * 1024
"""How much of the visible tests' output (its end) a repair turn shows the model."""
TESTS_ARGV_ENV: Final = "PROCTOR_TESTS_ARGV"
"""The visible tests' argv (a JSON array; `{python}` is this interpreter), set by a dispatch with repair turns."""


@dataclass(frozen=True)
class Turn:
    """One turn of llm-edit: its request, what it wrote, and the visible tests' result after it (None: not run)."""

    turn: int
    request_sha256: str
    written: tuple[str, ...]
    error_code: str | None
    visible_passed: bool | None = None
    visible_exit_code: int | None = None
    visible_timed_out: bool = False
    visible_output_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        visible = None if self.visible_passed is None else {
            "passed": self.visible_passed, "exit_code": self.visible_exit_code, "timed_out": self.visible_timed_out,
            "output_sha256": self.visible_output_sha256,
        }  # fmt: skip
        return {"turn": self.turn, "request_sha256": self.request_sha256, "written": list(self.written),
                "error_code": self.error_code, "visible": visible}  # fmt: skip


@dataclass(frozen=True)
class EditOutcome:
    """What one llm-edit run did; with repair turns, each turn (`turns`) and the budget it had (`repair_turns`)."""

    exit_code: int
    written: tuple[str, ...]
    ignored: tuple[str, ...]
    error_code: str | None
    model_snapshot: str | None
    request_sha256: str
    repair_turns: int = 0
    turns: tuple[Turn, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "written": list(self.written),
            "ignored_out_of_scope": list(self.ignored),
            "error_code": self.error_code,
            "model_snapshot": self.model_snapshot,
            "request_sha256": self.request_sha256,
        }
        if self.repair_turns:
            passed = [t.visible_passed for t in self.turns if t.visible_passed is not None]
            doc.update(repair_turns=self.repair_turns, turns_used=len(self.turns),
                       visible_passed=passed[-1] if passed else None, turns=[t.to_json() for t in self.turns])
        return doc


def build_prompt(task_id: str, prompt: str, files: dict[str, str | None]) -> str:
    """The model's prompt: the task, then every file in scope as a block (absent files named)."""
    present = {p: text for p, text in files.items() if text is not None}
    absent = sorted(p for p, text in files.items() if text is None)
    lines = [
        f"task_id: {task_id}",
        "",
        prompt.strip(),
        "",
        "You may change only these files. Answer with every file you change, whole, in this format",
        "(one block per file, nothing else inside a block):",
        "<<<FILE path/to/file",
        "...the whole new content...",
        ">>>END",
        "",
        "The files now:",
        render_files(present).rstrip("\n"),
    ]
    if absent:
        lines += ["", "Files in scope that do not exist yet: " + ", ".join(absent)]
    return "\n".join(lines) + "\n"


def _read_scope(workspace: str, scope: Sequence[str]) -> dict[str, str | None]:
    files: dict[str, str | None] = {}
    for rel in scope:
        path = os.path.join(workspace, rel)
        if not os.path.lexists(path):
            files[rel] = None
            continue
        data = read_bytes(path, max_bytes=MAX_FILE_BYTES)
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise WorkerRefusal(Code.SCOPE_FILE_NOT_TEXT, "llm-edit edits UTF-8 text files only", path) from None
    return files


def _beat(stage: str, **counters: int) -> None:
    path = os.environ.get("PROCTOR_HEARTBEAT")
    if path:
        with contextlib.suppress(OSError):  # progress is a courtesy; the edit is the work
            atomic_write(path, json.dumps({"stage": stage, **counters}).encode())


def repair_prompt(task_id: str, prompt: str, files: dict[str, str | None], turn: int, exit_code: int | None,
                  timed_out: bool, output: bytes) -> str:
    """A repair turn's prompt: the task and the files now, then the visible tests' failure (the end of their output)."""
    tail = output[-MAX_FAILURE_BYTES:].decode("utf-8", "replace")
    how = "timed out" if timed_out else f"exited {exit_code}"
    cut = f"the last {MAX_FAILURE_BYTES} bytes of " if len(output) > MAX_FAILURE_BYTES else ""
    return build_prompt(task_id, prompt, files) + "\n".join([
        "",
        f"After your answer of turn {turn} the visible tests {how}. Here is {cut}their output:",
        "<<<OUTPUT",
        tail.rstrip("\n"),
        ">>>OUTPUT",
        "Fix the files so that the tests pass; answer in the same format, every file you change, whole.",
    ]) + "\n"


def run_visible_tests(argv: Sequence[str], workspace: str, timeout_s: float, drop_env: Sequence[str] = ()) -> tuple[ProcessResult, bytes]:
    """Run the visible tests on a fresh copy of `workspace` (its .git left out); the result and the output.

    The copy keeps the workspace as the model left it (no bytecode, caches or
    files a test writes); the hidden tests are not in a workspace, so they never run here.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_") and k not in drop_env}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    with tempfile.TemporaryDirectory(prefix="proctor-visible-") as tmp:
        copy = os.path.join(tmp, "ws")
        shutil.copytree(workspace, copy, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        output = os.path.join(tmp, "output.log")
        result = run_group(list(argv), cwd=copy, env=env, timeout_s=timeout_s, output_path=output)
        with open(output, "rb") as fh:
            return result, fh.read()


def _tests_argv(value: Sequence[str] | None) -> list[str]:
    """The visible tests' argv: given, or from `PROCTOR_TESTS_ARGV`; `{python}` is this interpreter."""
    from harness.evidence.jsonio import loads_strict

    if value is None:
        text = os.environ.get(TESTS_ARGV_ENV)
        if not text:
            raise WorkerRefusal(Code.TESTS_ARGV_INVALID, f"repair turns need the visible tests: --tests-argv or {TESTS_ARGV_ENV}")
        try:
            value = loads_strict(text.encode("utf-8"), path=TESTS_ARGV_ENV, expect_object=False)
        except Refusal as exc:
            raise WorkerRefusal(Code.TESTS_ARGV_INVALID, f"{TESTS_ARGV_ENV} is not JSON: {exc.message}") from None
    if isinstance(value, str):
        raise WorkerRefusal(Code.TESTS_ARGV_INVALID, "the visible tests' argv is an array, not a shell string")
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) and a for a in value):
        raise WorkerRefusal(Code.TESTS_ARGV_INVALID, "the visible tests' argv must be a non-empty array of strings")
    return [sys.executable if a == "{python}" else a for a in value]


def _budget_stopped(status: int | None, raw: bytes) -> bool:
    """Whether a response is the metering proxy's budget stop (402 naming `budget_stop`)."""
    if status != 402:
        return False
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    error = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(error, dict) and error.get("code") == "budget_stop"


def run_llm_edit(
    model_id: str,
    *,
    workspace: str,
    prompt_file: str,
    task_id: str,
    scope: Sequence[str],
    catalog_path: str | None = None,
    timeout_s: float = 600.0,
    repair_turns: int = 0,
    tests_argv: Sequence[str] | None = None,
    tests_timeout_s: float = 300.0,
) -> EditOutcome:
    """Ask `model_id` (a catalog id) for the files in `scope` and write back what it returns.

    With `repair_turns` N > 0, after each answer the visible tests (`tests_argv`)
    run on a copy of the workspace; on failure the model gets their output and
    the files now, up to N more turns, stopping at the first pass
    (docs/gated-path.md, "Agent arms"). A budget stop from the metering proxy
    ends the run with `EXIT_BUDGET_STOP`.
    """
    from harness.providers.base import GenerationSettings
    from harness.providers.catalog import load_catalog, resolve_model
    from harness.providers.registry import adapter_for
    from harness.providers.transport import Transport

    if isinstance(repair_turns, bool) or not isinstance(repair_turns, int) or not 0 <= repair_turns <= MAX_REPAIR_TURNS:
        raise WorkerRefusal(Code.REPAIR_TURNS_INVALID, f"repair turns must be in 0..{MAX_REPAIR_TURNS}, not {repair_turns!r}")
    model = resolve_model(load_catalog(catalog_path), model_id)
    if not scope:
        raise TaskRefusal(Code.SCOPE_EMPTY, "llm-edit needs the task's scope (PROCTOR_SCOPE or --scope)")
    tests = _tests_argv(tests_argv) if repair_turns else []
    prompt = read_bytes(prompt_file).decode("utf-8", "replace")
    files = _read_scope(workspace, scope)
    _beat("asking", files_total=len(scope))
    adapter = adapter_for(model.api_shape)
    credential = os.environ.get(model.credential_env) if model.credential_env else None
    text = build_prompt(task_id, prompt, files)
    allowed = set(scope)
    written_all: list[str] = []
    ignored_all: list[str] = []
    turns: list[Turn] = []
    snapshot: str | None = None
    with Transport(timeout_s=timeout_s, uds=os.environ.get(PROXY_SOCKET_ENV) or None) as transport:
        for turn in range(1, repair_turns + 2):
            request = adapter.build_request(model.api_model, text, GenerationSettings(), model.effective_base_url())
            exchange = transport.send(request, credential)
            parsed = exchange.parsed
            snapshot = parsed.model_snapshot or snapshot
            if _budget_stopped(exchange.status, exchange.raw_response):
                turns.append(Turn(turn, request.body_sha256, (), "budget_stop"))
                return EditOutcome(EXIT_BUDGET_STOP, tuple(written_all), tuple(ignored_all), "budget_stop", snapshot,
                                   request.body_sha256, repair_turns, tuple(turns))  # fmt: skip
            if not parsed.ok or parsed.text is None:
                code = parsed.error_code or "malformed_response"
                turns.append(Turn(turn, request.body_sha256, (), code))
                return EditOutcome(EXIT_PROVIDER_FAILED, tuple(written_all), tuple(ignored_all), code, snapshot,
                                   request.body_sha256, repair_turns, tuple(turns))  # fmt: skip
            written, ignored = _write_answer(workspace, parse_files(parsed.text), allowed, len(scope))
            written_all = sorted({*written_all, *written})
            ignored_all = sorted({*ignored_all, *ignored})
            if not repair_turns:
                turns.append(Turn(turn, request.body_sha256, tuple(written), None))
                break
            _beat("testing", turn=turn)
            result, output = run_visible_tests(tests, workspace, tests_timeout_s,
                                               (model.credential_env,) if model.credential_env else ())  # fmt: skip
            passed = result.exit_code == 0 and not result.timed_out
            turns.append(Turn(turn, request.body_sha256, tuple(written), None, passed, result.exit_code,
                              result.timed_out, sha256_hex(output)))  # fmt: skip
            if passed or turn == repair_turns + 1:
                break
            text = repair_prompt(task_id, prompt, _read_scope(workspace, scope), turn, result.exit_code,
                                 result.timed_out, output)  # fmt: skip
            _beat("asking", turn=turn + 1, files_total=len(scope))
    _beat("done", files_done=len(written_all), files_total=len(scope))
    return EditOutcome(0 if written_all else 1, tuple(written_all), tuple(ignored_all), None, snapshot,
                       turns[-1].request_sha256, repair_turns, tuple(turns))


def _write_answer(workspace: str, answer: dict[str, str], allowed: set[str], total: int) -> tuple[list[str], list[str]]:
    """Write the answer's files in scope (keeping an existing file's mode); (written, ignored out of scope)."""
    written, ignored = [], []
    for rel, body in sorted(answer.items()):
        if rel not in allowed:
            ignored.append(rel)
            continue
        target = os.path.join(workspace, rel)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        mode = os.stat(target).st_mode & 0o777 if os.path.isfile(target) else 0o644
        atomic_write(target, body.encode("utf-8"), mode=mode)
        written.append(rel)
        _beat("writing", files_done=len(written), files_total=total)
    return written, ignored
