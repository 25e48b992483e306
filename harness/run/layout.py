"""Where a stage's files live: the stage folder, its chained logs and their seeds, receipts and archives.

A stage runs into `<results>/<study>/<stage>/`; every `*.jsonl` there except
`plan.jsonl` is a chained log whose seed names the study, the stage and the log.
See docs/records.md.
"""

from __future__ import annotations

import os
from typing import Final

from harness.records.plan import attempts_seed

__all__ = ["LOGS", "archive_name", "log_seed", "receipt_name", "stage_folder"]

LOGS: Final = ("attempts", "finals", "run", "admission", "host", "anchors", "wire")
"""The chained logs of a stage folder (`<name>.jsonl`)."""

PathArg = str | os.PathLike[str]


def stage_folder(results_dir: PathArg, study: str, stage: str) -> str:
    """`<results_dir>/<study>/<stage>` (absolute)."""
    return os.path.join(os.path.abspath(os.fspath(results_dir)), study, stage)


def log_seed(study: str, stage: str, log: str) -> str:
    """The seed of a stage's chained log: it names the study, the stage and the log."""
    if log == "attempts":
        return attempts_seed(study, stage)
    if log == "wire":
        return f"proctor-wire:{study}:{stage}"
    if log not in LOGS:
        raise ValueError(f"unknown log {log!r}")
    return f"proctor-run-{log}:{study}:{stage}"


def receipt_name(run_id: str, rerun: int) -> str:
    """The receipt's path relative to the stage folder."""
    return f"receipts/{run_id}.r{rerun}.json"


def archive_name(run_id: str, rerun: int) -> str:
    """The archived final's path relative to the stage folder."""
    return f"archive/{run_id}.r{rerun}.final.jsonl"
