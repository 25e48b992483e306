"""`proctor` commands of a study: prereg, plan, resume, run, report, analyze, batch, lab, audit, and ledger.

Libraries are imported inside the handlers so that `proctor --help` starts fast.

The manual: docs/commands.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from harness.cli.output import Outcome, print_json, text_table
from harness.errors import Code, LogRefusal

__all__ = [
    "analyze",
    "analyze_text",
    "anchor_notebook",
    "audit",
    "batch",
    "lab",
    "ledger_repair",
    "ledger_verify",
    "plan",
    "prereg_amend",
    "prereg_check",
    "prereg_freeze",
    "prereg_go",
    "report",
    "resume",
    "run",
]


def _to_stderr(line: str) -> None:
    """A progress line, on stderr as it comes."""
    sys.stderr.write(line)
    sys.stderr.flush()


def _second_signal(as_json: bool, who: Callable[[dict[str, Any]], str], *,
                   before: Callable[[], None] | None = None) -> Callable[[dict[str, Any]], None]:
    """What a second signal prints just before the process ends: its stop record (`--json`) or one line
    on stderr naming `who(record)` stopped; `before` runs first (the progress display's last draw)."""

    def exit_now(record: dict[str, Any]) -> None:
        if before is not None:
            before()
        if as_json:
            print_json(record)
        else:
            sys.stderr.write(f"{who(record)} stopped at once by a second signal (exit {record['exit_code']}): "
                             f"{record['note']}\n")
        sys.stdout.flush()
        sys.stderr.flush()

    return exit_now


def run(args: argparse.Namespace) -> Outcome:
    """`proctor run`: the same library call as notebooks/run_study.ipynb (`harness.run.runner.run_stage`),
    after its preflight (`harness.run.preflight.require_ready`: refused before any provider call)."""
    if args.sandbox is not None:  # the runner's warm verifiers take their default from the environment
        from harness.workers.sandbox import SANDBOX_ENV, resolve_sandbox

        resolve_sandbox(args.sandbox)
        os.environ[SANDBOX_ENV] = args.sandbox

    verifiers = None
    if not args.dry_run and not args.preflight and args.engine == "local":
        import importlib
        import threading

        from harness.evals.verify_pool import VerifierPool, pool_size

        # One pool for the preflight and the run. Its first worker is launched before anything else is
        # read, so that its start (about 0.4 s in bwrap) overlaps this process's own imports and set-up;
        # the preflight launches the rest of the stage's share and judges its trial check on one of them.
        # (A repo_task suite checks on none: its one worker is stopped at the end, unused.)
        verifiers = VerifierPool(pool_size(os.cpu_count() or 1))
        verifiers.prestart(1)
        # the transport (httpx, h11) is imported while the preflight waits for its verifier, not after
        threading.Thread(target=importlib.import_module, args=("harness.providers.transport",),
                         name="proctor-import-transport", daemon=True).start()
    try:
        from harness.cli.progress import ProgressDisplay
        from harness.run.runner import run_stage

        show = None if args.json else ProgressDisplay(sys.stderr)

        exit_now = _second_signal(args.json, lambda record: f"[{record['stage']}]",
                                  before=None if show is None else show.close)

        base_urls = None
        if args.base_url:  # the notebook's parameter, read the notebook's way (its module imported only then)
            from harness.notebooks.stage import study_base_urls

            base_urls = study_base_urls(args.prereg, args.base_url)
        if not args.dry_run and not args.preflight:  # always, before the first provider call
            from harness.run.preflight import require_ready

            require_ready(run_stage(args.prereg, args.stage, args.results, preflight=True, base_urls=base_urls,
                                    verifiers=verifiers))
        try:
            summary = run_stage(
                args.prereg, args.stage, args.results, dry_run=args.dry_run, resume_paused=args.resume_paused,
                preflight=args.preflight, base_urls=base_urls, progress=show, on_exit=exit_now,
                engine=args.engine, address=args.address, verifiers=verifiers,
            )
        finally:  # always a final redraw, before the summary (or a refusal) is printed
            if show is not None:
                show.close()
    finally:
        if verifiers is not None:
            verifiers.close()
    result = summary.to_json()
    if not args.json and not args.dry_run:
        result.pop("cells")
    return Outcome(result, summary.exit_code)


def report(args: argparse.Namespace) -> Outcome:
    """`proctor report`: check a stage folder whole, then print its q table (`harness.audit.report`)."""
    from harness.analysis.tables import q_table
    from harness.audit.report import build_report

    report = build_report(args.stage_dir, prereg_dir=args.prereg)
    rows = q_table(report.frame).to_dicts()
    if args.json:
        return Outcome.of({**report.summary, "q_table": rows})
    summary = {k: v for k, v in report.summary.items() if k != "amendments"}
    summary["amendments"] = [f"{a['amendment']} ({a['at']}): {a['reason']}" for a in report.summary["amendments"]]
    summary["gos"] = [f"{g['go']} ({g['at']}) by {g['by']} under FROZEN.json {g['frozen_sha256'][:12]}"
                      + (f": {g['note']}" if g["note"] else "") for g in report.summary["gos"]]
    summary["exhausted_cells"] = {s: f"{len(ids)} cell(s), never scored (run ids in --json)"
                                  for s, ids in report.summary["exhausted_cells"].items()}
    shown = ["system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high", "cost_usd",
             "cost_per_pass_usd", "latency_median_s"]
    places = {"pass_rate": 3, "wilson_low": 3, "wilson_high": 3, "cost_usd": 4, "cost_per_pass_usd": 4,
              "latency_median_s": 2}
    table = text_table(rows, shown, places) if rows else "(no scored cells)"
    return Outcome.of({**summary, "q_table": table + "\n(money in USD, rounded: full precision in --json)"})


def analyze(args: argparse.Namespace) -> Outcome:
    """`proctor analyze`: run notebooks/analysis.ipynb, export HTML, anchor every output (`harness.notebooks.analyze`)."""
    from harness.notebooks.analyze import analyze_results

    if args.check:
        from harness.notebooks.analyze import check_analysis

        checked = check_analysis(args.results, prereg=args.prereg, out=args.out, progress=None if args.json else _to_stderr)
        return Outcome.of(checked.to_json())
    got = analyze_results(args.results, prereg=args.prereg, out=args.out, progress=None if args.json else _to_stderr)
    return Outcome.of(got if args.json else analyze_text(got))


def analyze_text(got: dict[str, Any]) -> dict[str, Any]:
    """What `proctor analyze` prints without --json, from `analyze_results`' return: the q table rounded, the
    verdict and break-even lines, a repository-task study's break-even lines (with v measured or assumed), and
    the files written."""
    shown = ("stage", "system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high", "cost_usd",
             "cost_per_pass_usd")
    repo = {"repo_break_even": got["repo_break_even"]} if got.get("repo_break_even") else {}
    return {"ok": True, "study": got["study"], "prereg": got["prereg"],
            "q_table": [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items() if k in shown}
                        for row in got["q_table"]],
            "comparisons": got["verdicts"], "break_even": got["break_even"], **repo,
            "notebook": got["notebook"]["path"], "html": got["html"]["path"],
            "tables": [t["path"] for t in got["tables"]], "figures": [f["path"] for f in got["figures"]],
            "anchored_in": [a["folder"] for a in got["anchored"]]}


def batch(args: argparse.Namespace) -> Outcome:
    """`proctor batch`: run a batch file's notebooks in order with papermill (`harness.notebooks.batch`)."""
    from harness.notebooks.batch import run_batch

    return Outcome.of(run_batch(args.file, progress=None if args.json else _to_stderr,
                                on_exit=_second_signal(args.json, lambda _record: "batch")))


def anchor_notebook(args: argparse.Namespace) -> Outcome:
    """`proctor anchor-notebook`: anchor a plain papermill run's executed copy (`harness.notebooks.stage`)."""
    from harness.notebooks.stage import anchor_executed

    got = anchor_executed(args.executed)
    return Outcome.of({"ok": True, "notebook": got.path, "sha256": got.sha256, "interrupted": got.interrupted,
                       "anchor": got.anchor})


def lab(args: argparse.Namespace) -> Outcome:
    """`proctor lab`: the `proctor` kernelspec, then JupyterLab in its place (`harness.notebooks.lab`)."""
    from harness.evidence.paths import repo_root
    from harness.notebooks.lab import KERNEL_NAME, lab_argv, lab_env, project_kernel

    env = lab_env()
    os.environ["JUPYTER_PATH"] = env["JUPYTER_PATH"]  # the environment's kernelspec first, as JupyterLab will see it
    folder = project_kernel()
    if args.kernel_only:
        return Outcome.of({"ok": True, "kernel": KERNEL_NAME, "kernelspec": folder})
    argv = lab_argv(repo_root(), port=args.port, token=args.token, open_browser=not args.no_browser)
    os.execve(argv[0], argv, env)  # JupyterLab takes this process: Ctrl-C stops it as Jupyter does


def audit(args: argparse.Namespace) -> Outcome:
    """`proctor audit`: check that nothing in a study's results was altered (`harness.audit.audit`); exit 1 on a break."""
    from harness.audit.audit import audit_results

    got = audit_results(args.results, prereg=args.prereg).to_json()
    if args.json:
        return Outcome.of(got)
    shown = ("ok", "study", "folder", "prereg", "frozen_sha256", "verified", "witness", "sandbox", "guarantees")
    problems = [f"{p['file']}{'' if p['line'] is None else ':' + str(p['line'])}: [{p['rule']}] {p['message']}"
                for p in got["problems"]]
    return Outcome.of({**{k: got[k] for k in shown}, "problems": problems})


def prereg_check(args: argparse.Namespace) -> Outcome:
    from harness.prereg.check import check_prereg

    return Outcome.of(check_prereg(args.dir))


def prereg_freeze(args: argparse.Namespace) -> Outcome:
    from harness.prereg.freeze import freeze

    return Outcome.of(freeze(args.dir))


def prereg_amend(args: argparse.Namespace) -> Outcome:
    from harness.prereg.freeze import amend

    if args.note is not None:
        return Outcome.of(amend(args.dir, args.note, note=True))
    return Outcome.of(amend(args.dir, args.reason))


def prereg_go(args: argparse.Namespace) -> Outcome:
    """`proctor prereg go DIR --stage S --by NAME [--note TEXT]`: show the stage's budget, then record the go."""
    import json
    import sys

    from harness.prereg.go import give_go

    def show(budget: dict[str, object]) -> None:
        if not args.json:
            sys.stderr.write(f"budget of stage {budget['stage']}: {json.dumps(budget, sort_keys=True)}\n")
            sys.stderr.flush()

    return Outcome.of(give_go(args.dir, args.stage, args.by, args.note, show=show))


def plan(args: argparse.Namespace) -> Outcome:
    from harness.prereg.plan import write_plan

    return Outcome.of(write_plan(args.dir, args.scope, args.out))


def resume(args: argparse.Namespace) -> Outcome:
    from harness.run.resume import resume

    return Outcome.of(resume(
        args.plan, args.attempts, args.out, stage=args.stage, transport_retries=args.transport_retries
    ))


def ledger_verify(args: argparse.Namespace) -> Outcome:
    from harness.evidence.chain_read import verify_log

    report = verify_log(args.path, args.seed)
    return Outcome.of({**report.to_json(), "ok": report.ok})


def ledger_repair(args: argparse.Namespace) -> Outcome:
    from harness.evidence.chain import ChainedLog
    from harness.evidence.chain_read import verify_log

    seed = args.seed or verify_log(args.path).seed
    if seed is None:
        raise LogRefusal(Code.LOG_SEED_UNKNOWN, "an empty or seedless log: give --seed", args.path)
    return Outcome.of({"ok": True, **ChainedLog(args.path, seed).repair()})
