"""The names a study's callers import about a run's records, gathered from where each is declared.

The records themselves (their fields, kinds and strict reads) are `harness.records`;
the stage folder's layout is `harness.run.layout`, the pure rules `harness.run.rules`,
the ledger `harness.run.ledger` and the returned summary `harness.run.summary`.
The folder's files and fields are described in docs/records.md.
"""

from __future__ import annotations

from harness.records.admission import ADMISSION_KIND
from harness.records.anchor import ANCHOR_KIND
from harness.records.attempt import validate_run_attempt
from harness.records.final import ACTIONS, CLASSES, FINAL_KIND
from harness.records.host import HOST_KIND
from harness.records.run_event import RUN_EVENT_KIND, RUN_EVENTS, STOP_CAUSES
from harness.run.layout import LOGS, archive_name, log_seed, receipt_name, stage_folder
from harness.run.rules import (
    INCONCLUSIVE_ITEMS_LIMIT,
    AdmissionInputs,
    action_for,
    admission_decision,
    admission_record,
    ceiling_total,
    classify,
    cost_for_spend,
    run_ended,
)
from harness.run.summary import RunProgress, RunSummary, SystemProgress

__all__ = [
    "ACTIONS",
    "ADMISSION_KIND",
    "ANCHOR_KIND",
    "CLASSES",
    "FINAL_KIND",
    "HOST_KIND",
    "INCONCLUSIVE_ITEMS_LIMIT",
    "LOGS",
    "RUN_EVENTS",
    "RUN_EVENT_KIND",
    "STOP_CAUSES",
    "AdmissionInputs",
    "RunProgress",
    "RunSummary",
    "SystemProgress",
    "action_for",
    "admission_decision",
    "admission_record",
    "archive_name",
    "ceiling_total",
    "classify",
    "cost_for_spend",
    "log_seed",
    "receipt_name",
    "run_ended",
    "stage_folder",
    "validate_run_attempt",
]
