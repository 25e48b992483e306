"""Anchors for `anchors.jsonl`: every chained log's line count and head, every manifest's sha256.

Written every `ANCHOR_EVERY_S` seconds while a stage runs and at the end of
each invocation. The anchor command (a git push of a snapshot, with
`run.anchor_remote`) is `harness.run.anchor_push`.

The manual: docs/running.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from harness.evidence.chain_read import verify_log
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.records.anchor import Anchor

__all__ = ["ANCHOR_EVERY_S", "OUTPUT_REASONS", "anchor_record", "output_manifest_name"]

ANCHOR_EVERY_S: Final = 15 * 60.0

OUTPUT_REASONS: Final = ("notebook", "analysis", "outputs")
"""The reasons `harness.notebooks.stage.anchor_outputs` writes (the runner's own anchors are `periodic` and `end`)."""


def output_manifest_name(folder: str, path: str | os.PathLike[str], prefix: str = "output") -> str:
    """`<prefix>:<path relative to the stage folder>` (POSIX separators; `..` when it lies outside).

    `proctor audit` resolves every `notebook:` and `output:` manifest from the stage
    folder it is anchored in, so a results folder moved whole still audits.
    """
    rel = os.path.relpath(os.path.abspath(os.fspath(path)), folder)
    return f"{prefix}:{rel.replace(os.sep, '/')}"


def anchor_record(
    at: float, reason: str, logs: Mapping[str, tuple[str, str]], manifests: Mapping[str, str]
) -> dict[str, Any]:
    """The `anchor.v1` record: `logs` maps a name to (path, seed), `manifests` a name to a path.

    A log with a problem is anchored with its intact lines and `problem`; an
    absent log or manifest is anchored as absent (lines 0 / sha256 null).
    """
    out_logs: dict[str, Any] = {}
    for name, (path, seed) in logs.items():
        if not os.path.lexists(path):
            out_logs[name] = {"lines": 0, "head": None}
            continue
        status = verify_log(path, seed)
        entry: dict[str, Any] = {"lines": status.lines, "head": status.head}
        if status.problem is not None:
            entry["problem"] = status.problem.to_json()
        out_logs[name] = entry
    out_manifests = {
        name: (sha256_hex(read_bytes(path)) if os.path.exists(path) else None) for name, path in manifests.items()
    }
    return Anchor(at, reason, out_logs, out_manifests).to_json()
