"""The audit (`proctor audit`, `harness.audit.audit`): an intact study passes; every flipped byte is a break.

Two real studies run on the simulator once per module (tests/support/study.py `prereg`, three items):
`witnessed` registers `run.anchor_remote` (a bare git repository beside the preregistration) and runs
stages A and matrix; `plain` registers no remote, is amended once before its run (AMENDMENTS.jsonl) and
runs stage A. Both then anchor real outputs with
`anchor_outputs`: a matplotlib PNG and a CSV in the study's analysis folder (named from every stage, as
`proctor analyze` does) and a text file inside stage A's folder. Each test works on a copy of the whole
tree (preregistration, results, remote), so the runs are shared and never changed.

The sweeps flip single bytes (XOR 1: a digit stays a digit, a hex letter mostly a letter, so many flips
still parse) in every file of the study folder and the preregistration folder: the first and last byte,
a stride through the rest, a spread of bytes in the last line of every log, and a byte in every field
(every JSON token) of each stage's last anchor line. Only `.invocation.lock` is left out: it holds the
last holder's pid for people, is no evidence, and is neither anchored nor pushed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.audit.audit import Audit, audit_results
from harness.audit.oracle.check import run_problems
from harness.audit.stage import ANCHOR_REASONS, anchor_form
from harness.errors import Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_bytes, read_bytes, sha256_hex
from harness.evidence.portable import machine_paths
from harness.notebooks.stage import anchor_outputs
from harness.prereg.freeze import amend
from harness.run.anchors import output_manifest_name
from harness.run.layout import log_seed
from harness.run.runner import run_stage
from tests.support.cli import run_proctor
from tests.support.oracle import Records, rebuild
from tests.support.paths import REPO
from tests.support.study import Sim, prereg, sim_servers, system, urls

TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null')


@dataclass(frozen=True)
class Study:
    """A study's tree: the preregistration, the study folder (RESULTS/rt) and the remote (None: not registered)."""

    root: Path
    prereg: Path
    results: Path
    remote: Path | None
    stages: tuple[str, ...]
    pushes: dict[str, Any]

    def stage(self, name: str) -> Path:
        return self.results / name

    def audit(self, path: Path | None = None) -> Audit:
        return audit_results(path or self.results, prereg=self.prereg)


def figure(path: Path, ys: list[float]) -> None:
    """A real PNG drawn by matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(range(len(ys)), ys)
    fig.savefig(path)
    plt.close(fig)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def outputs(study: Study, stage: str) -> dict[str, Path]:
    folder = str(study.stage(stage))
    files = [study.results / "analysis" / "fig.png", study.results / "analysis" / "q.csv"]
    if stage == "A":
        files.append(study.stage("A") / "notes.txt")
    return {output_manifest_name(folder, f): f for f in files}


def build(root: Path, sim: Sim, *, witness: bool, stages: tuple[str, ...]) -> Study:
    remote = root / "anchors.git" if witness else None
    root.mkdir(parents=True)
    if remote is not None:
        git("init", "--quiet", "--bare", str(remote), cwd=root)
    p = prereg(root, items=3, anchor_remote="../../anchors.git" if witness else None)
    if not witness:  # an amendment before the run: the audit checks AMENDMENTS.jsonl too
        (p / "PREREG.md").write_text("# runner test\n\nRegistered before running; one word clarified.\n")
        amend(p, "clarify the text before any run")
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    for stage in stages:
        assert run_stage(p, stage, root / "results", base_urls=urls(url)).exit_code == 0
    results = root / "results" / "rt"
    (results / "analysis").mkdir()
    figure(results / "analysis" / "fig.png", [0.0, 1.0, 0.5])
    (results / "analysis" / "q.csv").write_text("system,arm,n,passes\ngood,direct,3,3\nbad,direct,3,0\n")
    (results / "A" / "notes.txt").write_text("read with the executed notebook\n")
    study = Study(root, p, results, remote, stages, {})
    for stage in stages:
        got = anchor_outputs(str(study.stage(stage)), "rt", stage, "analysis", outputs(study, stage), prereg=p)
        study.pushes[stage] = got.get("push")
    return study


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Study]]:
    base = tmp_path_factory.mktemp("audit")
    (base / "sim").mkdir()
    with sim_servers(base / "sim") as sim:
        yield {"witnessed": build(base / "witnessed", sim, witness=True, stages=("A", "matrix")),
               "plain": build(base / "plain", sim, witness=False, stages=("A",))}


@pytest.fixture
def copy(built: dict[str, Study], tmp_path: Path) -> Callable[[str], Study]:
    def make(name: str) -> Study:
        src = built[name]
        dst = tmp_path / name
        shutil.copytree(src.root, dst, symlinks=True, ignore=shutil.ignore_patterns(".anchor-clone*"))
        return Study(dst, dst / "prereg" / "rt", dst / "results" / "rt", None if src.remote is None else
                     dst / "anchors.git", src.stages, src.pushes)

    return make


def found(audit: Audit, root: Path) -> set[tuple[str, str]]:
    """(file relative to the tree, rule) of every problem."""
    return {(os.path.relpath(p.file, root), p.rule) for p in audit.problems}


# --------------------------------------------------------------------------
# Intact studies


def test_an_intact_witnessed_study_passes_through_the_cli(copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    assert all(push is not None and push["ok"] for push in s.pushes.values()), s.pushes
    out = run_proctor("audit", str(s.results), "--prereg", str(s.prereg))
    assert out.code == 0, out.out
    got = out.out
    assert got["ok"] is True and got["problems"] == [] and got["study"] == "rt"
    assert got["verified"] == {"stages": 2, "logs": 14, "lines": got["verified"]["lines"], "anchors": 4,
                               "manifests": 3 + 3 + 3 + 2, "outputs": 5, "receipts": 12}
    lines = 0
    for stage in got["stages"]:
        for name, log in stage["logs"].items():
            path = s.stage(stage["stage"]) / f"{name}.jsonl"
            assert log["lines"] == read_bytes(path).count(b"\n")
            assert log["witnessed"] == log["lines"]  # the remote holds every line, anchors.jsonl's last included
            assert log["anchored"] == log["lines"]  # anchor_outputs anchored every log's tail
            lines += log["lines"]
    assert got["verified"]["lines"] == lines
    assert got["witness"] == {"remote": str(s.remote), "commit": git("rev-parse", "HEAD", cwd=s.remote)}
    assert sorted(got["stages"][0]["outputs"]) == ["../analysis/fig.png", "../analysis/q.csv", "notes.txt"]
    assert not any("remote" in w or "tail" in w or "no check covers" in w or "no anchor names" in w
                   for w in got["guarantees"]["weaker"]), got["guarantees"]
    assert sum(got["sandbox"].values()) == 12
    assert got["guarantees"]["holds"]
    # the pushes anchor_outputs made are the remote's history; reading it changed nothing there
    assert s.pushes["matrix"]["commit"] == got["witness"]["commit"]
    assert git("rev-parse", "HEAD", cwd=s.remote) == got["witness"]["commit"]
    human = subprocess.run([sys.executable, "-m", "harness", "audit", str(s.results), "--prereg", str(s.prereg)],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert human.returncode == 0 and "ok: yes" in human.stdout and "Traceback" not in human.stderr


def test_an_intact_study_without_a_remote_passes_and_says_its_last_anchor_line_is_unwitnessed(
        copy: Callable[[str], Study]) -> None:
    s = copy("plain")
    assert s.pushes == {"A": None}  # no remote registered: no push, nothing recorded
    for path in (s.results, s.stage("A")):  # the study folder, or the stage folder alone
        a = s.audit(path)
        assert a.ok, a.problems
        got = a.to_json()
        assert got["witness"] is None
        assert all(log["witnessed"] is None for log in got["stages"][0]["logs"].values())
        assert any("no anchor remote is registered" in w and "anchors.jsonl" in w for w in got["guarantees"]["weaker"])
        assert [m["reason"] for m in got["amendments"]] == ["clarify the text before any run"]
        assert got["frozen_at"] and got["frozen_sha256"] == sha256_hex(read_bytes(s.prereg / "FROZEN.json"))


# --------------------------------------------------------------------------
# The byte-flip sweeps


def flips(path: Path, data: bytes) -> list[tuple[int, int]]:
    """(offset, new byte) for one file: see the module docstring."""
    n = len(data)
    if n == 0:
        return []
    where = {0, n - 1}
    stride = max(1, n // 5)
    where.update(range(stride // 2, n, stride))
    if path.suffix == ".jsonl" and data.endswith(b"\n") and n > 1:
        start = data.rfind(b"\n", 0, n - 1) + 1
        spans = [m.span() for m in TOKEN.finditer(data[start:n - 1])]
        if path.name != "anchors.jsonl":
            spans = spans[:: max(1, len(spans) // 5)]
        for a, b in spans:
            where.add(start + (a + b) // 2)
            if data[start + a] != ord('"'):  # a number's last digit too (a string's last byte is its quote)
                where.add(start + b - 1)
    return [(i, data[i] ^ 0x01) for i in sorted(where)]


def last_line(data: bytes) -> range:
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    return range(start, len(data))


def later_at(data: bytes) -> tuple[int, int]:
    """A one-byte edit of the last anchor line's time that still parses and links: a digit of its whole
    seconds (units upwards) raised by one, so the time moves forward by at most 10^4 s."""
    line = last_line(data)
    m = re.search(rb'"at":(\d+)\.', data[line.start:])
    assert m is not None
    for k in range(5):
        i = line.start + m.end(1) - 1 - k
        if data[i] != ord("9"):
            return i, data[i] + 1
    raise AssertionError("five nines")


def sweep(s: Study, extra: dict[Path, list[tuple[int, int]]]) -> tuple[int, list[tuple[Path, int]]]:
    """Flip each byte, audit in-process, restore; returns the flips made and those no problem named."""
    files = sorted(p for top in (s.results, s.prereg) for p in top.rglob("*")
                   if p.is_file() and not p.name.endswith(".lock"))
    assert len(files) >= 10
    missed, made = [], 0
    for path in files:
        data = path.read_bytes()
        for offset, byte in flips(path, data) + extra.get(path, []):
            changed = bytearray(data)
            changed[offset] = byte
            path.write_bytes(bytes(changed))
            try:
                audit = s.audit()  # a refusal here would fail the test: a flip is a break, not a refusal
            finally:
                path.write_bytes(data)
            made += 1
            if audit.ok:
                missed.append((path, offset))
    assert s.audit().ok
    return made, missed


def test_with_a_witness_every_flipped_byte_is_a_break(copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    anchors = {s.stage(st) / "anchors.jsonl" for st in s.stages}
    extra = {path: [later_at(path.read_bytes())] for path in anchors}
    started = time.monotonic()
    made, missed = sweep(s, extra)
    assert made > 300
    assert missed == [], missed
    print(f"{made} flips in {time.monotonic() - started:.1f} s")


def test_without_a_witness_only_the_last_anchor_line_escapes(copy: Callable[[str], Study]) -> None:
    s = copy("plain")
    anchors = s.stage("A") / "anchors.jsonl"
    data = anchors.read_bytes()
    edit = later_at(data)
    started = time.monotonic()
    made, missed = sweep(s, {anchors: [edit]})
    print(f"{made} flips in {time.monotonic() - started:.1f} s, {len(missed)} missed, all in the last anchor line")
    assert made > 150
    assert (anchors, edit[0]) in missed  # a later time in the last anchor line: nothing in the folder sees it
    assert {path for path, _ in missed} == {anchors}
    assert all(offset in last_line(data) for _, offset in missed), missed


# --------------------------------------------------------------------------
# Named edits


def _swap_lines(path: Path, i: int, j: int) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[i], lines[j] = lines[j], lines[i]
    path.write_bytes(b"\n".join(lines))


def _append_copy(path: Path) -> None:
    """Append a copy of the last line: well formed, but its prev is not the last line's sha256."""
    data = path.read_bytes()
    path.write_bytes(data + data[last_line(data).start:])


def _forge_final(s: Study) -> None:
    path = s.stage("A") / "finals.jsonl"
    last = {k: v for k, v in read_log(path)[-1].items() if k not in ("prev", "seed")}
    ChainedLog(path, log_seed("rt", "A", "finals")).append({**last, "passed": not last["passed"]})


def _swap_stages(s: Study) -> None:
    a, m = s.stage("A") / "attempts.jsonl", s.stage("matrix") / "attempts.jsonl"
    data = a.read_bytes()
    a.write_bytes(m.read_bytes())
    m.write_bytes(data)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: last_line(data).start])


def _receipt(s: Study) -> Path:
    return sorted((s.stage("A") / "receipts").iterdir())[0]


EDITS: dict[str, tuple[Callable[[Study], Any], set[tuple[str, str]]]] = {
    "delete a log": (lambda s: (s.stage("A") / "host.jsonl").unlink(),
                     {("results/rt/A/anchors.jsonl", "anchor"), ("results/rt/A/host.jsonl", "witness")}),
    "delete a plan": (lambda s: (s.stage("matrix") / "plan.jsonl").unlink(),
                      {("results/rt/matrix/plan.jsonl", "plan_changed"), ("results/rt/matrix/plan.jsonl", "witness")}),
    "delete anchors.jsonl": (lambda s: (s.stage("A") / "anchors.jsonl").unlink(),
                             {("results/rt/A/anchors.jsonl", "anchor_form"), ("results/rt/A/anchors.jsonl", "witness")}),
    "delete a stage": (lambda s: shutil.rmtree(s.stage("matrix")), {("results/rt/matrix", "witness")}),
    "delete an output": (lambda s: (s.stage("A") / "notes.txt").unlink(),
                         {("results/rt/A/anchors.jsonl", "output"), ("results/rt/A/notes.txt", "witness")}),
    "truncate a log": (lambda s: _truncate(s.stage("A") / "attempts.jsonl"),
                       {("results/rt/A/anchors.jsonl", "anchor"), ("results/rt/A/attempts.jsonl", "witness")}),
    "append a forged chained line": (_forge_final, {("results/rt/A/finals.jsonl", "final_link")}),
    "append a forged line": (lambda s: _append_copy(s.stage("A") / "run.jsonl"), {("results/rt/A/run.jsonl", "chain")}),
    "reorder lines": (lambda s: _swap_lines(s.stage("A") / "run.jsonl", 1, 2), {("results/rt/A/run.jsonl", "chain")}),
    "swap two stages' logs": (_swap_stages, {("results/rt/A/attempts.jsonl", "chain"),
                                             ("results/rt/matrix/attempts.jsonl", "chain")}),
    "replace a figure": (lambda s: figure(s.results / "analysis" / "fig.png", [1.0, 0.0]),
                         {("results/rt/analysis/fig.png", "output")}),
    "remove a receipt": (lambda s: _receipt(s).unlink(), {("results/rt/A/finals.jsonl", "final_link")}),
    "edit the preregistration": (lambda s: (s.prereg / "PREREG.md").write_text("# changed after the run\n"),
                                 {("prereg/rt", "prereg_changed_since_freeze")}),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_each_named_edit_is_a_named_break(name: str, copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    edit, expected = EDITS[name]
    receipt = os.path.relpath(_receipt(s), s.root)
    edit(s)
    a = s.audit()
    assert not a.ok
    got = found(a, s.root)
    assert expected <= got, sorted(got)
    if name == "remove a receipt":  # the final names it, the witness names the file
        assert (receipt, "witness") in got
        assert any(receipt.split("/")[-1] in p.message for p in a.problems if p.rule == "final_link")
    if name == "append a forged chained line":
        assert any("finals.jsonl lines 7..7 come after the last anchor" in w for w in a.weaker)


def test_an_unreadable_file_is_a_break_not_a_refusal(copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    receipt = _receipt(s)
    receipt.unlink()
    os.mkfifo(receipt)  # opened without blocking and named, never read as empty
    out = run_proctor("audit", str(s.results), "--prereg", str(s.prereg))
    assert out.code == 1 and out.out["ok"] is False
    got = {(p["file"], p["rule"]) for p in out.out["problems"]}
    assert {(str(receipt), "not_a_regular_file"), (str(receipt), "witness")} <= got


def test_a_break_exits_1_naming_it_through_the_cli(copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    figure(s.results / "analysis" / "fig.png", [1.0, 0.0])
    out = run_proctor("audit", str(s.results), "--prereg", str(s.prereg))
    assert out.code == 1 and out.out["ok"] is False and "refusal" not in out.out
    fig = str(s.results / "analysis" / "fig.png")
    assert {"file": fig, "rule": "output"} in [{"file": p["file"], "rule": p["rule"]} for p in out.out["problems"]]
    assert all(set(p) == {"file", "line", "rule", "message"} for p in out.out["problems"])


def test_a_re_anchored_output_passes(copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    figure(s.results / "analysis" / "fig.png", [1.0, 0.0])
    assert not s.audit().ok
    for stage in s.stages:  # a later anchor re-anchors it: the earlier one may differ
        got = anchor_outputs(str(s.stage(stage)), "rt", stage, "analysis", outputs(s, stage), prereg=s.prereg)
        assert got["push"]["ok"], got["push"]
    a = s.audit()
    assert a.ok, a.problems
    assert a.to_json()["verified"]["anchors"] == 6


def test_a_failed_push_keeps_the_anchor_and_leaves_its_line_unwitnessed(copy: Callable[[str], Study]) -> None:
    s = copy("witnessed")
    assert s.remote is not None
    away = s.root / "away.git"
    s.remote.rename(away)
    folder = s.stage("A")
    before = read_bytes(folder / "anchors.jsonl").count(b"\n")
    got = anchor_outputs(str(folder), "rt", "A", "analysis", outputs(s, "A"), prereg=s.prereg)
    assert got["push"]["ok"] is False and got["push"]["error"]
    assert read_log(folder / "anchors.jsonl")[-1] == {k: v for k, v in got.items() if k != "push"}
    # the remote gone at audit time: the registered witness cannot be read, a break
    gone = s.audit()
    assert ("anchors.git", "witness") in found(gone, s.root)
    away.rename(s.remote)
    a = s.audit()
    assert a.ok, a.problems
    assert any(f"stage A: anchors.jsonl lines {before + 1}..{before + 1} are not in the remote's latest snapshot" in w
               for w in a.weaker), a.weaker


def test_the_last_anchor_line_is_caught_only_where_its_form_or_a_witness_allows(copy: Callable[[str], Study]) -> None:
    for name in ("plain", "witnessed"):
        s = copy(name)
        path = s.stage("A") / "anchors.jsonl"
        data = path.read_bytes()
        offset, byte = later_at(data)
        path.write_bytes(data[:offset] + bytes([byte]) + data[offset + 1:])
        later = s.audit()
        if name == "plain":
            assert later.ok  # parses, links, no file disagrees: the summary says this line is unwitnessed
        else:
            assert ("results/rt/A/anchors.jsonl", "witness") in found(later, s.root)
        # a reason no writer gives, re-encoded canonically so it still parses and links
        line = last_line(data)
        record = json.loads(data[line.start:-1])
        path.write_bytes(data[:line.start] + canonical_bytes({**record, "reason": "analysiz"}) + b"\n")
        assert ("results/rt/A/anchors.jsonl", "anchor_form") in found(s.audit(), s.root)
        path.write_bytes(data)
        assert s.audit().ok


def test_anchor_form_names_each_wrong_field() -> None:
    good = {"kind": "anchor.v1", "at": 1.5e9, "reason": "analysis", "prev": "0" * 64,
            "logs": {n: {"lines": 1, "head": "a" * 64} for n in ("attempts", "finals", "run", "admission", "host",
                                                                  "wire")},
            "manifests": {"output:../analysis/fig.png": "b" * 64}}
    assert anchor_form(good, first=False) == []
    assert anchor_form({**good, "seed": "x"}, first=True) == []
    assert "periodic" in ANCHOR_REASONS and "end" in ANCHOR_REASONS
    bad: list[dict[str, Any]] = [
        {**good, "kind": "anchor.v2"}, {**good, "at": True}, {**good, "at": -1.0}, {**good, "reason": "later"},
        {**good, "logs": {**good["logs"], "hosu": good["logs"]["host"]}},
        {**good, "logs": {**good["logs"], "run": {"lines": "1", "head": "a" * 64}}},
        {**good, "logs": {**good["logs"], "run": {"lines": 1, "head": None}}},
        {**good, "manifests": {"outpvt:fig.png": "b" * 64}}, {**good, "manifests": {"output:fig.png": "B" * 64}},
        {**good, "reason": "end"}, {**good, "extra": 1},
    ]
    for record in bad:
        assert anchor_form(record, first=False), record


# --------------------------------------------------------------------------
# Sandbox kinds, refusals


def test_receipts_verified_without_a_sandbox_are_a_weaker_guarantee(copy: Callable[[str], Study]) -> None:
    s = copy("plain")
    folder = s.stage("A")
    anchors = read_log(folder / "anchors.jsonl")
    assert [a["reason"] for a in anchors] == ["end", "analysis"]
    _truncate(folder / "anchors.jsonl")  # keep the runner's anchor: rebuild retakes it over the edited logs

    def edit(recs: Records) -> None:
        for f in recs["finals"]:
            path = folder / f["receipt"]
            body = {**json.loads(path.read_bytes()), "sandbox": {"kind": "none"}}
            data = canonical_bytes(body)
            path.write_bytes(data)
            f["receipt_sha256"] = sha256_hex(data)

    rebuild(folder, s.prereg, edit)
    anchor_outputs(str(folder), "rt", "A", "analysis", outputs(s, "A"), prereg=s.prereg)
    a = s.audit()
    assert a.ok, a.problems
    assert dict(a.sandbox) == {"none": 6}
    assert any("6 receipts were verified without a sandbox" in w for w in a.weaker)


def test_nothing_to_audit_is_a_refusal(copy: Callable[[str], Study], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_proctor("audit", str(empty))
    assert out.code == 3 and out.out["refusal"] == "results_not_found"
    with pytest.raises(Refusal) as info:
        audit_results(empty)
    assert info.value.code == "results_not_found"
    s = copy("plain")  # its preregistration lies outside the repository's prereg/: name it or be refused
    out = run_proctor("audit", str(s.results))
    assert out.code == 3 and out.out["refusal"] == "prereg_not_found"
    out = run_proctor("audit", str(s.results), "--prereg", str(tmp_path / "missing"))
    assert out.code == 3 and out.out["refusal"] == "prereg_not_found"


def test_anchor_outputs_refuses_a_reason_the_audit_would_not_accept(copy: Callable[[str], Study]) -> None:
    s = copy("plain")
    with pytest.raises(Refusal) as info:
        anchor_outputs(str(s.stage("A")), "rt", "A", "later", outputs(s, "A"), prereg=s.prereg)
    assert info.value.code == "anchor_reason_invalid"
    assert s.audit().ok


def test_the_committed_local_gemma_results_audit_intact() -> None:
    """The project's first real evidence (results/local-gemma, committed) must stay intact and analysable."""
    got = run_proctor("audit", "results/local-gemma")
    assert got.code == 0 and got.out["ok"] is True, got.out.get("problems")
    assert got.out["study"] == "local-gemma" and got.out["verified"]["receipts"] == 96
    assert got.out["verified"]["outputs"] >= 12  # the executed notebooks, HTML, tables and figures


GEMMA_PASSES, CONTROL_PASSES, RECEIPTS = 0, 5, 10
"""The committed pilot's numbers (docs/local-model.md): Gemma 0 of 6, the simulated control 5 of 6; the two
attempts per context-overflowing item that got an HTTP 400 before any work left no receipt."""


def test_the_committed_agents_gemma_pilot_audits_intact_and_checks_clean() -> None:
    """The Gemma pilot on repository tasks (results/agents-gemma, committed; docs/local-model.md): the oracle
    finds nothing, the report reproduces its verdicts, the audit is intact, and no file names a machine folder."""
    study = REPO / "results" / "agents-gemma"
    assert run_problems(study / "pilot", prereg_dir=REPO / "prereg" / "agents-gemma") == []
    assert machine_paths(study) == ()
    report = run_proctor("report", "--prereg", "prereg/agents-gemma", "results/agents-gemma/pilot")
    assert report.code == 0, report.out
    lines = [json.loads(line) for line in (study / "pilot" / "finals.jsonl").read_text().splitlines()]
    finals = {f["run_id"]: f for f in lines}  # the last final of each run stands (a rerun's replaces its first)
    passed = {slot: sum(f["passed"] is True for f in finals.values() if f["system"] == slot) for slot in ("gemma", "control")}
    assert passed == {"gemma": GEMMA_PASSES, "control": CONTROL_PASSES} and len(finals) == 12 and len(lines) == 14
    assert report.out["passed"] == GEMMA_PASSES + CONTROL_PASSES
    got = run_proctor("audit", "results/agents-gemma")
    assert got.code == 0 and got.out["ok"] is True, got.out.get("problems")
    assert got.out["study"] == "agents-gemma" and got.out["verified"]["receipts"] == RECEIPTS
    assert got.out["verified"]["outputs"] >= 12  # the executed notebooks, HTML, tables and figures
