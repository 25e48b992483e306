"""`proctor` commands of the gated path: lane, init, dispatch, verify, accept, status, journal, record, delegate.

Each handler calls `harness.gate` and turns its typed result into an `Outcome`:
the JSON, and the exit code chosen here (1 when a worker failed or a
verification did not pass). Libraries are imported inside the handlers.

The manual: docs/commands.md.
"""

from __future__ import annotations

import argparse

from harness.cli.output import Outcome
from harness.errors import EXIT_FAILED, EXIT_OK, Code, InputRefusal

__all__ = ["accept", "delegate", "dispatch", "init", "journal", "lane", "record", "status", "verify"]


def _failed_unless(ok: bool) -> int:
    return EXIT_OK if ok else EXIT_FAILED


def lane(args: argparse.Namespace) -> Outcome:
    from harness.gate.lanes import choose_lane
    from harness.gate.task import load_task

    task = load_task(args.task)
    return Outcome({"ok": True, "task_id": task.task_id, **choose_lane(task).to_json()}, EXIT_OK)


def init(args: argparse.Namespace) -> Outcome:
    from harness.gate.initialize import init_workspace

    return Outcome(init_workspace(args.workspace, args.task, args.state_dir).to_json(), EXIT_OK)


def dispatch(args: argparse.Namespace) -> Outcome:
    """Exit 1 when the worker exited non-zero or timed out."""
    from harness.gate.dispatch import dispatch

    if args.model is not None:
        got = dispatch(
            args.workspace, args.task, None, args.state_dir,
            model=args.model, catalog_path=args.catalog, pricing_path=args.pricing, sandbox=args.sandbox,
        )  # fmt: skip
    else:
        got = dispatch(args.workspace, args.task, args.worker_argv, args.state_dir, sandbox=args.sandbox)
    return Outcome(got.to_json(), _failed_unless(got.succeeded))


def verify(args: argparse.Namespace) -> Outcome:
    """Exit 1 when the verification did not pass."""
    from harness.gate.verify import verify

    got = verify(args.workspace, args.task, args.state_dir, sandbox=args.sandbox)
    return Outcome(got.to_json(), _failed_unless(got.passed))


def accept(args: argparse.Namespace) -> Outcome:
    from harness.gate.accept import accept

    got = accept(
        args.workspace,
        args.task,
        allow_zero_dispatch=args.allow_zero_dispatch,
        allow_detached_payload=args.allow_detached_payload,
        allow_flagged=args.allow_flagged,
        state_dir=args.state_dir,
    )
    return Outcome(got.to_json(), EXIT_OK)


def status(args: argparse.Namespace) -> Outcome:
    from harness.gate.status import status

    return Outcome(status(args.workspace, args.state_dir).to_json(), EXIT_OK)


def journal(args: argparse.Namespace) -> Outcome:
    from harness.gate.status import acknowledge, journal_tail

    if args.ack:
        return Outcome(acknowledge(args.workspace, args.ack, args.state_dir).to_json(), EXIT_OK)
    return Outcome(journal_tail(args.workspace, args.state_dir, args.tail).to_json(), EXIT_OK)


def record(args: argparse.Namespace) -> Outcome:
    from harness.gate.record import record_task

    got = record_task(args.workspace, args.task, args.wire or (), args.pricing, args.catalog, args.state_dir)
    return Outcome(got.to_json(), EXIT_OK)


def delegate(args: argparse.Namespace) -> Outcome:
    """Exit 1 when the worker exited non-zero or timed out."""
    from harness.evidence.jsonio import read_bytes
    from harness.gate.delegate import delegate

    if args.task_file is not None:
        try:
            text = read_bytes(args.task_file, max_bytes=4 * 1024 * 1024).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", args.task_file) from None
    else:
        text = args.task_text
    got = delegate(
        args.workspace, text, model=args.model, command=args.worker_argv if args.command else None,
        write=args.write, resume_from=args.resume_from, catalog_path=args.catalog, timeout_s=args.timeout,
        sandbox=args.sandbox,
    )  # fmt: skip
    return Outcome(got.to_json(), _failed_unless(got.succeeded))
