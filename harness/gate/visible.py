"""The visible-test gate: the pinned verifier on a fresh copy of the workspace, without the hidden tests.

A live cascade (docs/run.md, "Cascade arms") asks it whether the cheaper system's tree passes the
tests a proctor may run before the hidden ones: the sealed files are laid from the state folder's
checked copies (a worker's edit of a test never steers the gate), the hidden inputs are never laid,
the verifier runs sandboxed exactly as `verify` runs it. It writes no receipt and no journal event:
it is not a verdict, and its result is recorded by its caller.

The manual: docs/gated-path.md ("The visible-test gate").
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass
from typing import Any, Final

from harness.evidence.fsutil import cap_output, ensure_private_dir
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.tree import scan_tree
from harness.evidence.tree_entry import signature_of
from harness.gate.escalation import fingerprint
from harness.gate.results import expected_tests, judge_report, pytest_position
from harness.gate.seal import check_copies
from harness.gate.verify import _per_test, _run_verifier, copy_tree, verifier_sources
from harness.gate.workspace import check_pin, gated
from harness.workers.sandbox import resolve_sandbox

__all__ = ["EVIDENCE_TAIL", "VisibleGate", "gate_visible"]

EVIDENCE_TAIL: Final = 6000
"""How much of the gate's output (its end) the evidence packet keeps."""


@dataclass(frozen=True)
class VisibleGate:
    """What the visible-test gate found: its verdict, the verifier's exit, its own time and its output."""

    passed: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    """The gate's own wall time: copying, the sandboxed verifier, cleaning up (v's time part)."""
    tree: str
    """The tree signature the gate judged."""
    output: bytes
    """The verifier's output (its head, capped like a receipt's)."""
    fingerprint: str | None = None
    """A failed gate's failure fingerprint (`harness.gate.escalation.fingerprint`, as `verify` computes it)."""
    tests_expected: int | None = None
    """The sealed (visible) tests' expected ids counted, from the proctor's per-test report (`verify`'s
    `_per_test`); None without a complete, untampered report (a verifier that is not pytest, say)."""
    tests_failing: tuple[str, ...] | None = None
    """The ids that did not pass or failed, from the same report; None as `tests_expected`."""

    @property
    def output_sha256(self) -> str:
        return sha256_hex(self.output)

    def evidence(self) -> str:
        """The evidence packet's text: the end of the failing visible tests' output."""
        text = self.output.decode("utf-8", "replace")
        return text[-EVIDENCE_TAIL:]


def gate_visible(workspace: str, task_path: str, state_dir: str | None = None, *,
                 sandbox: str | None = None) -> VisibleGate:
    """Run the pinned verifier on a fresh copy of `workspace` with the sealed files restored and no hidden input.

    Refuses as every gated command does (`not_initialized`, a changed pin or a tampered state folder).
    """
    began = time.monotonic()
    with gated(workspace, task_path, state_dir) as gate:
        check_pin(gate.task, gate.pin)
        box = resolve_sandbox(sandbox)
        check_copies(gate.state.root, gate.pin["sealed"], gate.pin["hidden"])
        current = scan_tree(gate.workspace, tuple(gate.pin["excludes"]))
        tree = signature_of(current).digest
        # Beside verify's own copies (the same ancestors, so the same files above the copy steer pytest).
        work = ensure_private_dir(gate.state.path("verify", f"gate-{secrets.token_hex(6)}"))
        try:
            copy = os.path.join(work, "tree")
            os.mkdir(copy, 0o755)
            copy_tree(gate.workspace, current, copy)
            for sealed in gate.pin["sealed"]:  # the pinned bytes, whatever the worker left
                target = os.path.join(copy, sealed["path"])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.lexists(target):
                    os.unlink(target)
                data = read_bytes(gate.state.path("sealed", sealed["path"]))
                with open(target, "xb") as fh:
                    fh.write(data)
            output = os.path.join(work, "output")
            report_dir = None
            if pytest_position(gate.pin["verifier_argv"]) is not None:  # per-test results, as verify reads them
                report_dir = ensure_private_dir(os.path.join(work, "report"))
            result, _, report = _run_verifier(gate, box, copy, output, report_dir)
            cap_output(output)
            text = read_bytes(output)
            per_test: dict[str, Any] = {}
            if report is not None:  # only the sealed tests' ids are expected: the hidden ones are never laid
                sources = ((path, data) for path, data, hidden in verifier_sources(gate) if not hidden)
                per_test = _per_test(judge_report(report, *expected_tests(sources)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    passed = result.exit_code == 0 and not result.timed_out
    failure_print = None if passed else fingerprint(text.decode("utf-8", "replace"),
                                                    (copy, os.path.realpath(copy), gate.state.root))
    failing = per_test.get("tests_failing")
    return VisibleGate(passed=passed, exit_code=result.exit_code, timed_out=result.timed_out,
                       duration_s=round(time.monotonic() - began, 6), tree=tree, output=text,
                       fingerprint=failure_print, tests_expected=per_test.get("tests_expected"),
                       tests_failing=None if failing is None else tuple(failing))
