"""Plain tables for a notebook: what the runner returns (`RunSummary`, `RunProgress`), a stage's anchors,
and what `prereg check` says of a design (`check_table`, `budget_table`, `power_table`: new_study.ipynb).

A `Table` is rows of plain dicts that render as aligned text (papermill's logs)
and as HTML (Jupyter); `notebooks/run_study.ipynb` imports this module as `tables`.

The manual: docs/notebooks.md.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from typing import Any

from harness.evidence.chain_read import read_log, verify_log
from harness.run.layout import log_seed
from harness.run.summary import RunProgress, RunSummary

__all__ = ["NO_MATH", "SCROLL_STYLE", "Table", "anchors_table", "budget_table", "cells_table", "check_table", "power_table",
           "preflight_table", "progress_table", "summary_table"]


NO_MATH = "tex2jax_ignore mathjax_ignore"
"""The classes that keep MathJax (JupyterLab, the HTML export) from reading dollar amounts as TeX."""
SCROLL_STYLE = "overflow-x: auto; max-width: 100%;"
"""A table wider than the page scrolls inside its own box; the page itself never scrolls sideways."""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value) or "-"
    return str(value)


_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


def _td(value: Any) -> str:
    """A cell: numbers right-aligned on one line, text left-aligned (it may wrap)."""
    text = _cell(value)
    number = (isinstance(value, (int, float)) and not isinstance(value, bool)) or bool(_NUMBER.fullmatch(text))
    style = "text-align: right; white-space: nowrap;" if number else "text-align: left;"
    return f'<td style="{style}">{html.escape(text)}</td>'


@dataclass(frozen=True)
class Table:
    """A titled table of plain rows; shown as fixed-width text (papermill's logs) and HTML (Jupyter).

    Attributes:
        title: one line above the table.
        rows: one dict per row; the columns are the keys of the first row, in order.
        note: an optional line under the table.
    """

    title: str
    rows: tuple[dict[str, Any], ...]
    note: str = ""
    columns: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.columns:
            cols: dict[str, None] = {}
            for row in self.rows:
                cols.update(dict.fromkeys(row))
            object.__setattr__(self, "columns", tuple(cols))

    def text(self) -> str:
        """The table as aligned plain text."""
        cells = [[_cell(row.get(c)) for c in self.columns] for row in self.rows]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(self.columns)]
        lines = [self.title]
        if self.columns:
            lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)).rstrip())
            lines.append("  ".join("-" * w for w in widths))
            lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
        else:
            lines.append("(none)")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(_td(row.get(c)) for c in self.columns) + "</tr>" for row in self.rows)
        note = f"<p>{esc(self.note)}</p>" if self.note else ""
        # JupyterLab typesets text between two `$` as TeX ("spend $0.01 of ceiling $3.2"): never in a table
        return (f"<div class=\"{NO_MATH}\"><p><b>{esc(self.title)}</b></p><div class=\"proctor-table\" "
                f"style=\"{SCROLL_STYLE}\"><table><tr>{head}</tr>{body}</table></div>{note}</div>")


def preflight_table(summary: RunSummary) -> Table:
    """Every problem the preflight found (`check`, `message`, and where), or one row saying none."""
    rows = tuple({"check": p.get("check"), "message": p.get("message"),
                  "refusal": p.get("refusal"), "where": p.get("path") or p.get("url") or p.get("system")}
                 for p in summary.problems)
    if not rows:
        rows = ({"check": "all", "message": "nothing stands in the way", "refusal": None, "where": None},)
    p = summary.progress
    title = (f"Preflight of study {summary.study or '?'} stage {summary.stage}: "
             f"{'ok' if summary.ok else f'{len(summary.problems)} problem(s)'}")
    return Table(title, rows, note=f"spend so far ${p.total_usd:.4f} of ceiling ${p.ceiling_usd:.4f}")


def progress_table(progress: RunProgress) -> Table:
    """One row per system: items admitted and refused, attempts, standing cells, spend against its cap."""
    rows = tuple({"system": s.system, "state": s.state, "items_admitted": s.items_admitted,
                  "items_refused": s.items_refused, "attempts": s.attempts,
                  "standing": f"{s.standing}/{s.cells}", "spend_usd": s.spend_usd, "cap_usd": s.cap_usd}
                 for s in progress.systems)
    crossed = "  CEILING CROSSED" if progress.crossed else ""
    title = (f"Study {progress.study} stage {progress.stage}: spend ${progress.total_usd:.4f} "
             f"of ceiling ${progress.ceiling_usd:.4f}{crossed}")
    return Table(title, rows)


def _finals_by_system(summary: RunSummary) -> dict[str, int]:
    path = os.path.join(summary.folder, "finals.jsonl")
    if not summary.folder or not os.path.lexists(path):
        return {}
    system_of = {c["run_id"]: c["system"] for c in summary.cells}
    counts: dict[str, int] = {}
    for rec in read_log(path, log_seed(summary.study, summary.stage, "finals")):
        system = system_of.get(rec.get("run_id", ""))
        if system is not None:
            counts[system] = counts.get(system, 0) + 1
    return counts


def summary_table(summary: RunSummary) -> Table:
    """Per system: items, cells standing, finals written (reruns included), passes, attempts, spend, stops."""
    finals = _finals_by_system(summary)
    rows = []
    for s in summary.progress.systems:
        cells = [c for c in summary.cells if c["system"] == s.system]
        stops = [st.get("cause") for st in summary.stops if st.get("system") in (s.system, None)]
        rows.append({"system": s.system, "items": len({c["item"] for c in cells}),
                     "standing": f"{s.standing}/{s.cells}", "finals": finals.get(s.system, 0),
                     "passes": sum(1 for c in cells if c["state"] == "standing" and c["passed"] is True),
                     "attempts": s.attempts, "spend_usd": s.spend_usd, "cap_usd": s.cap_usd,
                     "state": s.state, "stops": stops})
    p = summary.progress
    title = (f"Summary ({summary.mode}) of study {summary.study} stage {summary.stage}: "
             f"{'complete' if summary.complete else 'not complete'}, exit code {summary.exit_code}")
    return Table(title, tuple(rows), note=f"spend ${p.total_usd:.4f} of ceiling ${p.ceiling_usd:.4f}; "
                                          f"folder RESULTS/{summary.study}/{summary.stage}")


def cells_table(summary: RunSummary) -> Table:
    """One row per cell (a dry run's listing): what stands and the next attempt owed."""
    rows = tuple({"system": c["system"], "item": c["item"], "arm": c["arm"], "repeat": c["repeat"],
                  "state": c["state"], "class": c["class"], "passed": c["passed"],
                  "next": None if c["next"] is None else f"rerun {c['next']['rerun']} attempt {c['next']['attempt']}"}
                 for c in summary.cells)
    return Table(f"Cells of study {summary.study} stage {summary.stage} ({summary.mode})", rows)


def anchors_table(folder: str | os.PathLike[str], study: str, stage: str) -> Table:
    """The stage's last anchor: each log's lines and head, each manifest's sha256."""
    path = os.path.join(os.fspath(folder), "anchors.jsonl")
    if not os.fspath(folder) or not os.path.lexists(path):
        return Table(f"Anchors of study {study} stage {stage}", (), note="no anchors.jsonl")
    seed = log_seed(study, stage, "anchors")
    records = read_log(path, seed)
    status = verify_log(path, seed)
    last = records[-1] if records else {"logs": {}, "manifests": {}, "reason": None, "at": None}
    rows = [{"name": f"{name}.jsonl", "lines": entry.get("lines"), "head / sha256": entry.get("head")}
            for name, entry in sorted(last["logs"].items())]
    rows += [{"name": name, "lines": None, "head / sha256": sha} for name, sha in sorted(last["manifests"].items())]
    return Table(f"Anchors of study {study} stage {stage}: last anchor ({last['reason']}) of {len(records)}",
                 tuple(rows), note=f"anchors.jsonl: {status.lines} lines, head {status.head}")


# --------------------------------------------------------------------------
# What `prereg check` (harness.prereg.check.check_prereg) says of a design: notebooks/new_study.ipynb


def check_table(report: dict[str, Any]) -> Table:
    """The design at a glance: state, draw, cells per stage, and every warning `prereg check` gave."""
    rows: list[dict[str, Any]] = [
        {"what": "state", "value": report["frozen"]["state"]},
        {"what": "suite", "value": f"{report['packet']['suite']} ({report['packet']['items']} items in the packet)"},
        {"what": "draw", "value": f"{report['draw']['items']} items, seed {report['draw']['seed']}"},
        *({"what": f"stage {s['stage']}", "value": f"{s['cells']} cells ({s['formula']})"} for s in report["stages"]),
        *({"what": f"arm {a['id']}", "value": _worker_text(a["worker"])} for a in report.get("arms", ())
          if a["worker"] is not None),
        {"what": "cells", "value": report["cells_total"]},
        *({"what": "warning", "value": w} for w in report["warnings"]),
    ]
    return Table(f"prereg check of study {report['study']}: {report['title']}", tuple(rows),
                 note="a warning does not stop the freeze; read each before freezing")


def _worker_text(worker: dict[str, Any]) -> str:
    if worker["kind"] == "llm-edit":
        return f"worker llm-edit, {worker['repair_turns']} repair turns"
    return "worker command " + " ".join(worker["template"])


def budget_table(report: dict[str, Any]) -> Table:
    """Per system and stage: the expected case (each item at the reserve) beside the worst case (every rerun
    and transport retry spent), against its cap; then the overall cap and the ceiling."""
    b = report["budget"]
    rows: list[dict[str, Any]] = []
    for s in b["systems"]:
        for r in s["stages"]:
            rows.append({"system": s["slot"], "stage": r["stage"], "items": r["items"],
                         "expected_usd": r["cumulative_usd"], "worst_attempts_per_item": r["worst_attempts_per_item"],
                         "worst_usd": r["worst_cumulative_usd"], "limit_usd": s["cap_usd"], "covers": r["covers"]})
    rows.append({"system": "all", "stage": "overall cap", "items": sum(s["items"] for s in b["systems"]),
                 "expected_usd": b["expected_usd"], "worst_attempts_per_item": None, "worst_usd": b["worst_usd"],
                 "limit_usd": b["available_usd"], "covers": b["covers"]["overall_cap"]})
    rows.append({"system": "all", "stage": "ceiling", "items": None, "expected_usd": b["expected_usd"],
                 "worst_attempts_per_item": None, "worst_usd": b["worst_usd"],
                 "limit_usd": round(b["ceiling_usd"] - b["spend_before_usd"], 6), "covers": b["covers"]["ceiling"]})
    return Table(f"Budget at the reserve ${b['reserve_per_item_usd']:g} per item: expected and worst case", tuple(rows),
                 note="cumulative over the stages; covers: worst, expected or neither (docs/prereg.md, Budget)")


def power_table(report: dict[str, Any]) -> Table:
    """Per registered comparison and stage: the items needed, the exact power at the stage's items, and the
    minimum detectable margin; a comparison no stage reaches says so."""
    rows: list[dict[str, Any]] = []
    for c in report["power"]:
        name = f"{c['a']} vs {c['b']} ({c['arm']})"
        needed = c["needed"].get("n")
        for s in c["stages"]:
            rows.append({"comparison": name, "margin": c["margin"], "needed_items": needed, "stage": s["stage"],
                         "items": s["items"], "power": s["power_at_items"], "target": c["power"],
                         "reaches": s["reaches"], "min_detectable_margin": s["minimum_detectable_margin"]})
    return Table("Power of each registered comparison at each stage's items (the registered test, exact)",
                 tuple(rows), note="needed_items: at the registered alpha and power; '-' when no n reaches it")
