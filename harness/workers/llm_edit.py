"""`proctor worker llm-edit`: the smallest real agent.

It sends the task prompt and the files in scope to a model through a provider
adapter, and writes back the files the model returns whole (the format in
`harness.providers.edit_format`). Only files in scope are written. It runs as a
dispatched worker: the prompt file, the task id, the scope and the heartbeat
come from the `PROCTOR_*` variables that `proctor dispatch` sets. In a bwrap
sandbox it has no network: it reaches the metering proxy only through the
Unix socket named by `PROCTOR_PROXY_SOCKET` (the host in its base URL is
then ignored).

Exit codes: 0 at least one file in scope written; 1 the model answered but
with no usable file; 75 the provider failed (the escalation rule then
switches provider, not tier).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, TaskRefusal, WorkerRefusal
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import read_bytes
from harness.providers.edit_format import parse_files, render_files
from harness.workers.sandbox import PROXY_SOCKET_ENV

__all__ = ["EXIT_PROVIDER_FAILED", "EditOutcome", "build_prompt", "run_llm_edit"]

EXIT_PROVIDER_FAILED: Final = 75
MAX_FILE_BYTES: Final = 256 * 1024


@dataclass(frozen=True)
class EditOutcome:
    """What one llm-edit run did."""

    exit_code: int
    written: tuple[str, ...]
    ignored: tuple[str, ...]
    error_code: str | None
    model_snapshot: str | None
    request_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "written": list(self.written),
            "ignored_out_of_scope": list(self.ignored),
            "error_code": self.error_code,
            "model_snapshot": self.model_snapshot,
            "request_sha256": self.request_sha256,
        }


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


def run_llm_edit(
    model_id: str,
    *,
    workspace: str,
    prompt_file: str,
    task_id: str,
    scope: Sequence[str],
    catalog_path: str | None = None,
    timeout_s: float = 600.0,
) -> EditOutcome:
    """Ask `model_id` (a catalog id) for the files in `scope` and write back what it returns."""
    from harness.providers.base import GenerationSettings
    from harness.providers.catalog import load_catalog, resolve_model
    from harness.providers.registry import adapter_for
    from harness.providers.transport import Transport

    model = resolve_model(load_catalog(catalog_path), model_id)
    if not scope:
        raise TaskRefusal(Code.SCOPE_EMPTY, "llm-edit needs the task's scope (PROCTOR_SCOPE or --scope)")
    prompt = read_bytes(prompt_file).decode("utf-8", "replace")
    files = _read_scope(workspace, scope)
    _beat("asking", files_total=len(scope))
    adapter = adapter_for(model.api_shape)
    request = adapter.build_request(
        model.api_model, build_prompt(task_id, prompt, files), GenerationSettings(), model.effective_base_url()
    )
    credential = os.environ.get(model.credential_env) if model.credential_env else None
    with Transport(timeout_s=timeout_s, uds=os.environ.get(PROXY_SOCKET_ENV) or None) as transport:
        exchange = transport.send(request, credential)
    parsed = exchange.parsed
    if not parsed.ok or parsed.text is None:
        return EditOutcome(EXIT_PROVIDER_FAILED, (), (), parsed.error_code or "malformed_response",
                           parsed.model_snapshot, request.body_sha256)
    answer = parse_files(parsed.text)
    allowed = set(scope)
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
        _beat("writing", files_done=len(written), files_total=len(scope))
    _beat("done", files_done=len(written), files_total=len(scope))
    return EditOutcome(0 if written else 1, tuple(written), tuple(ignored), None,
                       parsed.model_snapshot, request.body_sha256)
