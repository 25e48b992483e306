"""`proctor evals`: build a suite, check a packet, verify one answer.

Libraries are imported inside the handlers so that `proctor --help` starts fast.

The manual: docs/commands.md.
"""

from __future__ import annotations

import argparse
import os

from harness.cli.output import Outcome
from harness.errors import Code, EvalRefusal, InputRefusal

__all__ = ["evals_build", "evals_check", "evals_verify"]


def evals_build(args: argparse.Namespace) -> Outcome:
    if args.suite == "humaneval":
        from harness.evals.humaneval import build_humaneval

        return Outcome.of(build_humaneval(args.out or os.path.join("evals", "humaneval")))
    if args.suite == "mutants":
        from harness.evals.mutants import build_mutants

        out = args.out or os.path.join("evals", "mutants")
        return Outcome.of(build_mutants(out, args.package, seed=args.seed, per_package=args.per_package))
    if args.package:
        raise EvalRefusal(Code.SUITE_PACKAGE_SPEC_INVALID, "--package is for the mutants suite only")
    from harness.evals.tasks import build_tasks

    return Outcome.of(build_tasks(args.out or os.path.join("evals", "tasks-suite"), tasks_dir=args.tasks))


def evals_check(args: argparse.Namespace) -> Outcome:
    from harness.evals.suite import load_packet, load_suite

    if os.path.isdir(args.path):
        suite = load_suite(args.path, args.sha256)
        return Outcome.of({"ok": True, "suite": suite.name, "path": args.path, "items": len(suite.packet),
                "packet_sha256": suite.packet.sha256, "private_sha256": suite.manifest["private_sha256"]})  # fmt: skip
    packet = load_packet(args.path, args.sha256)
    return Outcome.of({"ok": True, "path": args.path, "items": len(packet), "packet_sha256": packet.sha256})


def evals_verify(args: argparse.Namespace) -> Outcome:
    from harness.evals.suite import load_suite
    from harness.evals.verify_humaneval import WarmVerifier, verify_response
    from harness.evidence.jsonio import read_bytes

    suite = load_suite(args.suite_dir)
    item = suite.packet.get(args.item)
    private = suite.private[item.item]
    if item.entry_point is None or private.test is None:
        raise EvalRefusal(Code.SUITE_ITEM_UNVERIFIABLE, "not a function-completion item with a hidden test", args.suite_dir)
    try:
        response = read_bytes(args.response, max_bytes=4 * 1024 * 1024).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", args.response) from None
    with WarmVerifier(sandbox=args.sandbox) as verifier:
        verifier.check_sandbox()
        verdict, receipt = verify_response(
            verifier, suite=suite.name, item=item.item, prompt=item.prompt, entry_point=item.entry_point,
            test=private.test, response_text=response, timeout_s=args.timeout,
            private_sha256=suite.manifest["private_sha256"],
        )  # fmt: skip
    return Outcome.of({"ok": verdict.passed, **verdict.to_json(), "item": item.item, "receipt": receipt})
