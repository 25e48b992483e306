"""`proctor` commands about models and providers: catalog, sim, local-model, wire, worker llm-edit.

Libraries are imported inside the handlers so that `proctor --help` starts fast.

The manual: docs/commands.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from harness.cli.output import Outcome, print_json
from harness.errors import EXIT_OK, Code, Refusal, WorkerRefusal

__all__ = [
    "catalog",
    "local_model_serve",
    "local_model_status",
    "local_model_stop",
    "sim_serve",
    "wire_meter",
    "wire_proxy",
    "worker_llm_edit",
]


def catalog(args: argparse.Namespace) -> Outcome:
    from harness.meter.priced_catalog import describe_catalog

    return Outcome.of(describe_catalog(args.catalog, args.pricing))


def sim_serve(args: argparse.Namespace) -> Outcome:
    from harness.providers.sim import build_service, serve

    service = build_service(args.systems, answers=args.answers, tasks=args.tasks, seed=args.seed)

    def ready(info: dict[str, Any]) -> None:
        if args.json:
            print_json(info)
        else:
            names = ", ".join(info["systems"])
            sys.stdout.write(f"simulating {names} at {info['url']} (pid {info['pid']}); stop with Ctrl-C\n")
        sys.stdout.flush()

    summary = serve(service, host=args.host, port=args.port, ready_file=args.ready_file, on_ready=ready)
    if not args.json:
        sys.stderr.write(f"stopped after answering {summary['answered']} requests\n")
    # A foreground server's one output is its ready line, printed above; end here without a second.
    raise SystemExit(EXIT_OK)


def local_model_serve(args: argparse.Namespace) -> Outcome:
    """`proctor local-model serve`: llama.cpp's server with Gemma 3 270M on loopback (`harness.providers.local_model`)."""
    from harness.providers.local_model import serve

    if not args.json:
        sys.stderr.write(f"starting llama.cpp on 127.0.0.1:{args.port} (up to {args.timeout:g} s) ...\n")
    return Outcome.of(serve(args.port, state=args.state_dir, timeout_s=args.timeout))


def local_model_stop(args: argparse.Namespace) -> Outcome:
    from harness.providers.local_model import stop

    return Outcome.of(stop(state=args.state_dir))


def local_model_status(args: argparse.Namespace) -> Outcome:
    from harness.providers.local_model import status

    return Outcome.of(status(state=args.state_dir))


def wire_proxy(args: argparse.Namespace) -> Outcome:
    from harness.meter.proxy import serve_proxy

    def ready(info: dict[str, Any]) -> None:
        if not args.json:
            sys.stderr.write(f"metering proxy at {info['url']} -> {info['upstream']}, recording to {info['out']}\n")

    return Outcome.of(serve_proxy(
        args.upstream, args.out, args.port, host=args.host, ready_file=args.ready_file, name=args.name,
        on_ready=ready,
    ))


def wire_meter(args: argparse.Namespace) -> Outcome:
    from harness.meter.pricing import load_pricing
    from harness.meter.wire import meter_wire, read_wire

    totals = meter_wire(read_wire(args.path, args.name), load_pricing(args.pricing))
    return Outcome.of({"ok": True, "path": args.path, **totals.to_json()})


def worker_llm_edit(args: argparse.Namespace) -> Outcome:
    from harness.workers.llm_edit import run_llm_edit

    prompt_file = args.prompt_file or os.environ.get("PROCTOR_PROMPT_FILE")
    if not prompt_file:
        raise WorkerRefusal(Code.PROMPT_FILE_MISSING, "give --prompt-file or run under proctor dispatch")
    scope = args.scope or _json_list(os.environ.get("PROCTOR_SCOPE", "[]"))
    outcome = run_llm_edit(
        args.model,
        workspace=args.workspace or os.getcwd(),
        prompt_file=prompt_file,
        task_id=args.task_id or os.environ.get("PROCTOR_TASK_ID", "unnamed"),
        scope=scope,
        catalog_path=args.catalog,
        timeout_s=args.timeout,
        repair_turns=args.repair_turns,
        tests_argv=None if args.tests_argv is None else _tests_argv(args.tests_argv),
        tests_timeout_s=args.tests_timeout,
    )
    return Outcome(outcome.to_json(), outcome.exit_code)  # llm-edit's own convention: 75 provider failed, 76 budget stop


def _tests_argv(text: str) -> Any:
    from harness.evidence.jsonio import loads_strict

    try:
        return loads_strict(text.encode("utf-8"), path="--tests-argv", expect_object=False)
    except Refusal as exc:
        raise WorkerRefusal(Code.TESTS_ARGV_INVALID, f"--tests-argv is not JSON: {exc.message}") from None


def _json_list(text: str) -> list[str]:
    from harness.evidence.jsonio import loads_strict

    value = loads_strict(text.encode("utf-8"), path="PROCTOR_SCOPE", expect_object=False)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WorkerRefusal(Code.SCOPE_INVALID, "PROCTOR_SCOPE must be a JSON list of paths", "PROCTOR_SCOPE")
    return value
