"""`proctor delegate`: consult a model (or a command) once, outside the gated path.

The manual: docs/models.md.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal, ProviderRefusal, TreeRefusal
from harness.evidence.jsonio import read_bytes
from harness.evidence.layout import lay_entry, real_parents, remove_entry
from harness.evidence.tree import scan_tree
from harness.evidence.tree_entry import TreeDiff, TreeEntry, diff_trees, display_path, signature_of
from harness.gate.lanes import PRODUCTION_ENTRYPOINTS
from harness.gate.metering import metering_proxy, socket_base_url
from harness.gate.state import NESTED_ENV
from harness.providers.catalog import load_catalog, resolve_model, worker_env
from harness.workers.limits import resolve_limits
from harness.workers.process import ProcessResult, WorkerOutcome, run_group
from harness.workers.sandbox import (
    IN_SANDBOX,
    PROXY_SOCKET_ENV,
    View,
    find_program,
    named_paths,
    resolve_sandbox,
    sandbox_env,
)

__all__ = ["DELEGATE_TIMEOUT_S", "DelegateResult", "delegate", "named_entrypoints", "restore_tree"]

DELEGATE_TIMEOUT_S = 600.0
OUTPUT_LIMIT = 64 * 1024
"""Bytes of the worker's output returned (its tail when longer)."""
_SESSION = re.compile(r"^SESSION:\s*(\S+)\s*$", re.MULTILINE)


def named_entrypoints(text: str) -> list[str]:
    """The production entrypoints named in `text`, dotted or slashed."""
    found = []
    for name in PRODUCTION_ENTRYPOINTS:
        forms = {name} if name.endswith(".ps1") else {name, name.replace(".", "/")}
        if any(form in text for form in forms):
            found.append(name)
    return found


def _snapshot(root: str, entries: Mapping[bytes, TreeEntry], dest: str) -> dict[bytes, int]:
    """Copy every file of `entries` into `dest` (flat, by index); returns each file's full mode."""
    modes: dict[bytes, int] = {}
    for index, (rel, entry) in enumerate(sorted(entries.items())):
        if entry.kind != "file":
            continue
        source = os.path.join(root, os.fsdecode(rel))
        data = read_bytes(source)
        if len(data) != entry.size:
            raise TreeRefusal(Code.TREE_CHANGED_DURING_SCAN, "a file changed while delegate copied it", source)
        with open(os.path.join(dest, str(index)), "wb") as fh:
            fh.write(data)
        modes[rel] = stat.S_IMODE(os.lstat(source).st_mode)
    return modes


def restore_tree(
    root: str,
    before: Mapping[bytes, TreeEntry],
    after: Mapping[bytes, TreeEntry],
    copy: str,
    modes: Mapping[bytes, int],
) -> list[str]:
    """Put `root` back to `before` from the snapshot `copy`; returns the restored paths."""
    base = os.fsencode(root)
    index = {rel: i for i, rel in enumerate(sorted(before))}
    diff = diff_trees(before, after)
    for rel in sorted(diff.added, reverse=True):  # children first; a removed folder takes its children
        target = os.path.join(base, rel)
        if os.path.lexists(target) and rel not in before:
            remove_entry(target)
    for rel in sorted({*diff.removed, *diff.changed}):  # parents first
        entry = before[rel]
        target = os.path.join(base, rel)
        real_parents(base, rel)
        if entry.kind == "dir":
            if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
                remove_entry(target)
            if not os.path.lexists(target):
                os.mkdir(target)
            continue
        remove_entry(target)
        data = read_bytes(os.path.join(copy, str(index[rel]))) if entry.kind == "file" else None
        lay_entry(target, entry, data, modes.get(rel))
    return [display_path(p) for p in sorted({*diff.added, *diff.removed, *diff.changed})]


def _output(path: str) -> tuple[str, bool]:
    data = read_bytes(path)
    if len(data) > OUTPUT_LIMIT:
        return data[-OUTPUT_LIMIT:].decode("utf-8", "replace"), True
    return data.decode("utf-8", "replace"), False


@dataclass(frozen=True)
class DelegateResult(WorkerOutcome):
    """One consult: who ran, what it printed, what it changed (and what was restored), its sandbox."""

    mode: str
    model: str | None
    argv: tuple[str, ...]
    workspace: str
    write: bool
    output: str
    output_truncated: bool
    session: str | None
    restored: tuple[str, ...]
    changes: TreeDiff
    tree_before: str
    tree_after: str
    sandbox: dict[str, Any]
    proxy: dict[str, Any] | None
    process: ProcessResult

    def to_json(self) -> dict[str, Any]:
        return self.outcome_json({
            "mode": self.mode,
            "model": self.model,
            "argv": list(self.argv),
            "workspace": self.workspace,
            "write": self.write,
            "output": self.output,
            "output_truncated": self.output_truncated,
            "session": self.session,
            "restored": list(self.restored),
            "changes": self.changes.to_json(),
            "tree_before": self.tree_before,
            "tree_after": self.tree_after,
            "sandbox": self.sandbox,
            "proxy": self.proxy,
        })


def delegate(
    workspace: str,
    task_text: str,
    *,
    model: str | None = None,
    command: Sequence[str] | None = None,
    write: bool = False,
    resume_from: str | None = None,
    catalog_path: str | None = None,
    timeout_s: float = DELEGATE_TIMEOUT_S,
    sandbox: str | None = None,
) -> DelegateResult:
    """Run the model's worker (or `command`) once in `workspace`; restore the workspace unless `write`.

    `sandbox`: "bwrap" or "none" (default: `PROCTOR_SANDBOX`, else bwrap).
    """
    if os.environ.get(NESTED_ENV) == "1" and (model is not None or write):
        raise GateRefusal(
            Code.NESTED_CALL_REFUSED,
            f"delegate {'--model' if model is not None else '--write'} from inside a worker ({NESTED_ENV}=1) is refused",
        )
    if (model is None) == (not command):
        raise ProviderRefusal(Code.WORKER_CHOICE_CONFLICT, "give exactly one of --model ID or --command -- ARGV")
    if not (0 < timeout_s < float("inf")):
        raise GateRefusal(Code.TIMEOUT_INVALID, "--timeout must be a positive number of seconds")
    if not task_text.strip():
        raise GateRefusal(Code.DELEGATE_TASK_EMPTY, "the task text is empty")
    if model is not None:
        named = named_entrypoints(task_text)
        if named:
            raise GateRefusal(
                Code.PRODUCTION_TASK_IN_MODEL_MODE,
                f"the task names production entrypoints ({', '.join(named)}): use the gated path "
                "(proctor init/dispatch/verify/accept), not a model delegate",
                entrypoints=named,
            )
    if resume_from is not None and model is None:
        raise ProviderRefusal(Code.RESUME_UNSUPPORTED, "--resume-from needs --model (the catalog's resume template)")
    root = os.path.realpath(workspace)
    if not os.path.isdir(root):
        raise TreeRefusal(Code.WORKSPACE_MISSING, "no such folder", root)
    box = resolve_sandbox(sandbox)
    sandboxed = box.kind == "bwrap"
    catalog = load_catalog(catalog_path) if model is not None else None
    chosen = resolve_model(catalog, model) if catalog is not None and model is not None else None
    if chosen is not None and chosen.worker is None:
        raise ProviderRefusal(Code.MODEL_HAS_NO_WORKER, f"{chosen.id!r} has no [model.worker] argv in the catalog", catalog_path)
    before = scan_tree(root, excludes=())
    private = tempfile.mkdtemp(prefix="proctor-delegate-")
    try:
        copy = os.path.join(private, "copy")
        os.mkdir(copy, 0o700)
        modes = _snapshot(root, before, copy)
        prompt_file = os.path.join(private, "prompt.md")
        with open(prompt_file, "w", encoding="utf-8") as fh:
            fh.write(task_text)
        seen_prompt = os.path.join(IN_SANDBOX, "prompt.md") if sandboxed else prompt_file
        given = {NESTED_ENV: "1", "PROCTOR_DELEGATE": "1", "PROCTOR_PROMPT_FILE": seen_prompt}
        placed = [(prompt_file, os.path.join(IN_SANDBOX, "prompt.md"))]
        readable: tuple[str, ...] = ()
        proxied: AbstractContextManager[dict[str, Any]] = nullcontext({})
        if chosen is not None and catalog is not None:
            assert chosen.worker is not None
            argv = chosen.worker.render(
                model=chosen.id, workspace=root, prompt_file=seen_prompt, python=sys.executable, session=resume_from
            )
            readable = (catalog.path,)
            if sandboxed and chosen.worker.needs_proxy:
                wire = os.path.join(private, "wire.jsonl")
                proxied = metering_proxy(chosen.effective_base_url(), wire, "delegate", unix=True)
        else:
            argv = list(command or ())
        output_path = os.path.join(private, "output.log")
        with proxied as metering:
            if chosen is not None and catalog is not None:
                if metering.get("socket"):
                    given.update(worker_env(chosen, catalog, socket_base_url(metering["base_url"])))
                    given[PROXY_SOCKET_ENV] = os.path.join(IN_SANDBOX, "proxy", "proxy.sock")
                    placed.append((os.path.dirname(metering["socket"]), os.path.join(IN_SANDBOX, "proxy")))
                else:
                    given.update(worker_env(chosen, catalog, chosen.effective_base_url()))
                if sandboxed and chosen.credential_env and os.environ.get(chosen.credential_env):
                    given[chosen.credential_env] = os.environ[chosen.credential_env]
            env = sandbox_env(os.environ, given, sandboxed=sandboxed)
            program = find_program(argv[0], root, env)
            view = View(cwd=root, writable=(root,), readable=named_paths(argv, program) + readable,
                        placed=tuple(placed), withheld=(private,))  # fmt: skip
            wrapped = box.wrap(argv, view, env, resolve_limits())
            try:
                if sandboxed and program is None:
                    raise FileNotFoundError(2, "No such file or directory", argv[0])
                result = run_group(wrapped.argv, cwd=root, env=env, timeout_s=timeout_s, output_path=output_path,
                                   sandboxed=wrapped.sandboxed, limits=wrapped.limits)  # fmt: skip
            except OSError as exc:
                raise GateRefusal(Code.WORKER_SPAWN_FAILED, f"cannot start the worker: {exc.strerror or exc}", argv[0]) from None
        after = scan_tree(root, excludes=())
        diff = diff_trees(before, after)
        restored: list[str] = []
        if not write and not diff.empty:
            try:
                restored = restore_tree(root, before, after, copy, modes)
            except OSError as exc:
                raise GateRefusal(Code.RESTORE_INCOMPLETE, f"the workspace could not be restored: {exc}", root) from None
            back = scan_tree(root, excludes=())
            if signature_of(back).digest != signature_of(before).digest:
                left = diff_trees(before, back).to_json()
                raise GateRefusal(Code.RESTORE_INCOMPLETE, f"the workspace could not be restored exactly: {left}", root, **left)
        text, truncated = _output(output_path)
        proxy = metering.get("proxy")
    finally:
        shutil.rmtree(private, ignore_errors=True)
    sessions = _SESSION.findall(text)
    return DelegateResult(
        mode="model" if chosen is not None else "command",
        model=None if chosen is None else chosen.id,
        argv=tuple(argv),
        workspace=root,
        write=write,
        output=text,
        output_truncated=truncated,
        session=sessions[-1] if sessions else None,
        restored=tuple(restored),
        changes=diff,
        tree_before=signature_of(before).digest,
        tree_after=signature_of(scan_tree(root, excludes=())).digest,
        sandbox=wrapped.record,
        proxy=None if proxy is None else {k: proxy[k] for k in ("exchanges", "record_failures")},
        process=result,
    )
