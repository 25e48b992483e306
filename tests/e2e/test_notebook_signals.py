"""Real signals to a real `proctor batch` and a real `papermill` running notebooks/run_study.ipynb (issue 13 item 6).

The first SIGINT/SIGTERM is the runner's graceful stop inside the kernel (admission
stops, the attempts under way finish and are saved, the run logs its signal, stop and
end, anchors); the executed copy is kept and anchored as `run_study.interrupted-<n>.ipynb`,
and the resume's copy never replaces it. A second signal to `proctor batch` exits at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.audit.audit import audit_results
from harness.audit.oracle import run_problems
from harness.evidence.jsonio import sha256_hex
from tests.support.paths import REPO, checkout_at
from tests.support.study import Sim, logs, prereg, runner_env, system, wait_in_flight

RUN_STUDY = REPO / "notebooks" / "run_study.ipynb"


def wait_for_lines(folder: Path, proc: subprocess.Popen[bytes], n: int, log: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    path = folder / f"{log}.jsonl"
    while not (path.exists() and path.read_bytes().count(b"\n") >= n):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {n} lines in {path}"
        time.sleep(0.02)


def setup(tmp_path: Path, sim: Sim, latency: float) -> tuple[Path, Path, str]:
    """The study laid out in a checkout at tmp_path (the kernels run there), so that the executed notebooks
    name it relative to it: new evidence must be portable (the audit's `absolute_path`)."""
    checkout_at(tmp_path)
    url = sim([system("sim-flash", 1.0, latency=latency), system("sim-glm", 0.0, latency=latency)],
              latency_scale=1.0)
    return prereg(tmp_path, items=8), tmp_path / "results", url


def batch_file(tmp_path: Path, p: Path, results: Path, url: str) -> Path:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({"jobs": [{
        "notebook": str(RUN_STUDY), "out": str(results / "rt" / "A" / "run_study.ipynb"), "cwd": str(tmp_path),
        "parameters": {"prereg": str(p), "stage": "A", "results": str(results), "base_url": url}}]}))
    return path


def batch_argv(path: Path) -> list[str]:
    return [sys.executable, "-m", "harness", "batch", str(path), "--json"]


def notebook_anchors(folder: Path) -> dict[str, str]:
    """{manifest name: sha256} over every `notebook` anchor of the stage (the latest for each name)."""
    out: dict[str, str] = {}
    for a in logs(folder)["anchors"]:
        if a["reason"] == "notebook":
            out.update(a["manifests"])
    return out


def assert_graceful_stop(folder: Path, signum: int) -> None:
    got = logs(folder)
    sig = [e for e in got["run"] if e["event"] == "signal"]
    assert [(e["signum"], e["count"]) for e in sig] == [(int(signum), 1)]
    assert [e["cause"] for e in got["run"] if e["event"] == "stop"] == ["interrupt"]
    assert got["run"][-1]["event"] == "end" and got["run"][-1]["exit_code"] == 1
    at = sig[0]["at"]
    assert all(a["started"] <= at for a in got["attempts"])  # nothing started after the signal
    assert any(a["ended"] > at for a in got["attempts"]), "no attempt was under way at the signal"
    # every attempt has its final or its run event: nothing died mid-flight
    assert len([e for e in got["run"] if e["event"] == "attempt"]) == len(got["attempts"])
    assert "end" in [a["reason"] for a in got["anchors"]]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_first_signal_to_proctor_batch_stops_the_run_gracefully_and_keeps_the_notebook(
    tmp_path: Path, sim: Sim, signum: int
) -> None:
    p, results, url = setup(tmp_path, sim, latency=3.0)
    folder = results / "rt" / "A"
    batch = batch_file(tmp_path, p, results, url)
    env = runner_env(url)
    proc = subprocess.Popen(batch_argv(batch), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_in_flight(folder, proc)  # attempts take 3 s: still under way when the kernel gets the signal
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    record = json.loads(out)
    assert record["stopped"] == "interrupt" and record["failed"]["ename"] == "StageInterrupted", record
    kept = folder / "run_study.interrupted-1.ipynb"
    assert record["failed"]["executed"] == str(kept) and kept.exists()
    assert not (folder / "run_study.ipynb").exists()
    assert b"Traceback" not in err, err  # no kernel traceback: the notebook ended on StageInterrupted
    assert_graceful_stop(folder, signal.SIGINT)  # either signal reaches the kernel as its interrupt (SIGINT)
    assert notebook_anchors(folder) == {"notebook:run_study.interrupted-1.ipynb": sha256_hex(kept.read_bytes())}
    assert run_problems(folder, prereg_dir=p) == []
    if signum == signal.SIGTERM:
        # the resume is run once, after SIGINT: the asserts above show SIGTERM ends in the same state (the kernel's
        # interrupt logged as SIGINT, the same kept copy and anchors), so resuming it again would repeat that run
        return
    # the resume (the same batch) completes the stage; the interrupted copy stays as it was, both anchored
    kept_bytes = kept.read_bytes()
    again = subprocess.run(batch_argv(batch), cwd=REPO, env=env, capture_output=True, timeout=300)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert kept.read_bytes() == kept_bytes
    assert notebook_anchors(folder) == {
        "notebook:run_study.interrupted-1.ipynb": sha256_hex(kept_bytes),
        "notebook:run_study.ipynb": sha256_hex((folder / "run_study.ipynb").read_bytes())}
    assert run_problems(folder, prereg_dir=p) == []
    audit = audit_results(results / "rt", prereg=p)
    assert audit.ok, audit.to_json()["problems"]


def test_a_second_signal_to_proctor_batch_exits_at_once_with_its_stop_record(tmp_path: Path, sim: Sim) -> None:
    p, results, url = setup(tmp_path, sim, latency=1.5)
    folder = results / "rt" / "A"
    batch = batch_file(tmp_path, p, results, url)
    proc = subprocess.Popen(batch_argv(batch), cwd=REPO, env=runner_env(url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    wait_for_lines(folder, proc, 2, "admission", timeout=120)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.2)
    t = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, (out, err)
    assert time.monotonic() - t < 5.0  # at once: not after the in-flight attempts (1.5 s each) and the kernel end
    record = json.loads(out)
    assert (record["ok"], record["stopped"], record["signum"], record["job"]) == (
        False, "second_signal", int(signal.SIGINT), 1), record


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_first_signal_to_papermill_stops_the_run_gracefully_and_anchor_notebook_keeps_it(
    tmp_path: Path, sim: Sim, signum: int
) -> None:
    p, results, url = setup(tmp_path, sim, latency=3.0)
    folder = results / "rt" / "A"
    out_nb = folder / "run_study.ipynb"
    folder.mkdir(parents=True)  # papermill writes its output only into a folder that exists
    env = runner_env(url)
    argv = [str(Path(sys.executable).parent / "papermill"), str(RUN_STUDY), str(out_nb),
            "-p", "prereg", str(p), "-p", "stage", "A", "-p", "results", str(results), "-p", "base_url", url]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_in_flight(folder, proc)  # attempts take 3 s: still under way when the kernel gets the signal
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, (out, err)
    # SIGINT: papermill interrupts its kernel; SIGTERM ends papermill, and the orphaned kernel stops the run
    assert_graceful_stop(folder, signum)
    assert run_problems(folder, prereg_dir=p) == []
    # papermill interrupts the kernel, then kills it within seconds: the copy shows the run cell cut short
    executed = json.loads(out_nb.read_text())
    ends = [(c["execution_count"], c["metadata"]["papermill"].get("end_time")) for c in executed["cells"]
            if c["cell_type"] == "code"]
    assert ends[0][1] is not None and ends[-1] == (None, None), ends
    got = subprocess.run([sys.executable, "-m", "harness", "anchor-notebook", str(out_nb), "--json"], cwd=REPO,
                         env=env, capture_output=True, timeout=60)
    assert got.returncode == 0, (got.stdout, got.stderr)
    kept = folder / "run_study.interrupted-1.ipynb"
    assert json.loads(got.stdout)["notebook"] == str(kept) and not out_nb.exists()
    assert json.loads(got.stdout)["interrupted"] is True
    assert notebook_anchors(folder) == {"notebook:run_study.interrupted-1.ipynb": sha256_hex(kept.read_bytes())}
    assert run_problems(folder, prereg_dir=p) == []
