"""`proctor verify`: run the pinned verifier on a fresh copy of the workspace and write a receipt.

The manual: docs/gated-path.md; what its sandbox holds: docs/sandbox.md.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, GateRefusal
from harness.evidence.fsutil import cap_output, ensure_private_dir
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.layout import lay_entry
from harness.evidence.tree import scan_tree
from harness.evidence.tree_entry import TreeEntry, signature_of
from harness.gate.baseline import baseline_entries
from harness.gate.continuity import journal_mark
from harness.gate.escalation import fingerprint
from harness.gate.guards import (
    ancestor_inputs,
    escaping_entries,
    module_shadows,
    verification_input_changes,
)
from harness.gate.results import (
    REPORT_LIMIT,
    expected_tests,
    judge_report,
    plugin_module_name,
    plugin_source,
    pytest_position,
    with_plugin,
)
from harness.gate.scan import scan_changed
from harness.gate.scope import check_scope, scan_purged
from harness.gate.seal import check_copies, lay_hidden, restore_sealed
from harness.gate.state import refuse_nested
from harness.gate.workspace import Gate, check_pin, gated, withheld_paths
from harness.records.journal import TamperEvent, VerifyEvent
from harness.records.receipt import Receipt, TestResults
from harness.workers.limits import resolve_limits
from harness.workers.process import ProcessResult, run_group
from harness.workers.sandbox import (
    Sandbox,
    View,
    Wrapped,
    find_program,
    named_paths,
    resolve_sandbox,
    sandbox_env,
)

__all__ = ["VerifyResult", "copy_tree", "verifier_sources", "verify"]

_REPORT_DIR = "/run/proctor/report"
"""Where a sandboxed verifier finds the proctor's pytest plugin (`harness.gate.results`)."""


def copy_tree(source: str, entries: Mapping[bytes, TreeEntry], dest: str) -> None:
    """Lay out exactly the scanned entries of `source` under `dest` (links as links, never followed)."""
    src, dst = os.fsencode(source), os.fsencode(dest)
    for rel, entry in sorted(entries.items()):
        target = os.path.join(dst, rel)
        if entry.kind == "dir":
            os.mkdir(target, 0o755)
        else:
            data = read_bytes(os.path.join(src, rel).decode("utf-8", "surrogateescape")) if entry.kind == "file" else None
            lay_entry(target, entry, data)


def _tampered_since_dispatch(gate: Gate) -> list[str]:
    """Sealed paths restored since the last dispatch started: tampering stays on the record."""
    paths: list[str] = []
    for event in gate.events:
        if event["event"] == "dispatch_start":
            paths = []
        elif event["event"] == "tamper":
            paths.extend(event["paths"])
    return paths


def verifier_sources(gate: Gate) -> list[tuple[str, bytes, bool]]:
    """(path in the verification copy, content, hidden?) of every sealed and hidden input file,
    read from the state folder's checked copies."""
    out = [(s["path"], read_bytes(gate.state.path("sealed", s["path"])), False) for s in gate.pin["sealed"]]
    for item in gate.pin["hidden"]:
        stored = gate.state.path("hidden", item["stored"])
        if item["kind"] != "dir":
            out.append((item["to"], read_bytes(stored), True))
            continue
        for rel, entry in sorted(scan_tree(stored, excludes=()).items()):
            if entry.kind == "file":
                out.append((f"{item['to']}/{os.fsdecode(rel)}", read_bytes(os.path.join(stored, os.fsdecode(rel))), True))
    return out


def _per_test(results: TestResults | None) -> dict[str, Any]:
    """The verify event's per-test fields (the switch decision's evidence, harness.gate.decision): only
    from a report that ended untampered."""
    if results is None or not results.ended or results.tampered:
        return {}
    failing = (*results.not_passed, *(t for t in results.failed if t not in results.not_passed))
    return {"tests_expected": len(results.expected), "tests_failing": failing}


def _run_verifier(
    gate: Gate, box: Sandbox, copy: str, output: str, report_dir: str | None
) -> tuple[ProcessResult, Wrapped, bytes | None]:
    """Run the pinned verifier in `copy` (sandboxed); with `report_dir`, through the proctor's pytest
    plugin (a fresh module name, its report on an inherited descriptor). Returns the report's bytes."""
    argv = list(gate.pin["verifier_argv"])
    given = {"PYTHONDONTWRITEBYTECODE": "1"}
    placed: tuple[tuple[str, str], ...] = ()
    fds: list[int] = []
    report = None
    if report_dir is not None:
        module = plugin_module_name()
        plugin = os.path.join(report_dir, f"{module}.py")
        with open(plugin, "wb") as fh:
            fh.write(plugin_source())
        report = os.path.join(report_dir, "report.jsonl")
        fds.append(os.open(report, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600))
        argv = with_plugin(argv, module)
        if box.kind == "bwrap":
            placed = ((plugin, f"{_REPORT_DIR}/{module}.py"),)
            given["PYTHONPATH"] = _REPORT_DIR
        else:
            given["PYTHONPATH"] = os.pathsep.join(p for p in (report_dir, os.environ.get("PYTHONPATH")) if p)
        given["PROCTOR_REPORT_FD"] = str(fds[0])
    env = sandbox_env(os.environ, given, sandboxed=box.kind == "bwrap")
    view = View(cwd=copy, writable=(copy,), readable=named_paths(argv, find_program(argv[0], copy, env)),
                placed=placed, withheld=withheld_paths(gate))  # fmt: skip
    wrapped = box.wrap(argv, view, env, resolve_limits())
    try:
        result = run_group(wrapped.argv, cwd=copy, env=env, timeout_s=gate.task.budget.verify_timeout_s,
                           output_path=output, sandboxed=wrapped.sandboxed, limits=wrapped.limits,
                           pass_fds=fds)  # fmt: skip
    finally:
        for fd in fds:
            os.close(fd)
    if report is None:
        return result, wrapped, None
    with open(report, "rb") as fh:  # at most one byte over the limit: judged too large, never read whole
        return result, wrapped, fh.read(REPORT_LIMIT + 1)


def _fresh_copy(gate: Gate, current: Mapping[bytes, TreeEntry], dest: str, digest: str) -> None:
    os.mkdir(dest, 0o755)
    copy_tree(gate.workspace, current, dest)
    if signature_of(scan_tree(dest, tuple(gate.pin["excludes"]))).digest != digest:
        raise GateRefusal(Code.TREE_CHANGED_DURING_VERIFY, "the workspace changed while it was copied", gate.workspace)


@dataclass(frozen=True)
class VerifyResult:
    """What `proctor verify` did: the receipt it wrote, where, and the tail of the verifier's output."""

    receipt: Receipt
    receipt_sha256: str
    receipt_path: str
    output_path: str
    output_tail: str

    @property
    def passed(self) -> bool:
        return self.receipt.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.passed,
            **self.receipt.to_json(),
            "receipt_sha256": self.receipt_sha256,
            "receipt_path": self.receipt_path,
            "output_path": self.output_path,
            "output_tail": self.output_tail,
        }


def verify(workspace: str, task_path: str, state_dir: str | None = None, *, sandbox: str | None = None) -> VerifyResult:
    """Check, restore, copy, verify, receipt. Returns the receipt (with where it was written).

    `sandbox`: "bwrap" or "none" (default: `PROCTOR_SANDBOX`, else bwrap).
    """
    refuse_nested("verify")
    with gated(workspace, task_path, state_dir) as gate, gate.journaling_refusals("verify"):
        check_pin(gate.task, gate.pin)
        box = resolve_sandbox(sandbox)
        check_copies(gate.state.root, gate.pin["sealed"], gate.pin["hidden"])
        excludes = tuple(gate.pin["excludes"])
        baseline = baseline_entries(gate)
        current = scan_purged(gate, "verify")
        changed = verification_input_changes(baseline, current)
        if changed:
            raise GateRefusal(
                Code.VERIFICATION_INPUT_CHANGED,
                f"files that steer verification appeared or changed since init: {', '.join(changed)}",
                gate.workspace,
                paths=changed,
            )
        pinned_above = gate.pin.get("verify_ancestor_inputs", {})
        above = ancestor_inputs(gate.state.path("verify"))
        changed = sorted(p for p in {*pinned_above, *above} if pinned_above.get(p) != above.get(p))
        if changed:
            raise GateRefusal(
                Code.VERIFICATION_INPUT_CHANGED,
                f"files above the verification copy that steer the test runner changed since init: {', '.join(changed)}",
                changed[0],
                paths=changed,
            )
        shadows = module_shadows(baseline, current, gate.pin["verifier_argv"])
        if shadows:
            raise GateRefusal(
                Code.MODULE_SHADOW_DETECTED,
                f"new or changed workspace modules shadow imports of the verifier: {', '.join(shadows)}",
                gate.workspace,
                paths=shadows,
            )
        unsafe = escaping_entries(baseline, current)
        if unsafe:
            raise GateRefusal(
                Code.UNSAFE_WORKSPACE_ENTRY,
                "; ".join(f"{u['path']}: {u['why']}" for u in unsafe),
                gate.workspace,
                entries=unsafe,
            )
        restored = restore_sealed(gate.workspace, gate.state.root, gate.pin["sealed"], current)
        if restored:
            gate.record(TamperEvent(paths=tuple(restored), action="restored"))
            current = scan_tree(gate.workspace, excludes)
        check_scope(gate, baseline, current, gate.workspace)
        tampered = _tampered_since_dispatch(gate)
        tree = signature_of(current)
        suspicious = scan_changed(gate.workspace, baseline, current)

        seq = sum(1 for e in gate.events if e["event"] == "verify") + 1
        receipt_id = f"r{seq:04d}"
        work = gate.state.path("verify", receipt_id)
        if os.path.lexists(work):
            shutil.rmtree(work)
        ensure_private_dir(work)
        copy = os.path.join(work, "tree")
        output = gate.state.path("receipts", f"{receipt_id}.output")
        visible_output = gate.state.path("receipts", f"{receipt_id}.visible.output")
        pytest_run = pytest_position(gate.pin["verifier_argv"]) is not None
        sources = verifier_sources(gate)
        expected, problems = expected_tests((path, data) for path, data, _ in sources)
        results: TestResults | None = None
        visible_sha: str | None = None
        try:
            _fresh_copy(gate, current, copy, tree.digest)
            lay_hidden(copy, gate.state.root, gate.pin["hidden"])
            report_dir = os.path.join(work, "report") if pytest_run else None
            if report_dir is not None:
                ensure_private_dir(report_dir)
            result, wrapped, report = _run_verifier(gate, box, copy, output, report_dir)
            if report is not None:
                results = judge_report(report, expected, problems)
            passed = result.exit_code == 0 and not result.timed_out and (results is None or results.ok)
            if not passed and gate.pin["hidden"]:
                # What a later worker may see (the evidence packet) comes from a run without the
                # hidden inputs: code under test could print them in any form (docs/gated-path.md).
                again = os.path.join(work, "visible")
                _fresh_copy(gate, current, again, tree.digest)
                _run_verifier(gate, box, again, visible_output, None)
                cap_output(visible_output)
                visible_sha = sha256_hex(read_bytes(visible_output))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        dispatches = [e for e in gate.events if e["event"] == "dispatch_start"]
        _kept, cut = cap_output(output)  # code under test may print without bound: keep the head, record the cut
        output_bytes = read_bytes(output)
        # The failure's fingerprint drives escalation (harness.gate.escalation): the copy's
        # path differs per receipt and must not make the same failure look new.
        failure_print = None if passed else fingerprint(
            output_bytes.decode("utf-8", "replace"), (copy, os.path.realpath(copy), gate.state.root)
        )
        mark = journal_mark(gate.events)  # the verify event will be the next line
        receipt = Receipt(
            receipt_id=receipt_id,
            task_id=gate.task.task_id,
            task_sha256=gate.task.sha256,
            tree=tree.digest,
            tree_entries=tree.entries,
            tree_excludes=excludes,
            baseline_tree=gate.pin["baseline_tree"],
            dispatch_seq=dispatches[-1]["seq"] if dispatches else 0,
            verifier_argv=tuple(gate.pin["verifier_argv"]),
            exit_code=result.exit_code,
            signal=result.signal,
            timed_out=result.timed_out,
            passed=passed,
            output_sha256=sha256_hex(output_bytes),
            output_bytes=len(output_bytes),
            output_truncated_from=cut,
            fingerprint=failure_print,
            tamper_detected=bool(tampered),
            tampered_paths=tuple(tampered),
            verifier_nondiscriminating=passed and tree.digest == gate.pin["baseline_tree"],
            detached_pids=tuple(result.detached_pids),
            sandbox=wrapped.record,
            started=result.started,
            ended=result.ended,
            duration_s=round(result.duration_s, 6),
            results=results,
            suspicious_code=tuple(suspicious),
            visible_output_sha256=visible_sha,
            journal_lines=mark[0],
            journal_head=mark[1],
        )
        receipt_sha = gate.state.write_record(f"receipts/{receipt_id}.json", receipt.to_json())
        gate.record(
            VerifyEvent(
                receipt_id=receipt_id,
                receipt_sha256=receipt_sha,
                passed=passed,
                tree=tree.digest,
                tamper_detected=bool(tampered),
                dispatch_seq=receipt.dispatch_seq,
                fingerprint=failure_print,
                sandbox=wrapped.record["kind"],
                **_per_test(results),
            )
        )
    return VerifyResult(
        receipt=receipt,
        receipt_sha256=receipt_sha,
        receipt_path=gate.state.path("receipts", f"{receipt_id}.json"),
        output_path=output,
        output_tail=output_bytes[-2000:].decode("utf-8", "replace"),
    )
