"""The interleaved study runner (`harness.run.runner.run_stage`) against the real simulator.

A tiny frozen preregistration (6 HumanEval items, systems at skill 1.0 and 0.0)
runs against `proctor sim serve` started with the HumanEval answers file, so a
skill-1.0 system delivers correct programs and the warm verifier passes them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.audit.oracle import run_problems
from harness.errors import Refusal
from harness.evidence.group import GroupWriter
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.evidence.lock import InvocationLock
from harness.run.runner import run_stage
from tests.support.paths import REPO
from tests.support.study import Sim, logs, prereg, system, urls


def test_a_clean_run_stands_every_cell_with_verified_receipts(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    seen: list[Any] = []
    summary = run_stage(prereg(tmp_path), "A", tmp_path / "results", base_urls=urls(url), progress=seen.append)
    assert summary.exit_code == 0 and summary.complete, summary.to_json()
    folder = Path(summary.folder)
    assert folder == tmp_path / "results" / "rt" / "A"
    got = logs(folder)
    finals = got["finals"]
    assert len(finals) == 12 and all(f["action"] == "stand" and f["class"] == "delivered" for f in finals)
    passed = {f["system"]: set() for f in finals}
    for f in finals:
        passed[f["system"]].add(f["passed"])
        receipt = (folder / f["receipt"]).read_bytes()
        assert sha256_hex(receipt) == f["receipt_sha256"]
        assert json.loads(receipt)["schema"] == "proctor-item-receipt.v1"
    assert passed == {"good": {True}, "bad": {False}}
    # every attempt has one run-log line that hashes as logged
    lines = [canonical_bytes(r) for r in got["attempts"]]
    logged = [e for e in got["run"] if e["event"] == "attempt"]
    assert sorted(e["attempts_line"] for e in logged) == list(range(1, len(lines) + 1))
    assert all(sha256_hex(lines[e["attempts_line"] - 1]) == e["attempt_sha256"] for e in logged)
    assert all(a["decision"] == "admit" for a in got["admission"]) and len(got["admission"]) == 12
    assert got["host"] and got["anchors"][-1]["reason"] == "end"
    assert (folder / "wire.jsonl").exists() and (folder / "plan.jsonl").exists()
    assert seen and seen[-1].systems[0].standing == 6
    # lanes take items in plan order: per lane, admissions follow lane_position
    # a second invocation finds everything standing and sends nothing
    again = run_stage(tmp_path / "prereg" / "rt", "A", tmp_path / "results", base_urls=urls(url))
    assert again.exit_code == 0 and len(logs(folder)["attempts"]) == len(lines)
    # issue 13 item 10: the items admitted count every invocation; this invocation's own are apart
    assert [(s.items_admitted, s.items_admitted_now) for s in summary.progress.systems] == [(6, 6), (6, 6)]
    assert [(s.items_admitted, s.items_admitted_now) for s in again.progress.systems] == [(6, 0), (6, 0)]


def test_a_provider_error_is_rerun_with_its_final_archived(tmp_path: Path, sim: Sim) -> None:
    # the simulator decides each failure from (seed, system, item, n): with 0.5 some first requests fail
    url = sim([system("sim-flash", 1.0, server_error=0.5), system("sim-glm", 0.0)])
    summary = run_stage(prereg(tmp_path), "A", tmp_path / "results", base_urls=urls(url))
    folder = Path(summary.folder)
    finals = logs(folder)["finals"]
    reruns = [f for f in finals if f["action"] == "rerun"]
    assert reruns and all(f["class"] == "provider" and f["error_code"] == "server_error" for f in reruns)
    replacing = [f for f in finals if f["replaced"]]
    assert replacing
    for f in replacing:
        for entry in f["replaced"]:
            data = (folder / entry["archive"]).read_bytes()
            assert sha256_hex(data) == entry["sha256"]
            old = json.loads(data)
            assert old["run_id"] == f["run_id"] and old["rerun"] == entry["rerun"]
        assert len(f["replaced"]) == f["rerun"]
    attempts = logs(folder)["attempts"]
    assert max(a["rerun"] for a in attempts) >= 1


def test_admission_refuses_at_a_tiny_cap_and_keeps_refusing(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    summary = run_stage(prereg(tmp_path, caps=(0.015, 1.0), reserve=0.01), "A", tmp_path / "results",
                        base_urls=urls(url))
    assert summary.exit_code == 1 and not summary.complete
    adm = [a for a in logs(Path(summary.folder))["admission"] if a["system"] == "good"]
    refused = [a for a in adm if a["decision"] == "refuse"]
    assert refused and refused[0]["reason"] == "over_cap"
    first = adm.index(refused[0])
    assert all(a["decision"] == "refuse" for a in adm[first:])
    for a in adm:
        assert (a["decision"] == "admit") == (not a["refused_before"] and not a["ceiling"]["crossed"]
                                               and a["finished_usd"] + a["reserve_usd"] * a["under_way"]
                                               <= a["cap_usd"])
    bad = [a for a in logs(Path(summary.folder))["admission"] if a["system"] == "bad"]
    assert all(a["decision"] == "admit" for a in bad)


def test_crossing_the_ceiling_stops_everything(tmp_path: Path, sim: Sim) -> None:
    # the cheap, fast system crosses the ceiling while the slow one's first attempts are under way
    url = sim([system("sim-flash", 1.0, latency=0.05), system("sim-glm", 0.0, latency=2.0)], latency_scale=1.0)
    summary = run_stage(prereg(tmp_path, overall=0.0003, margin=0.0, reserve=0.00001), "A", tmp_path / "results",
                        base_urls=urls(url))
    assert summary.exit_code == 1
    got = logs(Path(summary.folder))
    ceiling = [e for e in got["run"] if e["event"] == "ceiling"]
    assert {e["system"] for e in ceiling} == {"good", "bad"}
    crossed_at = ceiling[0]["crossed_at"]
    assert {s["cause"] for s in summary.stops} == {"ceiling"}
    assert all(a["started"] <= crossed_at for a in got["attempts"])
    assert any(a.get("error_code") == "budget_stop" for a in got["attempts"])
    assert all(a["at"] <= crossed_at or a["decision"] == "refuse" for a in got["admission"])


def test_an_attempt_past_its_deadline_stops_the_system(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0, latency=3.0)], latency_scale=1.0)
    summary = run_stage(prereg(tmp_path, deadline=1, items=2), "A", tmp_path / "results", base_urls=urls(url))
    assert summary.exit_code == 1
    got = logs(Path(summary.folder))
    late = [a for a in got["attempts"] if a.get("error_code") == "AttemptDeadline"]
    assert late and all(a["cost_usd"] == "unknown" for a in late)
    assert {"system": "bad", "cause": "deadline"} in [{k: s[k] for k in ("system", "cause")} for s in summary.stops]
    assert [e for e in got["run"] if e["event"] == "late_cost"]  # the abandoned request's spend, later
    good = [f for f in got["finals"] if f["system"] == "good"]
    assert len(good) == 2 and all(f["action"] == "stand" for f in good)


def test_resume_after_a_stop_continues_without_double_counting(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    folder_p = prereg(tmp_path, caps=(0.015, 1.0))
    first = run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url))
    assert first.exit_code == 1
    spend_before = {s.system: s.spend_usd for s in first.progress.systems}
    n = len(logs(Path(first.folder))["attempts"])
    dry = run_stage(folder_p, "A", tmp_path / "results", dry_run=True, base_urls=urls(url))
    assert {s.system: s.spend_usd for s in dry.progress.systems} == spend_before
    # a refusal persists: the rerun continues from the files and sends nothing more for the refused system
    second = run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url))
    assert {s.system: s.spend_usd for s in second.progress.systems} == spend_before
    assert len(logs(Path(first.folder))["attempts"]) == n


def test_resume_after_an_interrupted_run_finishes_it(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    folder_p = prereg(tmp_path)
    results = tmp_path / "results"
    # simulate a crash: run fully, then cut the finals log back to its first 3 lines
    summary = run_stage(folder_p, "A", results, base_urls=urls(url))
    folder = Path(summary.folder)
    finals = (folder / "finals.jsonl").read_bytes().splitlines(keepends=True)
    (folder / "finals.jsonl").write_bytes(b"".join(finals[:3]))
    costs = {s.system: s.spend_usd for s in summary.progress.systems}
    n = len(logs(folder)["attempts"])
    again = run_stage(folder_p, "A", results, base_urls=urls(url))
    assert again.exit_code == 0
    assert len(logs(folder)["attempts"]) == n  # finals re-derived from the saved attempts, no new call
    assert {s.system: s.spend_usd for s in again.progress.systems} == costs
    # issue 13 item 10: the resume that completed the stage reports every item admitted, not only its own
    assert {s.system: s.items_admitted for s in again.progress.systems} == {"good": 6, "bad": 6}


def test_a_second_invocation_is_refused_while_the_first_holds_the_folder(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    folder_p = prereg(tmp_path)
    stage_dir = tmp_path / "results" / "rt" / "A"
    stage_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from harness.evidence.lock import InvocationLock\n"
        f"lock = InvocationLock({str(stage_dir / '.invocation.lock')!r}); lock.acquire()\n"
        "print('held', flush=True); time.sleep(30)")], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(Refusal) as caught:
            run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url))
        assert caught.value.code == "invocation_locked"
    finally:
        holder.kill()
        holder.wait()
    with InvocationLock(stage_dir / ".invocation.lock"):
        pass


def test_a_dry_run_makes_no_provider_call(tmp_path: Path, sim: Sim) -> None:
    folder_p = prereg(tmp_path)
    dead = "http://127.0.0.1:9/v1"  # nothing listens: any call would fail
    summary = run_stage(folder_p, "A", tmp_path / "results", dry_run=True, base_urls=urls(dead))
    assert summary.mode == "dry_run" and summary.exit_code == 1
    assert len(summary.cells) == 12 and all(c["next"] == {"rerun": 0, "attempt": 1} for c in summary.cells)
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


def test_preflight_reports_an_unreachable_endpoint(tmp_path: Path, sim: Sim) -> None:
    folder_p = prereg(tmp_path)
    bad = run_stage(folder_p, "A", tmp_path / "results", preflight=True, base_urls=urls("http://127.0.0.1:9/v1"))
    assert bad.exit_code == 1 and [p["check"] for p in bad.problems] == ["endpoint"]
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    good = run_stage(folder_p, "A", tmp_path / "results", preflight=True, base_urls=urls(url))
    assert good.exit_code == 0, good.problems


def test_proctor_run_takes_the_notebooks_base_url(tmp_path: Path, sim: Sim) -> None:
    # issue 13 item 10: `proctor run --base-url URL` sends every system's model there, as the run
    # notebook's base_url parameter does, without PROCTOR_SIM_URL in the environment
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    p = prereg(tmp_path, items=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    argv = [sys.executable, "-m", "harness", "run", str(p), "--stage", "A", "--results", str(tmp_path / "results"),
            "--json"]
    done = subprocess.run([*argv, "--preflight", "--base-url", url], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    done = subprocess.run([*argv, "--base-url", url], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = json.loads(done.stdout)
    assert summary["complete"] and [s["standing"] for s in summary["progress"]["systems"]] == [2, 2]
    wire = logs(Path(summary["folder"]))["attempts"]
    assert len(wire) == 4


# --------------------------------------------------------------------------
# Issue 13 item 1: an outage must never become data


def _dead_url() -> str:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: every connection is refused
    return f"http://127.0.0.1:{port}/v1"


def test_an_outage_costs_nothing_and_the_breaker_pauses_each_system(tmp_path: Path, sim: Sim) -> None:
    from harness.audit.oracle import run_problems
    from harness.audit.report import build_report
    from harness.run.rules import BREAKER_CODE, BREAKER_FAILURES

    folder_p = prereg(tmp_path, retries=3)
    results = tmp_path / "results"
    down = run_stage(folder_p, "A", results, base_urls=urls(_dead_url()))  # the simulator is not running
    assert down.exit_code == 1 and not down.complete
    folder = Path(down.folder)
    got = logs(folder)
    assert got["attempts"] and all(a["sent"] is False and a["cost_usd"] == 0 for a in got["attempts"])
    assert down.progress.total_usd == 0.0  # not the reserve per attempt: nothing reached a provider
    pauses = {e["system"]: e["error_code"] for e in got["run"] if e["event"] == "pause"}
    assert pauses == {"good": BREAKER_CODE, "bad": BREAKER_CODE}
    for s in ("good", "bad"):  # the breaker, not the plan, ended it (at most one more in flight per lane)
        mine = [a for a in got["attempts"] if a["run_id"] in _run_ids(folder, s)]
        assert BREAKER_FAILURES <= len(mine) <= BREAKER_FAILURES + 1, len(mine)
    assert not [f for f in got["finals"] if f["action"] == "stand"]  # nothing scored
    assert run_problems(folder, prereg_dir=folder_p) == []
    # paused: a later invocation sends nothing until --resume-paused
    again = run_stage(folder_p, "A", results, base_urls=urls(_dead_url()))
    assert again.exit_code == 1 and len(logs(folder)["attempts"]) == len(got["attempts"])
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    back = run_stage(folder_p, "A", results, base_urls=urls(url), resume_paused=True)
    assert back.exit_code == 0 and back.complete, back.to_json()
    assert run_problems(folder, prereg_dir=folder_p) == []
    report = build_report(folder, prereg_dir=folder_p)
    assert report.summary["exhausted"] == 0 and report.summary["standing"] == 12
    assert report.summary["passed"] == 6 and report.summary["cost_unknown"] == 0


def _run_ids(folder: Path, system_slot: str) -> set[str]:
    return {json.loads(line)["run_id"] for line in (folder / "plan.jsonl").read_text().splitlines()
            if json.loads(line).get("system") == system_slot}


def test_an_exhausted_cell_is_never_scored_and_the_stage_is_not_complete(tmp_path: Path, sim: Sim) -> None:
    from harness.audit.oracle import run_problems
    from harness.audit.report import build_report

    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0, server_error=1.0)])  # every 'bad' request: 500
    folder_p = prereg(tmp_path)
    summary = run_stage(folder_p, "A", tmp_path / "results", base_urls=urls(url))
    assert summary.exit_code == 1 and not summary.complete
    states = {(c["system"], c["state"]) for c in summary.cells}
    assert states == {("good", "standing"), ("bad", "exhausted")}
    folder = Path(summary.folder)
    end = [e for e in logs(folder)["run"] if e["event"] == "end"][-1]
    assert end["complete"] is False
    assert not [e for e in logs(folder)["run"] if e["event"] == "pause"]  # a 500 is an answer: no breaker
    assert run_problems(folder, prereg_dir=folder_p) == []
    report = build_report(folder, prereg_dir=folder_p)
    assert report.summary["exhausted"] == 6 and sorted(report.summary["exhausted_cells"]) == ["bad"]
    assert sorted(report.summary["exhausted_cells"]["bad"]) == sorted(_run_ids(folder, "bad"))
    assert report.frame.height == 6 and set(report.frame.get_column("system")) == {"good"}  # 0/6 never counted
    assert report.summary["standing"] == 6 and report.summary["not_standing"] == 0
    assert "provider" not in report.summary["standing_without_answer"]
    from tests.support.cli import run_proctor

    shown = run_proctor("report", str(folder), "--prereg", str(folder_p))  # the command lists them too
    assert shown.code == 0 and shown.out["exhausted_cells"] == report.summary["exhausted_cells"]
    assert {row["system"] for row in shown.out["q_table"]} == {"good"}


def test_the_simulator_stopped_during_a_run_costs_only_what_was_sent(tmp_path: Path) -> None:
    """The endpoint dies mid-run: requests that never left cost $0, only those in flight cost the reserve
    (unknown), the breaker pauses both systems, nothing is scored as a model failure, and the run resumes."""
    import os
    import time

    from harness.audit.oracle import run_problems
    from harness.audit.report import build_report
    from tests.support.study import ANSWERS

    systems = tmp_path / "systems.json"
    systems.write_text(json.dumps({"systems": [system("sim-flash", 1.0), system("sim-glm", 0.0)]}))

    def start_sim(port: int = 0) -> tuple[str, subprocess.Popen[bytes]]:
        ready = tmp_path / f"ready-{time.monotonic_ns()}.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
        env["PROCTOR_SIM_LATENCY_SCALE"] = "0"
        proc = subprocess.Popen([sys.executable, "-m", "harness", "sim", "serve", "--port", str(port), "--ready-file",
                                 str(ready), "--systems", str(systems), "--answers", str(ANSWERS)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        return str(json.loads(ready.read_text())["url"]), proc

    url, proc = start_sim()
    folder_p = prereg(tmp_path, retries=3, reserve=0.01)
    results = tmp_path / "results"

    def outage(p: Any) -> None:  # after the third attempt, the endpoint goes away
        if sum(s.attempts for s in p.systems) >= 3 and proc.poll() is None:
            proc.kill()
            proc.wait()

    try:
        down = run_stage(folder_p, "A", results, base_urls=urls(url), progress=outage)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert down.exit_code == 1 and not down.complete
    folder = Path(down.folder)
    got = logs(folder)
    errors = [a for a in got["attempts"] if a["outcome"] == "error"]
    unsent = [a for a in errors if a.get("sent") is False]
    in_flight = [a for a in errors if a.get("sent") is not False]
    assert unsent and all(a["cost_usd"] == 0 for a in unsent)
    assert len(in_flight) <= 4  # at most one per lane was under way when it died: those may have been billed
    delivered = math.fsum(a["cost_usd"] for a in got["attempts"] if a["outcome"] == "delivered")
    assert down.progress.total_usd == pytest.approx(delivered + 0.01 * len(in_flight))
    assert {e["system"] for e in got["run"] if e["event"] == "pause"} == {"good", "bad"}
    assert not [f for f in got["finals"] if f["class"] != "delivered" and f["action"] == "stand"]
    assert run_problems(folder, prereg_dir=folder_p) == []
    url, proc = start_sim()
    try:
        back = run_stage(folder_p, "A", results, base_urls=urls(url), resume_paused=True)
    finally:
        proc.kill()
        proc.wait()
    assert back.exit_code == 0 and back.complete, back.to_json()
    assert run_problems(folder, prereg_dir=folder_p) == []
    report = build_report(folder, prereg_dir=folder_p)
    assert report.summary["exhausted"] == 0 and report.summary["passed"] == 6 and report.summary["standing"] == 12


def test_admission_holds_a_reserve_per_attempt_so_reruns_and_retries_keep_to_the_cap(
    tmp_path: Path, sim: Sim,
) -> None:
    # issue 13 item 3: with most requests failing, an item costs up to (reruns+1) x (retries+1) = 6
    # attempts; admission per item let the cap be overshot by the reruns and retries of the items under
    # way. Per attempt, every attempt (retries and reruns too) is admitted against the cap with the
    # reserve held for each attempt under way, so spend stays within cap + the reserves in flight.
    url = sim([system("sim-flash", 1.0, server_error=0.8), system("sim-glm", 0.0)])
    reserve, cap = 0.0002, 0.001
    summary = run_stage(prereg(tmp_path, caps=(cap, 1.0), reserve=reserve, retries=1, items=12), "A",
                        tmp_path / "results", base_urls=urls(url))
    folder = Path(summary.folder)
    got = logs(folder)
    good = [a for a in got["attempts"] if a["run_id"] in _run_ids(folder, "good")]
    assert good and max(a["rerun"] for a in good) >= 1 and max(a["attempt"] for a in good) == 2, good
    spent = summary.progress.systems[0]
    assert spent.system == "good" and any(a["decision"] == "refuse" for a in got["admission"] if a["system"] == "good")
    in_flight = 2 * reserve  # one attempt per lane
    assert spent.spend_usd <= cap + in_flight, (spent.spend_usd, cap)
    # every attempt (first, rerun, retry) was admitted by name, with its intent before it was sent
    admitted = {(a["run_id"], a["rerun"], a["attempt"]) for a in got["admission"] if a["decision"] == "admit"}
    intents = {(e["run_id"], e["rerun"], e["attempt"]) for e in got["run"] if e["event"] == "intent"}
    keys = {(a["run_id"], a["rerun"], a["attempt"]) for a in got["attempts"]}
    assert keys == admitted == intents
    assert run_problems(folder, prereg_dir=tmp_path / "prereg" / "rt") == []


def _keep_lines(path: Path, n: int) -> None:
    """Cut a chained log back to its first n lines (a prefix: the chain stays intact)."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:n]))


def test_an_intent_a_crash_left_is_resolved_on_resume_at_its_true_cost_from_the_wire(
    tmp_path: Path, sim: Sim,
) -> None:
    # issue 13 item 2: the files a kill -9 leaves between appending the exchange to wire.jsonl and its
    # attempt record (the last attempt's record, run-log lines, final and anchors cut off; its intent and
    # its wire line kept). The resume resolves the intent as a runner_lost attempt costing the wire's
    # exchange, and retries the cell as a transport failure.
    url = sim([system("sim-flash", 1.0, latency=0.05), system("sim-glm", 0.0, latency=0.6)], latency_scale=1.0)
    p = prereg(tmp_path, items=1)
    first = run_stage(p, "A", tmp_path / "results", base_urls=urls(url))
    folder = Path(first.folder)
    got = logs(folder)
    last = got["attempts"][-1]
    assert last["run_id"] in _run_ids(folder, "bad") and got["finals"][-1]["run_id"] == last["run_id"]
    intent_line = max(i for i, e in enumerate(got["run"], start=1) if e["event"] == "intent")
    assert got["run"][intent_line - 1]["run_id"] == last["run_id"]
    _keep_lines(folder / "run.jsonl", intent_line)
    _keep_lines(folder / "attempts.jsonl", len(got["attempts"]) - 1)
    _keep_lines(folder / "finals.jsonl", len(got["finals"]) - 1)
    (folder / "anchors.jsonl").unlink()
    wire_cost = float(last["cost_usd"])
    again = run_stage(p, "A", tmp_path / "results", base_urls=urls(url))
    got = logs(folder)
    lost = [a for a in got["attempts"] if a.get("error_code") == "runner_lost"]
    assert len(lost) == 1 and lost[0]["run_id"] == last["run_id"] and lost[0]["cost_usd"] == wire_cost, lost
    assert lost[0]["started"] == got["run"][intent_line - 1]["at"]
    final = next(f for f in got["finals"] if f["run_id"] == last["run_id"] and f["rerun"] == 0)
    assert (final["class"], final["action"], final["error_code"]) == ("provider", "rerun", "runner_lost")
    assert again.complete and math.isclose(again.progress.systems[1].spend_usd,
                                           first.progress.systems[1].spend_usd + wire_cost)
    assert run_problems(folder, prereg_dir=p) == []


def test_a_resume_removes_the_temporary_file_a_kill_left_of_an_archive_write(tmp_path: Path, sim: Sim) -> None:
    # found by the 55-kill soak (issue 13): a kill inside atomic_write leaves `.NAME.tmp-PID` in archive/,
    # which the oracle rightly reports (`archive`); the next invocation removes it before anything else
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    p = prereg(tmp_path, items=1)
    first = run_stage(p, "A", tmp_path / "results", base_urls=urls(url))
    folder = Path(first.folder)
    (folder / "archive").mkdir(exist_ok=True)
    torn = folder / "archive" / ".r-0.r0.final.jsonl.tmp-4242"
    torn.write_bytes(b'{"kind":')
    assert [pr.rule for pr in run_problems(folder, prereg_dir=p)] == ["archive"]
    run_stage(p, "A", tmp_path / "results", base_urls=urls(url))
    assert not torn.exists() and run_problems(folder, prereg_dir=p) == []


def test_a_preflight_and_the_run_after_it_check_on_the_same_warm_verifiers(tmp_path: Path, sim: Sim) -> None:
    """`proctor run`'s way: the preflight launches the stage's share of the caller's pool and judges its
    trial check on one of them; the run checks on the same workers and leaves the pool to its caller."""
    from harness.evals.verify_pool import VerifierPool, pool_size

    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    p, results = prereg(tmp_path), tmp_path / "results"
    share = pool_size(2 * 2)  # two lanes for each of two systems, bounded by the cores
    with VerifierPool(share) as pool:
        checked = run_stage(p, "A", results, preflight=True, base_urls=urls(url), verifiers=pool)
        assert checked.exit_code == 0, checked.problems
        launched = {v.pid for v in pool.verifiers}
        assert pool.made == share and len(launched) == share and None not in launched
        summary = run_stage(p, "A", results, base_urls=urls(url), verifiers=pool)
        assert summary.exit_code == 0 and summary.complete, summary.to_json()
        assert pool.made == share and pool.replaced == 0  # no other verifier was made
        held = pool.verifiers
        assert {v.pid for v in held} == launched and all(v.alive() for v in held)  # still the caller's
        finals = logs(Path(summary.folder))["finals"]
        assert len(finals) == 12 and {f["system"] for f in finals if f["passed"]} == {"good"}
    assert not any(v.alive() for v in held)  # the caller's close stopped them


def test_a_receipt_is_staged_only_once_its_attempt_is_durable_on_a_slow_disk(
        tmp_path: Path, sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of a delivered answer runs while the writer makes its attempt durable (docs/run.md, durability);
    its receipt is staged only after. Every fsync here takes 30 ms, far longer than a check, so a receipt staged
    without waiting would find its attempt's line not yet durable."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.03)
        real_fsync(fd)

    made: list[GroupWriter] = []
    init = GroupWriter.__init__

    def slow_writer(self: GroupWriter, *, fsync: Any = None, name: str = "proctor-group") -> None:
        init(self, fsync=slow_fsync, name=name)
        made.append(self)

    monkeypatch.setattr(GroupWriter, "__init__", slow_writer)
    attempt_ticket: dict[str, int] = {}
    seen: list[tuple[str, int, int]] = []
    stage, stage_file = GroupWriter._stage, GroupWriter.stage_file

    def staging(self: GroupWriter, log: Any, records: list[Any], barrier: bool) -> list[dict[str, Any]]:
        out = stage(self, log, records, barrier)
        if os.path.basename(str(log.path)) == "attempts.jsonl":
            for record in records:
                attempt_ticket[record["run_id"]] = self.staged
        return out

    def staging_file(self: GroupWriter, path: Any, data: bytes, *, mode: int = 0o600) -> int:
        run_id = json.loads(data)["run_id"]
        seen.append((run_id, attempt_ticket[run_id], self.durable))
        return stage_file(self, path, data, mode=mode)

    monkeypatch.setattr(GroupWriter, "_stage", staging)
    monkeypatch.setattr(GroupWriter, "stage_file", staging_file)
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    summary = run_stage(prereg(tmp_path, items=3), "A", tmp_path / "results", base_urls=urls(url))
    assert summary.exit_code == 0 and summary.complete, summary.to_json()
    assert made and len(seen) == 6
    assert all(durable >= ticket for _, ticket, durable in seen), seen
    assert run_problems(Path(summary.folder), prereg_dir=tmp_path / "prereg" / "rt") == []
