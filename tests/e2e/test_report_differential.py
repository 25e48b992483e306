"""The report and the run oracle agree (issue 6): real runs on the simulator, planted file faults.

A matrix. Its rows are real runs of the runner against `proctor sim serve` with
planted simulator behaviour (provider errors and transport retries, reruns past
their limit, malformed responses, an auth failure paused and then resumed, tiny caps
so admission refuses, a ceiling crossing, latency past the attempt deadline and a
second invocation). The report (`build_report`) and the oracle (`run_problems(folder,
prereg_dir=...)`) must both accept each run. Its columns are planted file faults, each
placed at a line chosen by a fixed seed on a copy of the run; both must refuse each.
In every cell:

    the report refuses  <=>  the oracle names a problem, or the freeze, the plan or a
                             standing final's receipt does not check (the report's own
                             checks, recomputed here from the files)

and every problem the oracle names is among the report's `problems` (file, line, rule,
message). Each fault states who must catch it: `Caught(oracle=rules)` (the oracle
names at least one of these rules) and/or `Caught(report=rule)` (one of the report's
own checks names it; with no oracle rules the oracle must find nothing).

Consistent forgeries are re-chained the way `tests.support.oracle.rebuild` does (links to a
re-chained attempt re-pointed, archives rewritten, anchors retaken), but written
without fsync: a cell must be cheap, and what is on disk is what both sides read.

Faults neither side refuses yet are strict xfails (`XFAIL`, each with its reason); none
are left: a dropped `pause` or `stop` event, late costs dropped after the ceiling's
crossing, a lane's last refusal dropped and records whose fields are missing or mistyped
(each now a named oracle problem) were the last.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.audit.oracle import Problem, run_problems
from harness.audit.report import build_report
from harness.errors import Refusal
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.prereg.frozen import check_frozen
from harness.run.attempts import read_plan
from harness.run.layout import log_seed, receipt_name
from harness.run.runner import run_stage
from harness.run.setup import stage_plan_bytes
from tests.support.oracle import Records, rebuild, rewrite, strip
from tests.support.study import logs, prereg, sim_servers, system, urls

CHAINED = ("attempts", "finals", "run", "admission", "host", "wire")
SEEDS = (0, 1)  # each line-choosing fault is planted at two places per run


# --------------------------------------------------------------------------
# The rows: real runs with planted simulator behaviour


@dataclass(frozen=True)
class RunSpec:
    """One real run: simulated systems, the preregistration's knobs, and an optional second invocation.

    `then` is a second `run_stage` (with `--resume-paused`) against a simulator with those
    systems; `features` are what the run's files must show (checked by the accept test),
    so the faults that need them always have a target.
    """

    systems: tuple[dict[str, Any], ...]
    prereg: dict[str, Any] = field(default_factory=dict)
    scale: float = 0.0
    then: tuple[dict[str, Any], ...] | None = None
    features: frozenset[str] = frozenset()


RUNS: dict[str, RunSpec] = {
    "clean": RunSpec((system("sim-flash", 1.0), system("sim-glm", 0.0))),
    # provider errors: reruns and archives; rate limits retried within a run (transport_retries 1)
    "reruns": RunSpec((system("sim-flash", 1.0, server_error=0.5), system("sim-glm", 0.0, rate_limited=0.3)),
                      {"retries": 1}, features=frozenset({"archive", "retry"})),
    # every request of one system fails: its cells stand without an answer once reruns run out
    "exhausted": RunSpec((system("sim-flash", 1.0), system("sim-glm", 0.5, server_error=1.0)), {"items": 3},
                         features=frozenset({"archive", "unanswered"})),
    # malformed responses (inconclusive: rerun), an auth failure (operator: pause), then --resume-paused
    "paused": RunSpec((system("sim-flash", 0.5, malformed=0.3), system("sim-glm", 0.5, auth=0.3)),
                      then=(system("sim-flash", 0.5), system("sim-glm", 0.5)),
                      features=frozenset({"archive", "pause", "invocations"})),
    # a tiny cap: admission refuses the rest of a system's items
    "cap": RunSpec((system("sim-flash", 1.0), system("sim-glm", 0.0)), {"caps": (0.015, 1.0), "reserve": 0.01},
                   features=frozenset({"refusal"})),
    # a ceiling crossing: attempts under way stopped (budget_stop), their late costs logged
    "ceiling": RunSpec((system("sim-flash", 1.0, latency=0.05), system("sim-glm", 0.0, latency=2.0)),
                       {"overall": 0.0003, "margin": 0.0, "reserve": 0.00001}, scale=1.0,
                       features=frozenset({"ceiling", "late_cost", "stop"})),
    # latency past the attempt deadline (harness class: stop), then a second invocation reruns the cells
    "deadline": RunSpec((system("sim-flash", 1.0), system("sim-glm", 0.0, latency=3.0)), {"deadline": 1, "items": 2},
                        scale=1.0, then=(system("sim-flash", 1.0), system("sim-glm", 0.0)),
                        features=frozenset({"late_cost", "stop", "archive", "invocations"})),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], tuple[Path, Path]]]:
    """`get(name)`: (prereg folder, stage folder) of that real run, made on first use (once per worker)."""
    root = tmp_path_factory.mktemp("differential-runs")
    made: dict[str, tuple[Path, Path]] = {}
    with sim_servers(root) as sim:

        def get(name: str) -> tuple[Path, Path]:
            if name not in made:
                spec = RUNS[name]
                base = root / name
                base.mkdir()
                p = prereg(base, **spec.prereg)
                run_stage(p, "A", base / "results", base_urls=urls(sim(list(spec.systems), latency_scale=spec.scale)))
                if spec.then is not None:
                    run_stage(p, "A", base / "results", resume_paused=True,
                              base_urls=urls(sim(list(spec.then), latency_scale=spec.scale)))
                made[name] = (p, base / "results" / "rt" / "A")
            return made[name]

        yield get


def features(folder: Path) -> set[str]:
    got = logs(folder)
    events = {e["event"] for e in got["run"]}
    out = {e for e in ("ceiling", "late_cost", "stop", "pause") if e in events}
    if (folder / "archive").is_dir() and any((folder / "archive").iterdir()):
        out.add("archive")
    if any(a["attempt"] > 1 for a in got["attempts"]):
        out.add("retry")
    if any(a["decision"] == "refuse" for a in got["admission"]):
        out.add("refusal")
    if sum(e["event"] == "start" for e in got["run"]) > 1:
        out.add("invocations")
    last = {f["run_id"]: f for f in got["finals"]}
    if any(f["action"] == "stand" and f["passed"] is None for f in last.values()):
        out.add("unanswered")
    return out


# --------------------------------------------------------------------------
# Both verdicts, and the report's own checks recomputed from the files


@dataclass(frozen=True)
class Verdicts:
    """What each side said about one folder."""

    oracle: list[Problem]  # run_problems as the report runs it (registered rules when the freeze holds)
    oracle_refusal: str | None  # run_problems(prereg_dir=...) refused outright (an unchecked freeze)
    oracle_error: str | None  # run_problems raised instead of naming a problem (a traceback in the CLI)
    freeze: str | None  # check_frozen's refusal code
    plan: bool  # plan.jsonl missing, or not the frozen preregistration's plan of the stage
    receipt: bool  # a standing delivered final whose receipt does not name it or not its verdict
    report: list[dict[str, Any]] | None  # the report's problems; None when it accepted

    @property
    def refused(self) -> bool:
        return self.report is not None


def _own_plan_check(folder: Path, fresh: bytes, frozen_ok: bool) -> bool:
    path = folder / "plan.jsonl"
    if not path.exists():
        return True
    try:
        read_plan(path)
    except Refusal:
        return False  # unreadable: the oracle names it
    return frozen_ok and path.read_bytes() != fresh


def _own_receipt_check(folder: Path) -> bool:
    try:
        finals = read_log(folder / "finals.jsonl", log_seed("rt", "A", "finals"))
    except Refusal:
        return False  # a broken chain: the oracle names it
    last: dict[str, dict[str, Any]] = {}
    for f in finals:
        last[str(f.get("run_id"))] = f
    for rid, f in last.items():
        if f.get("action") != "stand" or f.get("class") != "delivered" or not isinstance(f.get("rerun"), int):
            continue
        path = folder / receipt_name(rid, f["rerun"])
        if f.get("receipt") != receipt_name(rid, f["rerun"]) or not path.is_file():
            continue  # the oracle names a missing receipt
        data = path.read_bytes()
        if sha256_hex(data) != f.get("receipt_sha256"):
            continue  # the oracle names it
        try:
            body = json.loads(data)
        except ValueError:
            return True
        if not isinstance(body, dict):
            return True
        if any(body.get(k) != f.get(k) for k in ("run_id", "rerun", "attempt_sha256", "passed")):
            return True
    return False


def verdicts(folder: Path, p: Path, fresh: bytes) -> Verdicts:
    """Both sides on `folder`; `fresh` is the frozen preregistration's plan of the stage (the unchanged one's)."""
    try:
        check_frozen(p)
        freeze = None
    except Refusal as exc:
        freeze = exc.code
    oracle_refusal = oracle_error = None
    oracle: list[Problem] = []
    try:
        oracle = run_problems(folder, prereg_dir=p)
    except Refusal as exc:
        oracle_refusal = exc.code
    except (KeyError, TypeError, ValueError) as exc:
        oracle_error = f"{type(exc).__name__}: {exc}"
    if freeze is not None:
        oracle = run_problems(folder)
    try:
        build_report(folder, prereg_dir=p)
        report = None
    except Refusal as exc:
        assert exc.code == "report_refused", (exc.code, exc.message)
        report = list(exc.details["problems"])
    return Verdicts(oracle, oracle_refusal, oracle_error, freeze, _own_plan_check(folder, fresh, freeze is None),
                    _own_receipt_check(folder), report)


# --------------------------------------------------------------------------
# The columns: planted faults


@dataclass(frozen=True)
class Caught:
    """Who must refuse a planted fault.

    `oracle`: the oracle must name at least one of these rules (empty: it must find
    nothing). `report`: the report's own check that must name it: `receipt`,
    `plan_changed`, or `freeze` (the rule is then check_frozen's refusal code).
    """

    oracle: frozenset[str] = frozenset()
    report: str | None = None


def oracle(*rules: str) -> Caught:
    return Caught(frozenset(rules))


@dataclass
class Cell:
    """A copy of one run to plant a fault in, and the seeded choice of where."""

    run: str
    prereg: Path
    folder: Path
    rng: random.Random

    def logs(self) -> dict[str, list[dict[str, Any]]]:
        return logs(self.folder)

    def pick(self, things: list[Any]) -> Any:
        assert things, f"{self.run}: nothing to plant this fault in"
        return self.rng.choice(things)

    def forge(self, edit: Callable[[Records], None], *, anchors: bool = True) -> None:
        rebuild(self.folder, self.prereg, edit, anchors=anchors)

    def standing(self) -> dict[str, dict[str, Any]]:
        last: dict[str, dict[str, Any]] = {}
        for f in self.logs()["finals"]:
            last[f["run_id"]] = f
        return {rid: f for rid, f in last.items() if f["action"] == "stand"}


Plant = Callable[[Cell], Caught]


@dataclass(frozen=True)
class Fault:
    """A planted fault: what it needs of the run, whether it chooses a line (seeded), how it is planted."""

    plant: Plant
    needs: frozenset[str] = frozenset()
    seeded: bool = True
    runs: tuple[str, ...] | None = None  # only these runs (a record-shape fault needs one)


FAULTS: dict[str, Fault] = {}


def fault(*needs: str, seeded: bool = True, runs: tuple[str, ...] | None = None) -> Callable[[Plant], Plant]:
    def register(fn: Plant) -> Plant:
        FAULTS[fn.__name__] = Fault(fn, frozenset(needs), seeded, runs)
        return fn

    return register


def _raw_lines(cell: Cell, name: str) -> list[bytes]:
    return (cell.folder / f"{name}.jsonl").read_bytes().split(b"\n")[:-1]


def _write_raw(cell: Cell, name: str, lines: list[bytes], *, newline: bool = True) -> None:
    data = b"".join(line + b"\n" for line in lines)
    (cell.folder / f"{name}.jsonl").write_bytes(data if newline else data[:-1])


def _raw_target(cell: Cell) -> tuple[str, list[bytes], int]:
    name = cell.pick([n for n in CHAINED if _raw_lines(cell, n)])
    lines = _raw_lines(cell, name)
    return name, lines, cell.rng.randrange(len(lines))


# ---- bytes changed in place (no re-chaining): the chain, or for a last line the anchors


@fault()
def digit_changed(cell: Cell) -> Caught:
    name, lines, i = _raw_target(cell)
    line = bytearray(lines[i])
    at = cell.pick([j for j, b in enumerate(line) if chr(b).isdigit()])
    line[at] = ord(cell.pick([d for d in "0123456789" if ord(d) != line[at]]))
    lines[i] = bytes(line)
    _write_raw(cell, name, lines)
    return oracle("chain") if i < len(lines) - 1 else oracle("chain", "anchor")


@fault()
def link_broken(cell: Cell) -> Caught:
    name, lines, i = _raw_target(cell)
    obj = json.loads(lines[i])
    obj["prev"] = sha256_hex(b"another history")
    lines[i] = canonical_bytes(obj)
    _write_raw(cell, name, lines)
    return oracle("chain")


@fault()
def line_dropped_in_place(cell: Cell) -> Caught:
    name, lines, i = _raw_target(cell)
    last = i == len(lines) - 1
    del lines[i]
    _write_raw(cell, name, lines)
    return oracle("anchor") if last else oracle("chain")


@fault()
def line_duplicated_in_place(cell: Cell) -> Caught:
    name, lines, i = _raw_target(cell)
    lines.insert(i + 1, lines[i])
    _write_raw(cell, name, lines)
    return oracle("chain")


@fault()
def torn_tail(cell: Cell) -> Caught:
    name = cell.pick([n for n in CHAINED if _raw_lines(cell, n)])
    _write_raw(cell, name, _raw_lines(cell, name), newline=False)
    return oracle("chain")


# ---- attempts and their run-log lines, re-chained consistently


def _attempt_lines(cell: Cell, pred: Callable[[dict[str, Any]], bool] = lambda a: True) -> list[int]:
    return [i for i, a in enumerate(cell.logs()["attempts"], start=1) if pred(a)]


@fault()
def attempt_changed_under_its_receipt(cell: Cell) -> Caught:
    # the request id of a standing delivered attempt: every link re-pointed, only its receipt still names the old line
    line = cell.pick(sorted(f["attempt_line"] for f in cell.standing().values() if f["class"] == "delivered"))

    def edit(recs: Records) -> None:
        a = next(a for a in recs["attempts"] if a["_line"] == line)
        a["provider_request_id"] = "chatcmpl-forged"

    cell.forge(edit)
    return Caught(report="receipt")


@fault()
def attempt_cost_changed(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))

    def edit(recs: Records) -> None:
        a = next(a for a in recs["attempts"] if a["_line"] == line)
        a["cost_usd"] = 0.5 if a["cost_usd"] == "unknown" else a["cost_usd"] * 2 + 1e-6

    cell.forge(edit)
    return oracle("attempt_logged")


@fault()
def attempt_dropped(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))
    cell.forge(lambda recs: recs.__setitem__("attempts", [a for a in recs["attempts"] if a["_line"] != line]))
    return oracle("attempt_logged")


@fault()
def attempt_duplicated(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))

    def edit(recs: Records) -> None:
        i = next(i for i, a in enumerate(recs["attempts"]) if a["_line"] == line)
        recs["attempts"].insert(i + 1, {**recs["attempts"][i], "_line": None})

    cell.forge(edit)
    return oracle("attempt_logged")


@fault()
def attempt_event_dropped(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))
    cell.forge(lambda recs: recs.__setitem__("run", [e for e in recs["run"] if not (
        e["event"] == "attempt" and e["attempts_line"] == line)]))
    return oracle("attempt_logged")


@fault()
def attempt_event_duplicated(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))

    def edit(recs: Records) -> None:
        i = next(i for i, e in enumerate(recs["run"]) if e["event"] == "attempt" and e["attempts_line"] == line)
        recs["run"].insert(i + 1, dict(recs["run"][i]))

    cell.forge(edit)
    return oracle("attempt_logged")


@fault()
def lane_changed(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))

    def edit(recs: Records) -> None:
        e = next(e for e in recs["run"] if e["event"] == "attempt" and e["attempts_line"] == line)
        e["lane"] = 1 - e["lane"]

    cell.forge(edit)
    return oracle("lane")


# ---- finals, receipts, archives


def _final_lines(cell: Cell, pred: Callable[[dict[str, Any]], bool] = lambda f: True) -> list[int]:
    return [i for i, f in enumerate(cell.logs()["finals"]) if pred(f)]


@fault()
def final_dropped(cell: Cell) -> Caught:
    i = cell.pick(_final_lines(cell))
    cell.forge(lambda recs: recs["finals"].pop(i))
    # a replaced final: the next one's rerun and replaced list; a cell's last: its run ended without a final
    return oracle("final_link", "archive", "final_missing", "incomplete")


@fault()
def final_duplicated(cell: Cell) -> Caught:
    i = cell.pick(_final_lines(cell))
    cell.forge(lambda recs: recs["finals"].insert(i + 1, json.loads(json.dumps(recs["finals"][i]))))
    return oracle("final_link")


CLASSES = ("delivered", "provider", "operator", "harness", "inconclusive", "model", "ceiling")
ACTIONS = ("stand", "rerun", "pause", "stop")


@fault()
def final_class_or_action_changed(cell: Cell) -> Caught:
    i = cell.pick(_final_lines(cell))
    key = cell.pick(["class", "action"])

    def edit(recs: Records) -> None:
        f = recs["finals"][i]
        f[key] = cell.pick([v for v in (CLASSES if key == "class" else ACTIONS) if v != f[key]])

    cell.forge(edit)
    return oracle("class_action")


@fault()
def final_verdict_changed(cell: Cell) -> Caught:
    # a delivered verdict flipped; everything re-chained: only the receipt still says otherwise
    i = cell.pick(_final_lines(cell, lambda f: f["class"] == "delivered"))

    def edit(recs: Records) -> None:
        recs["finals"][i]["passed"] = not recs["finals"][i]["passed"]

    cell.forge(edit)
    return Caught(report="receipt")


@fault()
def final_cell_changed(cell: Cell) -> Caught:
    # the final names another system, item, arm or repeat than its plan cell (or another kind)
    i = cell.pick(_final_lines(cell))
    key = cell.pick(["kind", "system", "item", "arm", "repeat"])

    def edit(recs: Records) -> None:
        f = recs["finals"][i]
        f[key] = {"kind": "run-final.v0", "system": "good" if f["system"] == "bad" else "bad",
                  "item": "HumanEval/0", "arm": "other", "repeat": 2}[key]

    cell.forge(edit)
    return oracle("final_link")


@fault("unanswered")
def unanswered_final_given_a_pass(cell: Cell) -> Caught:
    # a cell that stands without an answer (reruns exhausted) claims a pass: the report would score it
    rid = cell.pick(sorted(rid for rid, f in cell.standing().items() if f["passed"] is None))
    cell.forge(lambda recs: [f for f in recs["finals"] if f["run_id"] == rid][-1].__setitem__("passed", True))
    return oracle("final_link")


@fault()
def final_without_its_run_id(cell: Cell) -> Caught:
    i = cell.pick(_final_lines(cell))
    cell.forge(lambda recs: recs["finals"][i].pop("run_id"))
    return oracle("final_link")


@fault()
def final_receipt_elsewhere(cell: Cell) -> Caught:
    # a delivered final pointing at a path that is not its run's receipt: a folder, a device, another receipt
    i = cell.pick(_final_lines(cell, lambda f: f["class"] == "delivered"))
    other = cell.pick(["receipts", "/dev/null", *sorted(f"receipts/{n.name}" for n in
                                                       (cell.folder / "receipts").iterdir())])

    def edit(recs: Records) -> None:
        f = recs["finals"][i]
        f["receipt"] = other if other != f["receipt"] else "receipts"

    cell.forge(edit)
    return oracle("final_link")


@fault()
def receipt_changed(cell: Cell) -> Caught:
    path = cell.folder / cell.pick(sorted(f["receipt"] for f in cell.standing().values() if f["receipt"]))
    path.write_bytes(path.read_bytes().replace(b'"passed":', b'"passed" :', 1))
    return oracle("final_link")


@fault()
def receipt_removed(cell: Cell) -> Caught:
    (cell.folder / cell.pick(sorted(f["receipt"] for f in cell.standing().values() if f["receipt"]))).unlink()
    return oracle("final_link")


@fault()
def receipt_verdict_rewritten(cell: Cell) -> Caught:
    # the receipt's verdict flipped and its sha256 re-recorded in the final: only the report reads the receipt
    rid = cell.pick(sorted(rid for rid, f in cell.standing().items() if f["receipt"]))

    def edit(recs: Records) -> None:
        f = [f for f in recs["finals"] if f["run_id"] == rid][-1]
        path = cell.folder / f["receipt"]
        body = json.loads(path.read_bytes())
        body["passed"] = not body["passed"]
        data = canonical_bytes(body) + b"\n"
        path.write_bytes(data)
        f["receipt_sha256"] = sha256_hex(data)

    cell.forge(edit)
    return Caught(report="receipt")


@fault()
def receipt_not_json_rehashed(cell: Cell) -> Caught:
    rid = cell.pick(sorted(rid for rid, f in cell.standing().items() if f["receipt"]))

    def edit(recs: Records) -> None:
        f = [f for f in recs["finals"] if f["run_id"] == rid][-1]
        data = b"passed: true\n"
        (cell.folder / f["receipt"]).write_bytes(data)
        f["receipt_sha256"] = sha256_hex(data)

    cell.forge(edit)
    return Caught(report="receipt")


def _archives(cell: Cell) -> list[Path]:
    return sorted((cell.folder / "archive").iterdir())


@fault("archive")
def archive_removed(cell: Cell) -> Caught:
    cell.pick(_archives(cell)).unlink()
    return oracle("archive")


@fault("archive")
def archive_changed(cell: Cell) -> Caught:
    path = cell.pick(_archives(cell))
    path.write_bytes(path.read_bytes().replace(b'"at":', b'"at": ', 1))
    return oracle("archive")


@fault("archive")
def archive_added(cell: Cell) -> Caught:
    src = cell.pick(_archives(cell))
    shutil.copy(src, src.parent / "r-00000000000000000000.r0.final.jsonl")
    return oracle("archive")


# ---- admission, spend, the ceiling


def _admission_lines(cell: Cell, decision: str | None = None) -> list[int]:
    return [i for i, a in enumerate(cell.logs()["admission"]) if decision is None or a["decision"] == decision]


@fault()
def admission_inputs_changed(cell: Cell) -> Caught:
    i = cell.pick(_admission_lines(cell))

    def edit(recs: Records) -> None:
        a = recs["admission"][i]
        a["finished_usd"] += 0.001
        a["projected_usd"] = a["finished_usd"] + a["reserve_usd"] * a["under_way"]

    cell.forge(edit)
    return oracle("admission_inputs", "admission_rule")


@fault()
def admission_decision_changed(cell: Cell) -> Caught:
    i = cell.pick(_admission_lines(cell))

    def edit(recs: Records) -> None:
        a = recs["admission"][i]
        a["decision"], a["reason"] = ("refuse", "over_cap") if a["decision"] == "admit" else ("admit", "within_cap")

    cell.forge(edit)
    return oracle("admission_rule")


@fault()
def admission_duplicated(cell: Cell) -> Caught:
    i = cell.pick(_admission_lines(cell, "admit"))
    cell.forge(lambda recs: recs["admission"].insert(i + 1, dict(recs["admission"][i])))
    return oracle("lane_order", "admission_inputs", "admission_rule")


@fault("ceiling")
def ceiling_total_changed(cell: Cell) -> Caught:
    def edit(recs: Records) -> None:
        e = cell.pick([e for e in recs["run"] if e["event"] == "ceiling"])
        e["total_usd"] += 0.0001

    cell.forge(edit)
    return oracle("conservation")


@fault("ceiling")
def ceiling_event_dropped(cell: Cell) -> Caught:
    i = cell.pick([i for i, e in enumerate(cell.logs()["run"]) if e["event"] == "ceiling"])
    cell.forge(lambda recs: recs["run"].pop(i))
    return oracle("ceiling")


@fault("ceiling")
def spend_before_the_crossing_changed(cell: Cell) -> Caught:
    got = cell.logs()
    crossed = min(e["crossed_at"] for e in got["run"] if e["event"] == "ceiling")
    line = cell.pick([i for i, a in enumerate(got["attempts"], start=1)
                      if a["ended"] <= crossed and isinstance(a["cost_usd"], float)])

    def edit(recs: Records) -> None:
        a = next(a for a in recs["attempts"] if a["_line"] == line)
        a["cost_usd"] *= 0.5
        e = next(e for e in recs["run"] if e["event"] == "attempt" and e["attempts_line"] == line)
        e["cost_usd"] = a["cost_usd"]

    cell.forge(edit)
    return oracle("conservation")


@fault("late_cost")
def late_cost_duplicated(cell: Cell) -> Caught:
    i = cell.pick([i for i, e in enumerate(cell.logs()["run"]) if e["event"] == "late_cost"])
    cell.forge(lambda recs: recs["run"].insert(i + 1, dict(recs["run"][i])))
    return oracle("late_cost")


def _drop_events(cell: Cell, event: str, which: Callable[[list[int]], list[int]] = lambda i: i) -> None:
    drop = set(which([i for i, e in enumerate(cell.logs()["run"]) if e["event"] == event]))
    assert drop, f"{cell.run}: no {event} event"
    cell.forge(lambda recs: recs.__setitem__("run", [e for i, e in enumerate(recs["run"]) if i not in drop]))


@fault("late_cost", seeded=False)
def late_costs_dropped(cell: Cell) -> Caught:
    # spend that the next invocation's admissions count (deadline); none after the ceiling's crossing (ceiling)
    _drop_events(cell, "late_cost")
    return oracle("admission_inputs", "conservation", "late_cost")


@fault("pause", seeded=False)
def pause_event_dropped(cell: Cell) -> Caught:
    _drop_events(cell, "pause", lambda i: i[:1])
    return oracle("halted")


@fault("stop", seeded=False)
def stop_events_dropped(cell: Cell) -> Caught:
    _drop_events(cell, "stop")
    return oracle("halted")


def _refusals(cell: Cell) -> list[int]:
    return _admission_lines(cell, "refuse")


@fault("refusal", seeded=False)
def first_refusal_dropped(cell: Cell) -> Caught:
    i = _refusals(cell)[0]
    cell.forge(lambda recs: recs["admission"].pop(i))
    return oracle("admission_inputs")


@fault("refusal", seeded=False)
def last_refusal_dropped(cell: Cell) -> Caught:
    i = _refusals(cell)[-1]
    cell.forge(lambda recs: recs["admission"].pop(i))
    return oracle("admission_inputs", "lane_order")


@fault(runs=("clean",))
def admission_without_its_time(cell: Cell) -> Caught:
    i = cell.pick(_admission_lines(cell))
    cell.forge(lambda recs: recs["admission"][i].pop("at"))
    return oracle("admission_rule", "admission_inputs")


@fault(runs=("clean",))
def attempt_event_line_mistyped(cell: Cell) -> Caught:
    line = cell.pick(_attempt_lines(cell))

    def edit(recs: Records) -> None:
        e = next(e for e in recs["run"] if e["event"] == "attempt" and e["attempts_line"] == line)
        e["attempts_line"] = str(line)

    cell.forge(edit)
    return oracle("attempt_logged")


# ---- anchors


@fault()
def history_rewritten_after_its_anchor(cell: Cell) -> Caught:
    # a host sample changed and the logs re-chained validly, the anchors left as they were
    i = cell.pick(list(range(len(cell.logs()["host"]))))

    def edit(recs: Records) -> None:
        recs["host"][i]["load"] = [9.0, 9.0, 9.0]

    cell.forge(edit, anchors=False)
    return oracle("anchor")


@fault()
def log_shorter_than_its_anchor(cell: Cell) -> Caught:
    # the last line of a log removed: still a valid chain, no longer what was anchored
    name = cell.pick(["attempts", "finals", "run", "admission", "host"])
    lines = _raw_lines(cell, name)
    _write_raw(cell, name, lines[:-1])
    return oracle("anchor")


@fault()
def anchor_claims_more_lines(cell: Cell) -> Caught:
    anchors = [strip(a) for a in cell.logs()["anchors"]]
    a = cell.pick(anchors)
    name = cell.pick(sorted(a["logs"]))
    a["logs"][name]["lines"] += 1
    rewrite(cell.folder, "anchors", anchors)
    return oracle("anchor")


# ---- the preregistration and the plan


@fault(seeded=False)
def prereg_text_changed(cell: Cell) -> Caught:
    (cell.prereg / "PREREG.md").write_text("# runner test\n\nEdited after the run.\n")
    return Caught(report="freeze")


@fault(seeded=False)
def frozen_hash_changed(cell: Cell) -> Caught:
    path = cell.prereg / "FROZEN.json"
    doc = json.loads(path.read_bytes())
    doc["files"]["design.toml"] = sha256_hex(b"another design")
    path.write_bytes(canonical_bytes(doc) + b"\n")
    return Caught(report="freeze")


@fault(seeded=False)
def plan_replaced(cell: Cell) -> Caught:
    other = check_frozen(prereg(cell.folder.parent.parent.parent / "other", items=5))
    (cell.folder / "plan.jsonl").write_bytes(stage_plan_bytes(other.path, other.design, "A"))
    return Caught(frozenset({"anchor"}), report="plan_changed")


@fault(seeded=False)
def plan_removed(cell: Cell) -> Caught:
    (cell.folder / "plan.jsonl").unlink()
    return Caught(frozenset({"chain"}), report="plan_changed")


# --------------------------------------------------------------------------
# The matrix


XFAIL: dict[tuple[str | None, str], str] = {}
"""(run or None for every run, fault) -> why neither side refuses it yet: strict xfails, each a known bug."""


def cells() -> list[Any]:
    out = []
    for run, spec in RUNS.items():
        for name, f in FAULTS.items():
            if f.needs <= spec.features and run in (f.runs or RUNS):
                why = XFAIL.get((run, name)) or XFAIL.get((None, name))
                marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
                for seed in SEEDS if f.seeded else SEEDS[:1]:
                    out.append(pytest.param(run, name, seed, id=f"{run}-{name}-{seed}", marks=marks))
    return out


def place(runs: Callable[[str], tuple[Path, Path]], run: str, tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A copy of the run's preregistration and stage folder, and its plan as planted (the fresh one)."""
    p, folder = runs(run)
    dst_p = tmp_path / "prereg" / "rt"
    shutil.copytree(p, dst_p)
    dst = tmp_path / "results" / "rt" / "A"
    shutil.copytree(folder, dst)
    return dst_p, dst, (folder / "plan.jsonl").read_bytes()


def key(p: Problem | dict[str, Any]) -> tuple[Any, ...]:
    if isinstance(p, Problem):
        return (p.file, p.line, p.rule, p.message)
    return (p["file"], p["line"], p["rule"], p["message"])


def assert_agree(v: Verdicts) -> None:
    """The report refuses iff the oracle or one of its own checks does; it names every oracle problem."""
    expected = bool(v.oracle) or v.oracle_error is not None or v.freeze is not None or v.plan or v.receipt
    shown = [str(p) for p in v.oracle]
    assert v.refused == expected, (v, shown)
    if v.report is not None:
        assert {key(p) for p in v.oracle} <= {key(p) for p in v.report}, (shown, v.report)
        rules = {p["rule"] for p in v.report}
        assert (v.freeze in rules) == (v.freeze is not None)
        assert ("plan_changed" in rules) == v.plan
        assert ("receipt" in rules) == v.receipt
        assert ("malformed" in rules) == (v.oracle_error is not None)
    if v.freeze is not None:  # the oracle with the registered rules refuses the unchecked freeze too
        assert v.oracle_refusal == v.freeze
    else:
        assert v.oracle_refusal is None



@pytest.mark.parametrize("run", list(RUNS))
def test_both_accept_every_real_run(runs: Callable[[str], tuple[Path, Path]], run: str, tmp_path: Path) -> None:
    p, folder, fresh = place(runs, run, tmp_path)
    assert RUNS[run].features <= features(folder), features(folder)
    frozen = check_frozen(p)
    assert fresh == stage_plan_bytes(frozen.path, frozen.design, "A")
    v = verdicts(folder, p, fresh)
    assert_agree(v)
    assert not v.refused and v.oracle == [] and run_problems(folder.parent.parent) == []
    report = build_report(folder, prereg_dir=p)
    last = {f["run_id"]: f for f in logs(folder)["finals"]}
    # issue 13: a cell standing on a transport failure is exhausted (listed, never scored), not standing
    gone = sum(f["action"] == "stand" and f["class"] == "provider" for f in last.values())
    assert report.summary["exhausted"] == gone and report.frame.height == report.summary["standing"]
    assert report.summary["standing"] + gone == sum(f["action"] == "stand" for f in last.values())
    # forging with no edit changes nothing either side can see (the forger is faithful)
    rebuild(folder, p, lambda recs: None)
    assert_agree(w := verdicts(folder, p, fresh))
    assert not w.refused


@pytest.mark.parametrize(("run", "name", "seed"), cells())
def test_both_refuse_every_planted_fault(runs: Callable[[str], tuple[Path, Path]], run: str, name: str, seed: int,
                                         tmp_path: Path) -> None:
    p, folder, fresh = place(runs, run, tmp_path)
    caught = FAULTS[name].plant(Cell(run, p, folder, random.Random(f"{run}/{name}/{seed}")))
    v = verdicts(folder, p, fresh)
    assert_agree(v)
    assert v.refused, f"{name} at seed {seed} in {run}: neither side refused"
    named = {q.rule for q in v.oracle}
    if caught.oracle:
        assert named & caught.oracle, ([str(q) for q in v.oracle], caught)
    else:
        assert v.oracle == [], [str(q) for q in v.oracle]
    if caught.report == "freeze":
        assert v.freeze is not None
    elif caught.report == "plan_changed":
        assert v.plan
    elif caught.report == "receipt":
        assert v.receipt
