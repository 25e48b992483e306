"""The `proctor` command: argument parsing and printing only.

Every command takes `--json` (stdout is then exactly one JSON object: the
result or the refusal). Exit codes: 0 success, 1 the thing checked failed,
2 usage error, 3 refused, 4 internal error. Library modules are imported
inside the handlers so that `proctor --help` starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from harness import __version__
from harness.errors import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, Refusal

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], dict[str, Any]]


class UsageError(Exception):
    """Bad command-line words."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


# --- handlers (each imports what it uses) -----------------------------------


def _lane(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.lanes import choose_lane
    from harness.proctor.task import load_task

    task = load_task(args.task)
    return {"ok": True, "task_id": task.task_id, **choose_lane(task).to_json()}


def _init(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.initialize import init_workspace

    return init_workspace(args.workspace, args.task, args.state_dir)


def _dispatch(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.dispatch import dispatch

    return dispatch(args.workspace, args.task, args.worker_argv, args.state_dir)


def _verify(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.verify import verify

    return verify(args.workspace, args.task, args.state_dir)


def _accept(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.accept import accept

    return accept(
        args.workspace,
        args.task,
        allow_zero_dispatch=args.allow_zero_dispatch,
        allow_detached_payload=args.allow_detached_payload,
        state_dir=args.state_dir,
    )


def _status(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.status import status

    return status(args.workspace, args.state_dir)


def _journal(args: argparse.Namespace) -> dict[str, Any]:
    from harness.proctor.status import acknowledge, journal_tail

    if args.ack:
        return acknowledge(args.workspace, args.ack, args.state_dir)
    return journal_tail(args.workspace, args.state_dir, args.tail)


def _ledger_verify(args: argparse.Namespace) -> dict[str, Any]:
    from harness.evidence.chain import verify_log

    report = verify_log(args.path, args.seed)
    return {**report.to_json(), "ok": report.ok}


def _ledger_repair(args: argparse.Namespace) -> dict[str, Any]:
    from harness.evidence.chain import ChainedLog, verify_log

    seed = args.seed or verify_log(args.path).seed
    if seed is None:
        raise Refusal("log_seed_unknown", "an empty or seedless log: give --seed", args.path)
    return {"ok": True, **ChainedLog(args.path, seed).repair()}


# --- the parser ---------------------------------------------------------------


def _parser() -> _Parser:
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ws = _Parser(add_help=False)
    ws.add_argument("--workspace", required=True, help="the top of the task's git work tree")
    ws.add_argument("--state-dir", help="root of state folders (default: <workspace parent>/.runner-state)")
    task = _Parser(add_help=False)
    task.add_argument("--task", required=True, help="the task file (task.json)")

    parser = _Parser(prog="proctor", description="Preregistered, verified evaluations of models and coding agents.")
    parser.add_argument("--version", action="version", version=f"proctor {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    def add(name: str, handler: Handler, help_text: str, *parents: _Parser) -> _Parser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common, *parents])
        p.set_defaults(handler=handler)
        return p

    add("lane", _lane, "Pick the lane for a task from its features.", task)
    add("init", _init, "Pin the task, seal the verifier's inputs, record the baseline tree.", ws, task)
    p = add("dispatch", _dispatch, "Run a worker in the workspace under the task's budget.", ws, task)
    p.add_argument(
        "--command", action="store_true", required=True, help="-- ARGV...: the worker; everything after it"
    )
    add("verify", _verify, "Run the sealed verifier on a fresh copy and write a receipt.", ws, task)
    p = add("accept", _accept, "Accept the current tree on a passing receipt.", ws, task)
    p.add_argument("--allow-zero-dispatch", action="store_true", help="accept with no dispatch (counted)")
    p.add_argument("--allow-detached-payload", action="store_true", help="accept despite detached processes (counted)")
    add("status", _status, "Report dispatches, stalls, orphans, receipts.", ws)
    p = add("journal", _journal, "Show the journal, or acknowledge an orphaned dispatch.", ws)
    p.add_argument("--ack", metavar="DISPATCH_ID", help="acknowledge an orphaned dispatch")
    p.add_argument("--tail", type=int, default=20, help="how many events to show")

    ledger = sub.add_parser("ledger", help="Check or repair a chained JSONL log.")
    lsub = ledger.add_subparsers(dest="ledger_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    for name, handler, text in (
        ("verify", _ledger_verify, "Verify a chained log; exit 1 naming the first bad line."),
        ("repair", _ledger_repair, "Move a torn tail to a quarantine file and record it."),
    ):
        p = lsub.add_parser(name, help=text, description=text, parents=[common])
        p.add_argument("path", help="the .jsonl log")
        p.add_argument("--seed", help="the seed the log must start from")
        p.set_defaults(handler=handler)
    return parser


# --- printing -------------------------------------------------------------------


def _print_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, ensure_ascii=True) + "\n")


def _human(obj: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (dict, list)) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(_human(value, indent + 1))
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}")
    elif isinstance(obj, list):
        for value in obj:
            if isinstance(value, dict):
                sub = _human(value, indent + 1)
                lines.append(f"{pad}- {sub[0].strip()}" if sub else f"{pad}-")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_scalar(value)}")
    return lines


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) and "\n" in value:
        return "\n    " + value.rstrip("\n").replace("\n", "\n    ")
    if value == [] or value == {}:
        return "(none)"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one proctor command; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    worker: list[str] = []
    if "--command" in words:  # everything after it is the worker's argv, untouched
        cut = words.index("--command") + 1
        words, worker = words[:cut], words[cut:]
        worker = worker[1:] if worker[:1] == ["--"] else worker
    as_json = "--json" in words
    try:
        args = _parser().parse_args(words)
        args.worker_argv = worker
    except UsageError as exc:
        if as_json:
            _print_json({"ok": False, "refusal": "usage_error", "message": str(exc)})
        else:
            sys.stderr.write(f"{exc}\nTry 'proctor --help'.\n")
        return EXIT_USAGE
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    try:
        result = args.handler(args)
    except Refusal as refusal:
        if args.json:
            _print_json(refusal.to_json())
        else:
            where = f" ({refusal.path})" if refusal.path else ""
            sys.stderr.write(f"refused: {refusal.code}: {refusal.message}{where}\n")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("PROCTOR_DEBUG"):
            raise
        message = f"{type(exc).__name__}: {exc}"
        if args.json:
            _print_json({"ok": False, "refusal": "internal_error", "message": message})
        else:
            sys.stderr.write(f"internal error: {message} (set PROCTOR_DEBUG=1 for the traceback)\n")
        return EXIT_INTERNAL
    if args.json:
        _print_json(result)
    else:
        sys.stdout.write("\n".join(_human(result)) + "\n")
    return EXIT_OK if result.get("ok", True) else EXIT_FAILED
