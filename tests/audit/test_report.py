"""The report (`harness.audit.report.build_report`, `proctor report`): real runs score, planted faults refuse.

One module-scoped pair of real runs against the simulator (a clean one, and one
with provider errors so cells rerun and finals are archived); each test works on
a copy. Planted faults re-use the oracle tests' consistent re-chaining (`rebuild`).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from harness.analysis.tables import q_table
from harness.audit.frame import ATTEMPT_COLUMNS, validate_attempts
from harness.audit.oracle import run_problems
from harness.audit.report import build_report
from harness.errors import Refusal
from harness.evidence.jsonio import sha256_hex
from harness.prereg.frozen import check_frozen
from harness.run.setup import stage_plan_bytes
from tests.support.oracle import Records, flip_verdict, rebuild
from tests.support.paths import REPO
from tests.support.study import logs, prereg, sim_servers, system, urls


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Path]]]:
    root = tmp_path_factory.mktemp("report-runs")
    with sim_servers(root) as sim:
        out: dict[str, tuple[Path, Path]] = {}
        for name, systems in (("clean", [system("sim-flash", 1.0), system("sim-glm", 0.0)]),
                              ("errors", [system("sim-flash", 1.0, server_error=0.5), system("sim-glm", 0.0)])):
            url = sim(systems)
            base = root / name
            base.mkdir()
            p = prereg(base)
            from harness.run.runner import run_stage

            run_stage(p, "A", base / "results", base_urls=urls(url))
            out[name] = (p, base / "results" / "rt" / "A")
        yield out


@pytest.fixture
def copy(runs: dict[str, tuple[Path, Path]], tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    def make(name: str) -> tuple[Path, Path]:
        p, folder = runs[name]
        dst_p = tmp_path / "prereg" / "rt"
        shutil.copytree(p, dst_p)
        dst = tmp_path / "results" / "rt" / "A"
        shutil.copytree(folder, dst)
        return dst_p, dst

    return make


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", "report", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def refused(folder: Path, p: Path) -> Refusal:
    with pytest.raises(Refusal) as info:
        build_report(folder, prereg_dir=p)
    assert info.value.code == "report_refused"
    return info.value


def total(costs: list[Any]) -> float | None:
    return None if "unknown" in costs else math.fsum(costs)


def same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b))


def rules(exc: Refusal) -> set[str]:
    return {q["rule"] for q in exc.details["problems"]}


@pytest.mark.parametrize("name", ["clean", "errors"])
def test_a_real_run_scores_every_standing_final(name: str, copy: Callable[[str], tuple[Path, Path]]) -> None:
    p, folder = copy(name)
    assert run_problems(folder, prereg_dir=p) == []
    report = build_report(folder, prereg_dir=p)
    frame = report.frame
    validate_attempts(frame)
    assert list(frame.columns) == list(ATTEMPT_COLUMNS)
    got = logs(folder)
    last: dict[str, dict[str, Any]] = {}
    for f in got["finals"]:
        last[f["run_id"]] = f
    standing = {rid: f for rid, f in last.items() if f["action"] == "stand"}
    assert sorted(frame.get_column("run_id").to_list()) == sorted(standing)
    for row in frame.iter_rows(named=True):
        f = standing[row["run_id"]]
        assert (row["system"], row["item"], row["arm"], row["repeat"]) == (f["system"], f["item"], f["arm"],
                                                                          f["repeat"])
        assert row["passed"] == bool(f["passed"])
        mine = [a for a in got["attempts"] if a["run_id"] == row["run_id"]]
        assert same(row["cost_usd"], total([a["cost_usd"] for a in mine]))
        outs = [None if a["tokens"] is None else a["tokens"]["output"] for a in mine]
        assert row["tokens_output"] == (None if None in outs else sum(o for o in outs if o is not None))
    if name == "errors":  # reruns: the cost is the cell's total over every rerun
        assert any(f["rerun"] > 0 for f in standing.values())
    q = q_table(frame)
    for row in q.iter_rows(named=True):
        mine = [f for f in standing.values() if f["system"] == row["system"] and f["arm"] == row["arm"]]
        assert row["n"] == len(mine)
        assert row["passes"] == sum(bool(f["passed"]) for f in mine)
        costs = [a["cost_usd"] for a in got["attempts"]
                 if any(a["run_id"] == f["run_id"] for f in mine)]
        assert same(row["cost_usd"], total(costs))
    s = report.summary
    assert s["problems"] == 0 and s["standing"] == frame.height == s["cells"]
    assert s["plan_sha256"] == sha256_hex((folder / "plan.jsonl").read_bytes())
    assert s["frozen_sha256"] == check_frozen(p).frozen_sha256 and s["amendments"] == []
    # the CLI: --json is one object with the summary and the q table
    out = cli(str(folder), "--prereg", str(p), "--json")
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    assert obj["problems"] == 0 and len(obj["q_table"]) == q.height
    assert [r["passes"] for r in obj["q_table"]] == q.get_column("passes").to_list()
    human = cli(str(folder), "--prereg", str(p))
    assert human.returncode == 0 and "q_table" in human.stdout and "pass_rate" in human.stdout


@pytest.mark.parametrize(("value", "line"), [(b"9.5", 2), (b"9.50", 1)], ids=["canonical", "not-canonical"])
def test_an_edited_attempt_is_refused_through_the_cli(value: bytes, line: int,
                                                      copy: Callable[[str], tuple[Path, Path]]) -> None:
    # Line 1's latency replaced. Written canonically, the edit is seen where the next line's `prev` no longer names
    # line 1's hash (line 2); written as the encoder never would (a trailing zero), it is seen on line 1 itself.
    # (A single flipped digit lands in either case depending on the run's latency, so the edit is the whole value.)
    p, folder = copy("clean")
    path = folder / "attempts.jsonl"
    data = bytearray(path.read_bytes())
    i = data.index(b'"latency_s":') + len(b'"latency_s":')
    j = data.index(b",", i)
    assert data[i:j] != value.rstrip(b"0")
    data[i:j] = value
    path.write_bytes(bytes(data))
    exc = refused(folder, p)
    assert "chain" in rules(exc) and run_problems(folder, prereg_dir=p)
    chain = [q for q in exc.details["problems"] if q["rule"] == "chain"]
    assert chain[0]["file"] == str(path) and chain[0]["line"] == line
    assert any(q["rule"] == "attempt_logged" and "attempts line 1 " in q["message"] for q in exc.details["problems"])
    out = cli(str(folder), "--prereg", str(p))
    assert out.returncode == 3 and "report_refused" in out.stderr and "Traceback" not in out.stderr
    assert f"attempts.jsonl:{line}" in out.stderr
    js = cli(str(folder), "--prereg", str(p), "--json")
    obj = json.loads(js.stdout)
    assert js.returncode == 3 and obj["refusal"] == "report_refused" and obj["problems"]


def test_an_edited_receipt_is_refused(copy: Callable[[str], tuple[Path, Path]]) -> None:
    p, folder = copy("clean")
    receipt = sorted((folder / "receipts").iterdir())[0]
    receipt.write_bytes(receipt.read_bytes().replace(b'"passed":', b'"passed" :', 1))
    exc = refused(folder, p)
    assert "final_link" in rules(exc)
    assert any("receipt" in q["message"] for q in exc.details["problems"])


def test_a_receipt_whose_verdict_is_not_the_finals_is_refused(copy: Callable[[str], tuple[Path, Path]]) -> None:
    # the receipt and its sha256 consistent, but its verdict not the final's: only the report's own rule sees it
    p, folder = copy("clean")
    rebuild(folder, p, lambda recs: flip_verdict(folder, recs["finals"][0]))
    exc = refused(folder, p)
    assert rules(exc) == {"receipt"}


def test_a_preregistration_changed_after_the_run_is_refused_through_the_cli(
        copy: Callable[[str], tuple[Path, Path]]) -> None:
    p, folder = copy("clean")
    (p / "PREREG.md").write_text("# runner test\n\nEdited after the run.\n")
    exc = refused(folder, p)
    assert "prereg_changed_since_freeze" in rules(exc)
    out = cli(str(folder), "--prereg", str(p))
    assert out.returncode == 3 and "prereg_changed_since_freeze" in out.stderr and "Traceback" not in out.stderr


def test_a_different_valid_plan_is_refused(copy: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    p, folder = copy("clean")
    other = prereg(tmp_path / "other", items=5)
    frozen = check_frozen(other)
    (folder / "plan.jsonl").write_bytes(stage_plan_bytes(frozen.path, frozen.design, "A"))
    exc = refused(folder, p)
    assert "plan_changed" in rules(exc)
    out = cli(str(folder), "--prereg", str(p), "--json")
    assert out.returncode == 3 and "plan_changed" in {q["rule"] for q in json.loads(out.stdout)["problems"]}


def test_the_report_and_the_oracle_agree_on_planted_faults(copy: Callable[[str], tuple[Path, Path]]) -> None:
    # a planted runner fault (class/action rewritten) the oracle catches: the report refuses with the same rules
    p, folder = copy("errors")

    def edit(recs: Records) -> None:
        for f in recs["finals"]:
            if f["action"] == "rerun":
                f["action"] = "stand"
                return
        raise AssertionError("no rerun in the errors run")

    rebuild(folder, p, edit)
    problems = run_problems(folder, prereg_dir=p)
    assert problems
    exc = refused(folder, p)
    assert {q.rule for q in problems} <= rules(exc)
    assert len(exc.details["problems"]) >= len(problems)
    assert isinstance(pl.DataFrame(exc.details["problems"]), pl.DataFrame)
