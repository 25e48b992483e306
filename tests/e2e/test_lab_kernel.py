"""Interactive runs are the same runs (issue 19): run_study.ipynb executed cell by cell in a `proctor` kernel
through jupyter_client, as JupyterLab executes it, and interrupted as JupyterLab's stop button interrupts it.

The interrupt is the runner's first SIGINT: admission stops, the attempts under way finish and are saved, the
run logs its signal, stop and end and anchors (`assert_interrupted_gracefully`, as the papermill signal tests check), the
last cell raises `StageInterrupted`, and `proctor run` resumes the stage to the same audited records. A run left
to finish gives the records `proctor run` gives: the same plan, byte for byte, and the same finals.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook

from harness.audit.audit import audit_results
from harness.audit.oracle import run_problems
from harness.notebooks.lab import KERNEL_NAME
from tests.support.lab import assert_interrupted_gracefully, slow_study
from tests.support.paths import REPO
from tests.support.study import Sim, logs, run_argv, runner_env


def code_cells(parameters: dict[str, Any]) -> list[str]:
    """run_study.ipynb's code cells with `parameters` injected as papermill injects them, in order."""
    nb = parameterize_notebook(load_notebook_node(str(REPO / "notebooks" / "run_study.ipynb")), parameters,
                               report_mode=False)
    return [c.source for c in nb.cells if c.cell_type == "code"]


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    km, kc = start_new_kernel(kernel_name=KERNEL_NAME, cwd=str(tmp_path), startup_timeout=60)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def reply(kc: BlockingKernelClient, msg_id: str, timeout: float = 180) -> dict[str, Any]:
    """The execute_reply's content for `msg_id` (iopub drained as it comes)."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "no execute_reply"
        got = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if got["parent_header"].get("msg_id") == msg_id:
            content: dict[str, Any] = got["content"]
            return content


def run_cell(kc: BlockingKernelClient, source: str) -> dict[str, Any]:
    return reply(kc, kc.execute(source))


def test_an_interrupted_kernel_stops_the_run_as_a_first_sigint_and_proctor_run_resumes_it(
    tmp_path: Path, sim: Sim, kernel: tuple[KernelManager, BlockingKernelClient]
) -> None:
    km, kc = kernel
    p, results, url = slow_study(tmp_path, sim, latency=3.0)
    folder = results / "rt" / "A"
    cells = code_cells({"prereg": str(p.relative_to(tmp_path)), "stage": "A", "results": "results",
                        "base_url": url})
    run_at = next(i for i, c in enumerate(cells) if "run_with_progress" in c)
    for source in cells[:run_at]:  # parameters, set-up, preflight
        assert run_cell(kc, source)["status"] == "ok"
    running = kc.execute(cells[run_at])
    deadline = time.monotonic() + 120
    while True:  # an attempt under way (attempts take 3 s): the interrupt comes mid-flight
        events = [e["event"] for e in logs(folder)["run"]] if (folder / "run.jsonl").exists() else []
        if events.count("intent") > events.count("attempt"):
            break
        assert time.monotonic() < deadline, "no attempt under way"
        time.sleep(0.05)
    km.interrupt_kernel()  # JupyterLab's stop button: SIGINT to the kernel
    assert reply(kc, running)["status"] == "ok"  # the run cell returns the summary of a graceful stop
    for source in cells[run_at + 1:-1]:  # summary and anchors render
        assert run_cell(kc, source)["status"] == "ok"
    last = run_cell(kc, cells[-1])  # require_complete
    assert (last["status"], last["ename"]) == ("error", "StageInterrupted"), last
    assert_interrupted_gracefully(folder, signal.SIGINT)
    assert run_problems(folder, prereg_dir=p) == []
    # the same files `proctor run` continues: it resumes the stage, and the study audits clean
    done = subprocess.run(run_argv(p, results), cwd=REPO, env=runner_env(url), capture_output=True, timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert run_problems(folder, prereg_dir=p) == []
    assert audit_results(results / "rt", prereg=p).ok


def test_a_kernel_run_gives_the_records_proctor_run_gives(
    tmp_path: Path, sim: Sim, kernel: tuple[KernelManager, BlockingKernelClient]
) -> None:
    _, kc = kernel
    p, results, url = slow_study(tmp_path, sim, latency=0.0)
    for source in code_cells({"prereg": str(p.relative_to(tmp_path)), "stage": "A", "results": "results",
                              "base_url": url}):
        got = run_cell(kc, source)
        assert got["status"] == "ok", got
    cli = tmp_path / "results-cli"
    done = subprocess.run(run_argv(p, cli, "--base-url", url), cwd=REPO, env=runner_env(url), capture_output=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    kernel_stage, cli_stage = results / "rt" / "A", cli / "rt" / "A"
    assert (kernel_stage / "plan.jsonl").read_bytes() == (cli_stage / "plan.jsonl").read_bytes()

    def finals(folder: Path) -> list[tuple[Any, ...]]:
        return sorted((f["run_id"], f["class"], f["passed"], f["rerun"]) for f in logs(folder)["finals"])

    assert finals(kernel_stage) == finals(cli_stage) and len(finals(cli_stage)) == 16  # 8 items x 2 systems
    assert {f[2] for f in finals(cli_stage)} == {True, False}  # sim-flash passes every item, sim-glm none
    assert run_problems(kernel_stage, prereg_dir=p) == [] and run_problems(cli_stage, prereg_dir=p) == []
