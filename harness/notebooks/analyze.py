"""`proctor analyze`: the analysis notebook run with papermill, exported to HTML, every output anchored.

The manual: docs/notebooks.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from harness.audit.results import StudyResults, open_study
from harness.errors import Code, InputRefusal, NotebookRefusal, Refusal
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.paths import repo_root, resolve
from harness.evidence.portable import shown_path
from harness.notebooks.display import Table
from harness.notebooks.stage import PapermillRun, anchor_outputs, run_papermill
from harness.prereg.statement import NOT_STATED
from harness.run.anchors import output_manifest_name

if TYPE_CHECKING:
    import polars as pl

    from harness.analysis.study import StudyAnalysis
    from harness.prereg.statement import PreregStatement

__all__ = [
    "AnalysisCheck",
    "AnalysisPaths",
    "Difference",
    "Figure",
    "Statement",
    "analysis_notebook",
    "analysis_paths",
    "analyze_results",
    "breakeven_lines",
    "check_analysis",
    "figure",
    "frame_table",
    "outputs_table",
    "repo_breakeven_lines",
    "repo_outputs",
    "statement",
    "verdict_lines",
]

PathArg = str | os.PathLike[str]

_MAX_OUTPUT_BYTES: Final = 256 * 1024 * 1024
_REASON: Final = "analysis"


# --------------------------------------------------------------------------
# What the notebook calls


@dataclass(frozen=True)
class AnalysisPaths:
    """The folders an analysis reads and writes (absolute paths; shown relative to `root`).

    Attributes:
        results: the results folder given (RESULTS, RESULTS/<study> or a stage folder).
        prereg: the preregistration folder (given, or found by the freeze's sha256).
        study: the study id.
        stages: the stage folders analysed, in name order.
        out: the analysis folder (default `RESULTS/<study>/analysis`).
        tables: `<out>/tables`, one CSV per table.
        figures: `<out>/figures`, each figure as PNG and SVG.
        root: the folder relative paths are taken from; the table shows every path relative to it.
    """

    results: str
    prereg: str
    study: str
    stages: tuple[str, ...]
    out: str
    tables: str
    figures: str
    root: str = ""

    def shown(self, path: str) -> str:
        """`path` as the notebook shows it: relative to `root` (never the machine's absolute path)."""
        return shown_path(path, self.root or repo_root())

    def figure(self, stem: str) -> str:
        """The stem (`<out>/figures/<stem>`) a figure function writes `.png` and `.svg` to."""
        return os.path.join(self.figures, stem)

    def table(self) -> Table:
        """The paths as a two-column table."""
        rows = [{"what": "study", "path": self.study}, {"what": "results", "path": self.shown(self.results)},
                {"what": "preregistration", "path": self.shown(self.prereg)},
                *({"what": "stage", "path": self.shown(s)} for s in self.stages),
                {"what": "analysis folder", "path": self.shown(self.out)}]
        return Table("What is analysed", tuple(rows))


def _paths(found: StudyResults, results: str, out: str, root: str) -> AnalysisPaths:
    out_dir = out or os.path.join(found.folder, "analysis")
    return AnalysisPaths(results, found.prereg, found.study, tuple(s.folder for s in found.stages), out_dir,
                         os.path.join(out_dir, "tables"), os.path.join(out_dir, "figures"), root)


def analysis_paths(results: PathArg, *, out: PathArg = "", prereg: PathArg = "",
                   root: PathArg | None = None) -> AnalysisPaths:
    """The notebook's folders; relative paths are taken from the repository root (`repo_root`).

    Args:
        results: RESULTS, RESULTS/<study> or a stage folder.
        out: the analysis folder; "" for `RESULTS/<study>/analysis`.
        prereg: the preregistration; "" to find it by the freeze's sha256 under `<root>/prereg/`.
        root: the folder relative paths are taken from and `prereg/` is searched in
            (default: the repository root found from the working folder).

    Raises:
        Refusal: `results_not_found`, `results_mixed`, `prereg_not_found` (`open_study`).
    """
    base = os.path.abspath(os.fspath(root)) if root is not None else str(repo_root())
    results_dir = resolve(results, base)
    found = open_study(results_dir, prereg=resolve(prereg, base) if os.fspath(prereg) else None, root=base)
    return _paths(found, results_dir, resolve(out, base) if os.fspath(out) else "", base)


def _shown(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value != 0 and abs(value) < 1e-3:
        return f"{value:.3g}"  # costs per attempt: four decimals would show 0.0000
    return value


def frame_table(title: str, frame: pl.DataFrame, *, columns: Sequence[str] | None = None,
                note: str = "") -> Table:
    """A polars frame as a `Table` (text for papermill's logs, HTML for the export).

    Args:
        title: the line above the table.
        frame: the rows.
        columns: the columns shown, in order (those the frame lacks are skipped); default all.
        note: a line under the table.
    """
    shown = [c for c in (columns or frame.columns) if c in frame.columns]
    rows = tuple({c: _shown(row[c]) for c in shown} for row in frame.select(shown).iter_rows(named=True))
    return Table(title, rows, note=note, columns=tuple(shown))


@dataclass(frozen=True, repr=False)
class Figure:
    """A saved figure: shown inline as its PNG (Jupyter, the HTML export) and as its paths in text logs.

    Attributes:
        paths: the files a figure function wrote (`.png` and `.svg`).
    """

    paths: tuple[str, ...]

    def _repr_png_(self) -> bytes:
        return read_bytes(next(p for p in self.paths if p.endswith(".png")), max_bytes=_MAX_OUTPUT_BYTES)

    def __repr__(self) -> str:
        return "figure: " + ", ".join(_in_analysis(p) for p in self.paths)


def figure(paths: Iterable[str]) -> Figure:
    """A figure function's outputs, to `display`."""
    return Figure(tuple(paths))


def _in_analysis(path: str) -> str:
    """An output's path inside the analysis folder (`tables/q.csv`, `figures/forest.png`)."""
    return "/".join([p for p in os.path.normpath(path).split(os.sep) if p][-2:])


def outputs_table(tables: Mapping[str, str], figures: Iterable[str]) -> Table:
    """The files an analysis wrote: each table (`write_tables`' name -> path) and each figure file, by its
    path inside the analysis folder."""
    rows = [{"output": f"table {name}", "path": _in_analysis(path)} for name, path in tables.items()]
    rows += [{"output": f"figure {os.path.basename(path)}", "path": _in_analysis(path)} for path in figures]
    return Table("Outputs written (proctor analyze anchors their sha256 in every stage)", tuple(rows))


@dataclass(frozen=True, repr=False)
class Statement:
    """What the study asks, from PREREG.md, shown as Markdown (the HTML export) and as text (logs).

    Attributes:
        markdown: the section as Markdown.
    """

    markdown: str

    def _repr_markdown_(self) -> str:
        return self.markdown

    def __repr__(self) -> str:
        return self.markdown


def _demoted(text: str) -> str:
    """PREREG.md's own headings inside a section, moved below the notebook's (### and deeper)."""
    return "\n".join(f"###{line}" if line.startswith("#") else line for line in text.splitlines())


def statement(found: PreregStatement | None) -> Statement:
    """The preregistration's title, research question and hypotheses (`analysis.statement`), each
    section's text as written, or "not stated in PREREG.md" when it has no such section."""
    if found is None:
        return Statement("*The preregistration's PREREG.md was not read.*")
    parts = [f"**{found.title}** (PREREG.md)" if found.title else "PREREG.md has no title"]
    for name, text in (("Research question", found.question), ("Hypotheses", found.hypotheses)):
        parts.append(f"### {name}")
        parts.append(_demoted(text) if text else f"*{NOT_STATED} in PREREG.md* (no section headed "
                                                 f"'{name.split()[-1]}')")
    return Statement("\n\n".join(parts))


def repo_outputs(analysis: StudyAnalysis, paths: AnalysisPaths) -> tuple[list[Any], list[str]]:
    """What the notebook shows for a `repo_task` study (`StudyAnalysis.repo`), in order, and the figure files
    it wrote: nothing for any other kind, so a completion study's notebook is as before (docs/analysis.md)."""
    from harness.analysis import figures

    repo = analysis.repo
    if repo is None:
        return [], []
    level = f"{100 * (1 - analysis.alpha):g}%"
    kinds = figures.kind_plot(repo.features, paths.figure("pass_by_kind"))
    shown: list[Any] = [
        Statement("## Repository tasks\n\nEach attempt is one run of the gated path; its cost is every model "
                  "request the worker made, plus any late cost logged after it was abandoned."),
        frame_table(f"Cost per hidden-test pass and q per system and arm ({level} Wilson interval)", repo.q,
                    columns=["stage", "system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high",
                             "requests", "requests_per_attempt", "late_costs", "late_cost_usd", "cost_usd",
                             "cost_per_attempt_usd", "cost_per_pass_usd"],
                    note="cost_usd: every request of every attempt of the cell, late costs included; every column "
                         "in tables/repo_q.csv"),
        frame_table("Paired on the same (item, repeat): systems on each arm, arms on each system", repo.paired,
                    columns=["stage", "between", "a", "b", "arm", "system", "n", "b10", "b01", "p_a", "p_b",
                             "diff", "ci_low", "ci_high", "mcnemar_p", "cost_diff_usd", "verdict", "note"],
                    note=f"ci: Tango's score {100 * (1 - 2 * analysis.alpha):g}% interval; verdict only for a "
                         "registered comparison (the others are exploratory)"),
        frame_table("Break-even of cheap-first routing with the gate's cost v (measured, or assumed: v_source)",
                    repo.breakeven,
                    columns=["stage", "arm", "cheap", "strong", "n_pairs", "q", "b", "v", "v_source", "v_s", "s",
                             "break_even_q", "predicted_savings", "strong_pass_rate", "composed_pass_rate",
                             "cost_ratio", "note"],
                    note="savings = q - (b + v) / s; v in dollars per attempt like b and s (the gate's seconds "
                         "per attempt in v_s, not priced); every column in tables/repo_breakeven.csv"),
        figure(kinds),
        frame_table("Pass rate by task feature (mutation kind, library, module), per system and arm",
                    repo.features, note=f"{level} Wilson intervals; tables/repo_features.csv"),
    ]
    return shown, kinds


# --------------------------------------------------------------------------
# Lines for people (the CLI)


def _num(value: Any, fmt: str = ".3f") -> str:
    return "-" if not isinstance(value, (int, float)) or isinstance(value, bool) else format(value, fmt)


def verdict_lines(comparisons: Iterable[dict[str, Any]]) -> list[str]:
    """One line per comparison: the difference, the registered method's 1-2*alpha interval, the margin and the verdict."""
    out = []
    for r in comparisons:
        head = f"stage {r.get('stage')}: {r.get('a')} vs {r.get('b')} on {r.get('arm')}, margin {_num(r.get('margin'), 'g')}"
        if not isinstance(r.get("diff"), (int, float)):
            out.append(f"{head}: not made ({r.get('note') or r.get('verdict') or 'no paired cells'})")
            continue
        alpha = r.get("alpha")
        level = f"{100 * (1 - 2 * alpha):g}% " if isinstance(alpha, (int, float)) else ""
        p = r.get("p")
        if not isinstance(p, (int, float)):  # tables written before the registered method's p column
            p = r.get("tango_p") if str(r.get("method", "")).startswith("tango") else r.get("wald_p")
        ci = f"{r.get('ci_method')} " if r.get("ci_method") else ""
        out.append(f"{head}: diff {_num(r.get('diff'), '+.3f')}, {level}{ci}CI [{_num(r.get('ci_low'))}, "
                   f"{_num(r.get('ci_high'))}], n {r.get('n')}, p {_num(p, '.4g')} ({r.get('method')}) "
                   f"-> {r.get('verdict')}")
    return out


def breakeven_lines(breakeven: Iterable[dict[str, Any]]) -> list[str]:
    """One line per cascade: the cheap pass rate against the break-even rate, and the predicted savings.

    The system a failed cheap answer goes to is named by its slot (`strong` in the
    break-even table is its role, not its name: it may be a middle tier).
    """
    out = []
    for r in breakeven:
        then = r.get("strong")
        out.append(f"stage {r.get('stage')}, arm {r.get('arm')}: {r.get('cheap')} first, then {then}: "
                   f"q {_num(r.get('q'))} vs break-even {_num(r.get('break_even_q'))} -> predicted savings "
                   f"{_num(r.get('predicted_savings'), '+.3f')} of {then}'s cost; composed pass rate "
                   f"{_num(r.get('composed_pass_rate'))} vs {then} alone {_num(r.get('strong_pass_rate'))} "
                   f"({r.get('gate', 'oracle')} gate)")
    return out


# --------------------------------------------------------------------------
# proctor analyze


def _repository() -> str:
    """The repository this package lives in (the kernel's working folder)."""
    return str(repo_root(os.path.dirname(os.path.abspath(__file__))))


def analysis_notebook() -> str:
    """`notebooks/analysis.ipynb` of the repository this package lives in."""
    path = os.path.join(_repository(), "notebooks", "analysis.ipynb")
    if not os.path.isfile(path):
        raise InputRefusal(Code.FILE_MISSING, "the analysis notebook is not here (an installed package without "
                      "the repository's notebooks/)", path)
    return path


def _export_html(executed: str, html_path: str) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    text = read_bytes(executed, max_bytes=_MAX_OUTPUT_BYTES).decode("utf-8")
    nb = nbformat.reads(text, as_version=4)  # type: ignore[no-untyped-call]
    for cell in nb.cells:  # papermill gives its injected cell a random id; the export names it
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell["id"] = "injected-parameters"
    # papermill's per-cell timings and the run's start and end live in metadata: the export shows none
    # of it; with the title fixed and the injected cell named, equal outputs give equal HTML.
    exporter = HTMLExporter()  # type: ignore[no-untyped-call]
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": "analysis"}})
    atomic_write(html_path, body.encode("utf-8"), mode=0o644)


def _execute(source: str, paths: AnalysisPaths, base: str) -> PapermillRun:
    """Run the notebook with its kernel in `base` and every path parameter relative to it, so that the
    executed notebook names no folder of this machine (docs/notebooks.md)."""
    def rel(path: str) -> str:
        return os.path.relpath(path, base).replace(os.sep, "/")

    parameters = {"results": rel(paths.results), "out": rel(paths.out), "prereg": rel(paths.prereg), "root": "."}
    return run_papermill(source, os.path.join(paths.out, "analysis.ipynb"), parameters, cwd=base)


def _files(folder: str, suffixes: tuple[str, ...]) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder))
            if n.endswith(suffixes) and not n.startswith(".") and os.path.isfile(os.path.join(folder, n))]


def _anchor_all(found: StudyResults, notebook: str, outputs: Sequence[str], *, strict: bool) -> list[dict[str, Any]]:
    anchored = []
    for stage in found.stages:
        named = {output_manifest_name(stage.folder, notebook, "notebook"): notebook}
        named.update({output_manifest_name(stage.folder, p, "output"): p for p in outputs})
        try:
            record = anchor_outputs(stage.folder, found.study, stage.stage, _REASON, named, prereg=found.prereg)
        except Refusal as exc:
            if strict:
                raise
            anchored.append({"stage": stage.stage, "folder": stage.folder, "anchored": False,
                             "refusal": exc.code, "message": exc.message})
            continue
        anchored.append({"stage": stage.stage, "folder": stage.folder, "anchored": True,
                         "manifests": record["manifests"],
                         **({"push": record["push"]} if "push" in record else {})})  # a registered witness
    return anchored


def _rows(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        return []
    import polars as pl

    rows = pl.read_csv(read_bytes(path, max_bytes=_MAX_OUTPUT_BYTES), infer_schema_length=None).to_dicts()
    return [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in rows]


def analyze_results(
    results: PathArg,
    *,
    prereg: PathArg | None = None,
    out: PathArg | None = None,
    root: PathArg | None = None,
    progress: Callable[[str], None] | None = None,
    notebook: PathArg | None = None,
) -> dict[str, Any]:
    """Run the analysis notebook on a study's results, export it to HTML and anchor every output.

    Args:
        results: RESULTS, RESULTS/<study> or a stage folder (relative to the working folder).
        prereg: the preregistration folder; default: found by the freeze's sha256 under `<root>/prereg/`.
        out: the analysis folder; default `RESULTS/<study>/analysis`.
        root: the repository root searched for the preregistration (default: found from the working folder).
        progress: called with a line (ending in a newline) as each step starts and ends.
        notebook: another analysis notebook taking the same parameters (`results`, `out`,
            `prereg`); default `notebooks/analysis.ipynb`.

    Returns:
        `{"ok": True, study, prereg, out, "notebook": {path, sha256}, "html": {path, sha256},
        "tables": [{name, path, sha256}], "figures": [{path, sha256}], "anchored": [per stage],
        "q_table", "comparisons", "breakeven": rows read back from the tables written,
        "repo_breakeven" (empty unless the suite is `repo_task`), "verdicts", "break_even", "repo_break_even":
        lines for people}`.

    Raises:
        Refusal: `open_study`'s refusals before anything runs; `analysis_refused` (a refusal
            in the notebook, `notebook_refusal` its code) or `analysis_failed` (any other cell
            error) after the executed copy was saved and anchored; an anchor's refusal.
    """
    say = progress or (lambda _line: None)
    base = os.path.abspath(os.fspath(root)) if root is not None else str(repo_root())
    results_dir = os.path.abspath(os.fspath(results))
    found = open_study(results_dir, prereg=None if prereg is None else os.path.abspath(os.fspath(prereg)), root=base)
    paths = _paths(found, results_dir, "" if out is None else os.path.abspath(os.fspath(out)), base)
    source = analysis_notebook() if notebook is None else os.path.abspath(os.fspath(notebook))
    executed = os.path.join(paths.out, "analysis.ipynb")
    say(f"analysing study {found.study} ({len(found.stages)} stage(s)) with {source}\n"
        f"  running the notebook -> {executed} ...\n")
    run = _execute(source, paths, base)
    if run.error is not None:
        anchored = _anchor_all(found, run.path, [], strict=False)
        ename, evalue = str(getattr(run.error, "ename", "")), str(getattr(run.error, "evalue", ""))
        say(f"  the notebook stopped: {ename}\n")
        if ename == "Refusal":
            code = evalue.split(":", 1)[0].strip()
            raise NotebookRefusal(Code.ANALYSIS_REFUSED, f"the analysis notebook refused: {evalue}", run.path,
                          notebook_refusal=code, anchored=anchored)
        raise NotebookRefusal(Code.ANALYSIS_FAILED, f"the analysis notebook failed: {ename}: {evalue}", run.path,
                      ename=ename, evalue=evalue, anchored=anchored)
    html_path = os.path.join(paths.out, "analysis.html")
    say(f"  exporting {html_path}\n")
    _export_html(run.path, html_path)
    tables = _files(paths.tables, (".csv",))
    figures = _files(paths.figures, (".png", ".svg"))
    outputs = [html_path, *tables, *figures]
    say(f"  anchoring the notebook and {len(outputs)} outputs in {len(found.stages)} stage(s)\n")
    anchored = _anchor_all(found, run.path, outputs, strict=True)

    def digest(path: str) -> str:
        return sha256_hex(read_bytes(path, max_bytes=_MAX_OUTPUT_BYTES))

    comparisons = _rows(os.path.join(paths.tables, "comparisons.csv"))
    breakeven = _rows(os.path.join(paths.tables, "breakeven.csv"))
    repo_breakeven = _rows(os.path.join(paths.tables, "repo_breakeven.csv"))  # a repo_task study's only
    return {
        "ok": True,
        "study": found.study,
        "prereg": found.prereg,
        "out": paths.out,
        "notebook": {"path": run.path, "sha256": run.sha256},
        "html": {"path": html_path, "sha256": digest(html_path)},
        "tables": [{"name": os.path.splitext(os.path.basename(p))[0], "path": p, "sha256": digest(p)}
                   for p in tables],
        "figures": [{"path": p, "sha256": digest(p)} for p in figures],
        "anchored": anchored,
        "q_table": _rows(os.path.join(paths.tables, "q.csv")),
        "comparisons": comparisons,
        "breakeven": breakeven,
        "verdicts": verdict_lines(comparisons),
        "break_even": breakeven_lines(breakeven),
        "repo_breakeven": repo_breakeven,
        "repo_break_even": repo_breakeven_lines(repo_breakeven),
    }


def repo_breakeven_lines(breakeven: Iterable[dict[str, Any]]) -> list[str]:
    """One line per repository-task cascade (`repo_breakeven`): q against (b + v) / s with v and where it came
    from (measured from the live cascades' gates, or assumed), or why it was not composed."""
    out = []
    for r in breakeven:
        then = r.get("strong")
        head = f"stage {r.get('stage')}, arm {r.get('arm')}: {r.get('cheap')} first, then {then}"
        if not isinstance(r.get("break_even_q"), (int, float)):
            out.append(f"{head}: {r.get('note') or 'not composed'}")
            continue
        seconds = f", gate {_num(r.get('v_s'), '.2f')} s/attempt" if isinstance(r.get("v_s"), (int, float)) else ""
        out.append(f"{head}: q {_num(r.get('q'))} vs break-even {_num(r.get('break_even_q'))} = (b "
                   f"${_num(r.get('b'), '.4g')} + v ${_num(r.get('v'), '.4g')} {r.get('v_source')}{seconds}) / s "
                   f"${_num(r.get('s'), '.4g')} -> predicted savings {_num(r.get('predicted_savings'), '+.3f')} of "
                   f"{then}'s cost; composed pass rate {_num(r.get('composed_pass_rate'))} vs {then} alone "
                   f"{_num(r.get('strong_pass_rate'))} (hidden-test gate)")
    return out


# --------------------------------------------------------------------------
# proctor analyze --check


@dataclass(frozen=True)
class Difference:
    """One output that does not reproduce: its path inside the analysis folder and what differs."""

    file: str
    what: str


@dataclass(frozen=True)
class AnalysisCheck:
    """`proctor analyze --check`: the analysis re-executed into a temporary folder, every anchored table
    and figure compared byte for byte with the files and their anchored sha256 (the HTML shows paths
    relative to the root it was made from, and the audit checks its sha256).

    Attributes:
        study: the study id.
        out: the analysis folder checked (relative to the root).
        compared: the outputs compared (paths inside the analysis folder).
        differences: each output that differs, is missing or is not anchored; none when `ok`.
    """

    study: str
    out: str
    compared: tuple[str, ...]
    differences: tuple[Difference, ...]

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "study": self.study, "out": self.out, "compared": list(self.compared),
                "differences": [{"file": d.file, "what": d.what} for d in self.differences]}


def _analysis_anchor(stage_folder: str, study: str, stage: str, out: str) -> tuple[int, dict[str, str]] | None:
    """(line index, {path inside `out` -> sha256}) of the stage's latest analysis anchor naming `out`."""
    from harness.evidence.chain_read import read_log
    from harness.run.layout import log_seed

    path = os.path.join(stage_folder, "anchors.jsonl")
    if not os.path.lexists(path):
        return None
    prefix = output_manifest_name(stage_folder, os.path.join(out, "x"), "output")[:-1]
    found = None
    for index, record in enumerate(read_log(path, log_seed(study, stage, "anchors"))):
        manifests = record.get("manifests") or {}
        mine = {name[len(prefix):]: sha for name, sha in manifests.items() if name.startswith(prefix)}
        if record.get("reason") == _REASON and mine:
            found = (index, {k: v for k, v in mine.items() if isinstance(v, str)})
    return found


def _mirror(path: str, common: str, into: str) -> str:
    """`path` under `into` as it lies under `common` (every folder an analysis names lies under it), so that
    relative paths between them are kept."""
    return os.path.join(into, os.path.relpath(path, common))


def _compared(name: str, data: bytes) -> bytes:
    """What `--check` compares of an output: every byte, but for the provenance table's `checkout:` rows,
    which name the checkout the analysis ran in (a re-execution runs in the reviewer's own)."""
    if name != "tables/provenance.csv":
        return data
    return b"".join(row for row in data.splitlines(keepends=True) if not row.startswith(b"checkout:"))


def _csv_rows(data: bytes) -> list[bytes]:
    return data.splitlines()


def _what_differs(name: str, anchored: bytes, again: bytes) -> str:
    if name.endswith(".csv"):
        a, b = _csv_rows(anchored), _csv_rows(again)
        rows = sorted({x.split(b",")[0].decode("utf-8", "replace") for x in set(a) ^ set(b)})
        return (f"differs from the re-execution in {len(set(a) ^ set(b))} rows"
                + (f" ({', '.join(rows[:6])})" if rows else ""))
    return f"differs from the re-execution ({len(anchored)} bytes anchored, {len(again)} re-executed)"


def check_analysis(
    results: PathArg,
    *,
    prereg: PathArg | None = None,
    out: PathArg | None = None,
    root: PathArg | None = None,
    progress: Callable[[str], None] | None = None,
    notebook: PathArg | None = None,
) -> AnalysisCheck:
    """Re-execute the analysis of `results` into a temporary folder and compare every anchored output.

    The stages and the preregistration are copied (each stage's anchors.jsonl cut before the analysis
    anchor checked, as it was when the analysis ran); nothing is written into the evidence. Arguments
    as `analyze_results`. Raises `open_study`'s refusals.
    """
    import shutil
    import tempfile

    from harness.evidence.chain_read import read_log
    from harness.prereg.design import load_design
    from harness.run.layout import log_seed

    say = progress or (lambda _line: None)
    base = os.path.abspath(os.fspath(root)) if root is not None else str(repo_root())
    results_dir = os.path.abspath(os.fspath(results))
    found = open_study(results_dir, prereg=None if prereg is None else os.path.abspath(os.fspath(prereg)), root=base)
    paths = _paths(found, results_dir, "" if out is None else os.path.abspath(os.fspath(out)), base)
    source = analysis_notebook() if notebook is None else os.path.abspath(os.fspath(notebook))
    differences: list[Difference] = []
    anchored: dict[str, str] = {}
    cut: dict[str, int] = {}
    for stage in found.stages:
        got = _analysis_anchor(stage.folder, found.study, stage.stage, paths.out)
        if got is None:
            differences.append(Difference(paths.shown(stage.folder), f"stage {stage.stage} anchors no analysis of "
                                                                     f"{paths.shown(paths.out)}"))
            continue
        cut[stage.folder] = got[0]
        for name, sha in got[1].items():
            if anchored.setdefault(name, sha) != sha:
                differences.append(Difference(name, "the stages anchor different sha256 for it"))
    if differences:
        return AnalysisCheck(found.study, paths.shown(paths.out), (), tuple(differences))
    packet = load_design(os.path.join(found.prereg, "design.toml")).packet_path  # named relative to the prereg
    common = os.path.commonpath([base, found.folder, found.prereg, paths.out, packet])
    with tempfile.TemporaryDirectory(prefix="proctor-check-") as into:
        os.makedirs(os.path.dirname(_mirror(packet, common, into)), exist_ok=True)
        shutil.copyfile(packet, _mirror(packet, common, into))
        for stage in found.stages:
            copy = _mirror(stage.folder, common, into)
            shutil.copytree(stage.folder, copy, symlinks=True)
            seed = log_seed(found.study, stage.stage, "anchors")
            keep = read_log(os.path.join(stage.folder, "anchors.jsonl"), seed)[:cut[stage.folder]]
            lines = read_bytes(os.path.join(stage.folder, "anchors.jsonl")).splitlines(keepends=True)
            atomic_write(os.path.join(copy, "anchors.jsonl"), b"".join(lines[:len(keep)]), mode=0o644)
        prereg_copy = _mirror(found.prereg, common, into)
        shutil.copytree(found.prereg, prereg_copy, symlinks=True)
        root_copy = _mirror(base, common, into)
        os.makedirs(root_copy, exist_ok=True)
        study_copy = _mirror(found.folder, common, into)
        again = _paths(open_study(study_copy, prereg=prereg_copy, root=root_copy), study_copy,
                       _mirror(paths.out, common, into), root_copy)
        say(f"re-executing the analysis of study {found.study} in a temporary folder ...\n")
        run = _execute(source, again, root_copy)
        if run.error is not None:
            what = f"{getattr(run.error, 'ename', '')}: {getattr(run.error, 'evalue', '')}"
            return AnalysisCheck(found.study, paths.shown(paths.out), (),
                                 (Difference("analysis.ipynb", f"the re-execution stopped: {what}"),))
        made = {os.path.relpath(p, again.out).replace(os.sep, "/"): p
                for p in [*_files(again.tables, (".csv",)), *_files(again.figures, (".png", ".svg"))]}
        anchored = {k: v for k, v in anchored.items() if k.startswith(("tables/", "figures/"))}
        for name in sorted(set(anchored) | set(made)):
            here = os.path.join(paths.out, name)
            if name not in made:
                differences.append(Difference(name, "anchored but not made by the re-execution"))
                continue
            if name not in anchored:
                differences.append(Difference(name, "made by the re-execution but not anchored"))
                continue
            if not os.path.isfile(here):
                differences.append(Difference(name, "anchored but gone from the analysis folder"))
                continue
            data, fresh = read_bytes(here, max_bytes=_MAX_OUTPUT_BYTES), read_bytes(made[name], max_bytes=_MAX_OUTPUT_BYTES)
            if sha256_hex(data) != anchored[name]:
                differences.append(Difference(name, "its sha256 is not the anchored one"))
            if _compared(name, data) != _compared(name, fresh):
                differences.append(Difference(name, _what_differs(name, data, fresh)))
    say(f"  compared {len(made)} outputs: {len(differences)} differ\n")
    return AnalysisCheck(found.study, paths.shown(paths.out), tuple(sorted(made)), tuple(differences))
