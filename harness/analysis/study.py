"""A study's analysis: every table the analysis notebook shows, from validated results only.

The manual: docs/analysis.md.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import polars as pl

from harness.analysis.cascade import LiveStep, gate_costs, live_steps
from harness.analysis.frame_tables import (
    BREAKEVEN_SCHEMA,
    COMPARISON_SCHEMA,
    POWER_SCHEMA,
    SENSITIVITY_SCHEMA,
    FrameTables,
    analyze_frame,
    frame_of,
    stage_order,
)
from harness.analysis.repo import (
    FEATURE_COLUMNS,
    FEATURES,
    LATE_COLUMNS,
    REQUEST_COLUMNS,
    RepoTables,
    repo_tables,
)
from harness.audit.report import Report, build_report
from harness.audit.results import StudyResults, open_study
from harness.errors import Code, LogRefusal, Refusal
from harness.evals.suite import load_suite, suite_kind
from harness.evidence.chain_read import read_log, verify_log
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.prereg.design import Design
from harness.prereg.folder import AMENDMENTS_NAME, FROZEN_NAME, GO_NAME
from harness.prereg.frozen import FrozenPrereg, amendments_seed, check_frozen
from harness.prereg.go import go_seed
from harness.prereg.statement import PreregStatement, read_statement
from harness.records._shape import build
from harness.records.provenance import Provenance, current_provenance
from harness.run.layout import LOGS, log_seed

__all__ = [
    "AMENDMENTS_SCHEMA",
    "BREAKEVEN_SCHEMA",
    "COMPARISON_SCHEMA",
    "HYPOTHESES_SCHEMA",
    "LEFT_OUT_SCHEMA",
    "POWER_SCHEMA",
    "PROVENANCE_SCHEMA",
    "SENSITIVITY_SCHEMA",
    "VALIDATION_SCHEMA",
    "FrameTables",
    "StudyAnalysis",
    "amendments_table",
    "analyze_frame",
    "analyze_study",
    "hypotheses_table",
    "left_out_table",
    "table_csv",
    "write_tables",
]

PathArg = str | os.PathLike[str]
_F, _I, _S = pl.Float64, pl.Int64, pl.String

VALIDATION_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "folder": _S, "cells": _I, "standing": _I, "not_standing": _I, "exhausted": _I, "passed": _I,
    "cost_unknown": _I, "plan_sha256": _S, "frozen_sha256": _S, "amendments": _I,
}
AMENDMENTS_SCHEMA: Final[dict[str, Any]] = {
    "amendment": _I, "at": _S, "reason": _S, "kind": _S, "changed": _S, "frozen_sha256": _S, "stages_before": _S,
}
"""One row per amendment: its date, reason, kind (`files` or `note`), the files it changed ("PREREG.md
changed; ..."), the sha256 of FROZEN.json after it, and the stages that ran under an earlier freeze
(each one checked to still stand: it is in the validation table)."""
HYPOTHESES_SCHEMA: Final[dict[str, Any]] = {
    "hypothesis": _I, "statement": _S, "a": _S, "b": _S, "arm": _S, "margin": _F, "test": _S, "alpha": _F,
}
"""One row per registered comparison (design.toml), as the hypothesis it tests."""
LEFT_OUT_SCHEMA: Final[dict[str, Any]] = {
    "stage": _S, "system": _S, "cells": _I, "scored": _I, "exhausted": _I, "not_standing": _I, "why": _S,
}
"""Per stage and system: the planned cells, those scored, those exhausted (an outage: left out of every
pass rate and comparison), those not standing (the stage is unfinished), and why any were left out."""
EXHAUSTED_WHY: Final = ("exhausted: every transport retry failed (an outage, not the model); never scored, "
                        "left out of pass rates and comparisons")
NOT_STANDING_WHY: Final = "not standing: the stage did not finish these cells; nothing to score"
PROVENANCE_SCHEMA: Final[dict[str, Any]] = {
    "name": _S, "path": _S, "sha256": _S, "lines": _I, "head": _S, "kind": _S, "version": _S,
}
_VERSIONS: Final = ("model-proctor", "python", "polars", "scipy", "matplotlib")


@dataclass(frozen=True)
class StudyAnalysis:
    """Everything the analysis notebook shows for one study (see the module docstring).

    Attributes:
        study: the study id.
        prereg: the preregistration folder (absolute).
        alpha: the registered alpha.
        validation, attempts, q, comparisons, breakeven, sensitivity, power, provenance, amendments: the tables.
        folder: the study folder (`RESULTS/<study>`, absolute).
        statement: PREREG.md's title, question and hypotheses (`harness.prereg.statement`).
        hypotheses: the registered comparisons as hypotheses (`HYPOTHESES_SCHEMA`).
        left_out: the cells left out of scoring, per stage and system (`LEFT_OUT_SCHEMA`).
    """

    study: str
    prereg: str
    alpha: float
    validation: pl.DataFrame
    attempts: pl.DataFrame
    q: pl.DataFrame
    comparisons: pl.DataFrame
    breakeven: pl.DataFrame
    sensitivity: pl.DataFrame
    power: pl.DataFrame
    provenance: pl.DataFrame
    folder: str = ""
    amendments: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=AMENDMENTS_SCHEMA))
    statement: PreregStatement | None = None
    hypotheses: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=HYPOTHESES_SCHEMA))
    left_out: pl.DataFrame = dataclasses.field(default_factory=lambda: pl.DataFrame(schema=LEFT_OUT_SCHEMA))
    repo: RepoTables | None = None
    """The repository-task tables (`harness.analysis.repo`) when the suite's kind is `repo_task`, else None."""

    def tables(self) -> dict[str, pl.DataFrame]:
        """name -> frame in display order: hypotheses, validation, amendments, left_out, q, comparisons,
        breakeven, sensitivity, power, provenance, then a repo_task study's repo_q, repo_paired, repo_breakeven
        and repo_features."""
        return {**self._tables(), **({} if self.repo is None else self.repo.tables())}

    def _tables(self) -> dict[str, pl.DataFrame]:
        return {"hypotheses": self.hypotheses, "validation": self.validation, "amendments": self.amendments,
                "left_out": self.left_out, "q": self.q,
                "comparisons": self.comparisons, "breakeven": self.breakeven, "sensitivity": self.sensitivity,
                "power": self.power, "provenance": self.provenance}


# --------------------------------------------------------------------------
# Reading the results


def _version(name: str) -> str | None:
    if name == "python":
        return platform.python_version()
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _log_row(name: str, path: str, rel: str, seed: str, kind: str) -> dict[str, Any]:
    status = verify_log(path, seed)
    if status.problem is not None:
        code = Code.LOG_TORN_TAIL if status.problem.kind == "torn_tail" else Code.LOG_BROKEN
        raise Refusal(code, status.problem.message, path, line=status.problem.line, kind=status.problem.kind)
    return {"name": name, "path": rel, "lines": status.lines, "head": status.head, "kind": kind}


def amendments_table(frozen: FrozenPrereg, stages: Mapping[str, str] | None = None) -> pl.DataFrame:
    """Every amendment of `frozen` (`AMENDMENTS_SCHEMA`); `stages`: stage -> the freeze its plan names."""
    freezes = frozen.freezes()
    ran = {s: freezes.index(sha) for s, sha in (stages or {}).items() if sha in freezes}
    rows = [{"amendment": a.number, "at": a.at, "reason": a.reason, "kind": "note" if a.note else "files",
             "changed": "; ".join(f"{c.path} {c.change}" for c in a.changed),
             "frozen_sha256": freezes[a.number],
             "stages_before": ", ".join(s for s, k in sorted(ran.items()) if k < a.number)}
            for a in frozen.amendments]
    return frame_of(rows, AMENDMENTS_SCHEMA)


def hypotheses_table(design: Design) -> pl.DataFrame:
    """Each registered comparison as the hypothesis it tests (`HYPOTHESES_SCHEMA`)."""
    test = "paired TOST" if design.test == "paired_tost" else "independent-samples TOST"
    rows = [{"hypothesis": i, "a": c.a, "b": c.b, "arm": c.arm, "margin": c.margin, "test": design.test,
             "alpha": design.alpha,
             "statement": (f"{c.a} and {c.b} pass within {c.margin:g} of each other on arm {c.arm} "
                           f"({test} at alpha {design.alpha:g}; expected {c.expected_a:g} and {c.expected_b:g})")}
            for i, c in enumerate(design.comparisons, start=1)]
    return frame_of(rows, HYPOTHESES_SCHEMA)


def left_out_table(reports: Mapping[str, Report], stage_ids: Sequence[str]) -> pl.DataFrame:
    """Per stage and system, the planned cells and those left out of scoring, and why (`LEFT_OUT_SCHEMA`)."""
    rows: list[dict[str, Any]] = []
    for stage in stage_ids:
        report = reports[stage]
        planned: dict[str, int] = report.summary["cells_by_system"]
        scored = dict(report.frame.group_by("system").len().iter_rows())
        gone = dict(report.exhausted.group_by("system").len().iter_rows())
        for system in planned:
            n_scored, n_gone = int(scored.get(system, 0)), int(gone.get(system, 0))
            not_standing = planned[system] - n_scored - n_gone
            why = [w for n, w in ((n_gone, EXHAUSTED_WHY), (not_standing, NOT_STANDING_WHY)) if n]
            rows.append({"stage": stage, "system": system, "cells": planned[system], "scored": n_scored,
                         "exhausted": n_gone, "not_standing": not_standing, "why": "; ".join(why) or None})
    return frame_of(rows, LEFT_OUT_SCHEMA)


def _provenance(results: StudyResults, frozen: FrozenPrereg) -> pl.DataFrame:
    rows: list[dict[str, Any]] = [{"name": f"prereg:{FROZEN_NAME}", "path": FROZEN_NAME,
                                   "sha256": frozen.frozen_sha256, "kind": "prereg"}]
    first = ("design.toml", "systems.json", "PREREG.md")
    for name in [*first, *sorted(set(frozen.files) - set(first))]:
        if name in frozen.files:
            rows.append({"name": f"prereg:{name}", "path": name, "sha256": frozen.files[name], "kind": "prereg"})
    amendments = os.path.join(frozen.path, AMENDMENTS_NAME)
    if os.path.lexists(amendments):
        row = _log_row(f"prereg:{AMENDMENTS_NAME}", amendments, AMENDMENTS_NAME,
                       amendments_seed(frozen.design.study_id), "prereg")
        rows.append({**row, "sha256": sha256_hex(read_bytes(amendments))})
    gos = os.path.join(frozen.path, GO_NAME)
    if os.path.lexists(gos):  # the gos to run (`proctor prereg go`): not part of the freeze, but evidence
        row = _log_row(f"prereg:{GO_NAME}", gos, GO_NAME, go_seed(frozen.design.study_id), "prereg")
        rows.append({**row, "sha256": sha256_hex(read_bytes(gos))})
    for stage in results.stages:
        rel = os.path.relpath(stage.folder, results.folder).replace(os.sep, "/")
        rows.append({"name": f"{stage.stage}:plan", "path": f"{rel}/plan.jsonl", "sha256": stage.plan_sha256,
                     "kind": "plan"})
        for log in LOGS:
            path = os.path.join(stage.folder, f"{log}.jsonl")
            if os.path.lexists(path):
                rows.append(_log_row(f"{stage.stage}:{log}", path, f"{rel}/{log}.jsonl",
                                     log_seed(results.study, stage.stage, log), "log"))
    rows.extend({"name": f"version:{name}", "kind": "version", "version": _version(name)} for name in _VERSIONS)
    here = current_provenance()
    rows += [{"name": "checkout:commit", "kind": "checkout", "version": here.commit},
             {"name": "checkout:dirty", "kind": "checkout", "version": _dirty(here.dirty)}]
    for stage in results.stages:  # what each stage's run recorded (its start events, first and last)
        for when, got in _run_provenance(stage.folder, results.study, stage.stage):
            rows.append({"name": f"{stage.stage}:run:{when}", "kind": "run",
                         "version": f"{got.harness} {got.commit} {_dirty(got.dirty)}"})
    return frame_of(rows, PROVENANCE_SCHEMA)


def _dirty(dirty: bool | None) -> str:
    return "unknown" if dirty is None else "dirty" if dirty else "clean"


def _run_provenance(folder: str, study: str, stage: str) -> list[tuple[str, Provenance]]:
    """(first | last, provenance) of the stage's start events that record one (none before issue 13)."""
    path = os.path.join(folder, "run.jsonl")
    if not os.path.lexists(path):
        return []
    found = [build(Provenance, r["provenance"]) for r in read_log(path, log_seed(study, stage, "run"))
             if r.get("event") == "start" and isinstance(r.get("provenance"), dict)]
    if not found:
        return []
    return [("first", found[0])] + ([("last", found[-1])] if len(found) > 1 else [])


def analyze_study(results: PathArg, *, prereg: PathArg | None = None, root: PathArg | None = None) -> StudyAnalysis:
    """Validate every stage of a study's results, then compute every table (see the module docstring).

    Args:
        results: RESULTS, RESULTS/<study> or a stage folder (`harness.audit.results.open_study`).
        prereg: the preregistration folder; default: the one whose FROZEN.json the plans name.
        root: the repository root searched for `prereg/*/` (default: found from the cwd).

    Raises:
        Refusal: `report_refused` (unchanged from `build_report`) when any stage does not validate;
            `open_study`'s refusals (`results_not_found`, `results_mixed`, `prereg_not_found`).
    """
    found = open_study(results, prereg=prereg, root=root)
    reports = {s.stage: build_report(s.folder, prereg_dir=found.prereg) for s in found.stages}
    frozen = check_frozen(found.prereg)
    design = frozen.design
    stage_ids = stage_order(design, list(reports))  # each plan was checked against the frozen design's
    attempts = pl.concat([reports[s].frame for s in stage_ids], how="vertical")
    exhausted = pl.concat([reports[s].exhausted for s in stage_ids], how="vertical") if stage_ids else None
    tables = analyze_frame(attempts, design, stages=stage_ids, exhausted=exhausted)
    folders = {s.stage: os.path.relpath(s.folder, found.folder).replace(os.sep, "/") for s in found.stages}
    validation = frame_of([{**reports[s].summary, "stage": s, "folder": folders[s],  # relative: no machine path
                            "amendments": len(reports[s].summary["amendments"])} for s in stage_ids],
                          VALIDATION_SCHEMA)
    return StudyAnalysis(
        study=found.study, prereg=found.prereg, alpha=design.alpha, validation=validation, attempts=attempts,
        q=tables.q, comparisons=tables.comparisons, breakeven=tables.breakeven, sensitivity=tables.sensitivity,
        power=tables.power, provenance=_provenance(found, frozen), folder=found.folder,
        amendments=amendments_table(frozen, {s.stage: s.frozen_sha256 for s in found.stages}),
        statement=read_statement(found.prereg), hypotheses=hypotheses_table(design),
        left_out=left_out_table(reports, stage_ids),
        repo=_repo(found, design, attempts, stage_ids),
    )


def _read(folder: str, log: str, study: str, stage: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, f"{log}.jsonl")
    return read_log(path, log_seed(study, stage, log)) if os.path.lexists(path) else []


def _repo(found: StudyResults, design: Design, attempts: pl.DataFrame, stage_ids: Sequence[str]) -> RepoTables | None:
    """The repository-task tables of a `repo_task` study (None for any other kind): late costs from each stage's
    run log, requests from its attempts' work, features from the sealed suite (`load_suite`), the gate's cost v
    measured from its live cascade attempts' steps (`gate_costs`; docs/analysis.md, "The gate's cost v")."""
    suite_dir = os.path.dirname(design.packet_path)
    if not os.path.lexists(os.path.join(suite_dir, "SUITE.json")) or suite_kind(suite_dir) != "repo_task":
        # a packet without a SUITE.json is a completion suite (`harness.run.kinds.kind_for`)
        return None
    suite = load_suite(suite_dir, design.packet_sha256)
    late: list[dict[str, Any]] = []
    requests: dict[tuple[str, str], int] = {}
    steps: list[LiveStep] = []
    for stage in found.stages:
        if stage.stage not in stage_ids:
            continue
        steps += live_steps(stage.folder, attempts.filter(pl.col("stage") == stage.stage), design)
        for e in _read(stage.folder, "run", found.study, stage.stage):
            if e.get("event") == "late_cost":
                cost = e.get("cost_usd")
                late.append({"stage": stage.stage, "run_id": e["run_id"],
                             "cost_usd": None if cost == "unknown" or cost is None else float(cost)})
        for a in _read(stage.folder, "attempts", found.study, stage.stage):
            key = (stage.stage, str(a["run_id"]))
            work = a.get("work")
            requests[key] = requests.get(key, 0) + (int(work["exchanges"]) if isinstance(work, dict) else 0)
    features = [{"item": it.item, **{f: None if it.metadata.get(f) is None else str(it.metadata[f]) for f in FEATURES}}
                for it in suite.packet]
    gates = gate_costs(steps)
    return repo_tables(attempts, design, late=frame_of(late, LATE_COLUMNS),
                       requests=frame_of([{"stage": s, "run_id": r, "requests": n} for (s, r), n in requests.items()],
                                         REQUEST_COLUMNS),
                       features=frame_of(features, FEATURE_COLUMNS), stages=stage_ids,
                       gate_costs={s: g.v_usd for s, g in gates.items()},
                       gate_seconds={s: g.v_s for s, g in gates.items()})


# --------------------------------------------------------------------------
# Writing


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)


def table_csv(frame: pl.DataFrame) -> bytes:
    """One table as CSV bytes: a header, `\\n` line ends, floats to 12 significant digits, null empty."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(frame.columns)
    for row in frame.iter_rows():
        writer.writerow([_text(v) for v in row])
    return out.getvalue().encode("utf-8")


def write_tables(analysis: StudyAnalysis, out_dir: PathArg) -> dict[str, str]:
    """Write `<name>.csv` for every table into `out_dir` (created); returns name -> path (absolute).

    Raises:
        Refusal: `file_unwritable` when the folder cannot be made or a file cannot be written.
    """
    folder = os.path.abspath(os.fspath(out_dir))
    written: dict[str, str] = {}
    path = folder
    try:
        os.makedirs(folder, exist_ok=True)
        for name, frame in analysis.tables().items():
            path = os.path.join(folder, f"{name}.csv")
            atomic_write(path, table_csv(frame), mode=0o644)
            written[name] = path
    except OSError as exc:
        raise LogRefusal(Code.FILE_UNWRITABLE, exc.strerror or str(exc), path) from None
    return written
