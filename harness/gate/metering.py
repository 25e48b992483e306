"""The metering proxy around one worker run, and the check of the wire log it leaves.

A `--model` dispatch (and a sandboxed model delegate) reaches its provider
only through `harness.meter.proxy`; the dispatch records the proxy's own
tally of what it wrote so that `proctor record` can tell a forged log.

The manual: docs/models.md.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from harness.errors import Refusal

if TYPE_CHECKING:
    from harness.meter.allowance import Allowance

__all__ = ["metering_proxy", "socket_base_url", "wire_end"]


@contextmanager
def metering_proxy(
    upstream: str, out: str, name: str, *, unix: bool = False, allowance: Allowance | None = None
) -> Iterator[dict[str, Any]]:
    """Run the metering proxy in front of `upstream` for the block.

    Yields a dict: `base_url` (what the worker must use), `wire_log` (the
    chained wire log `out`, seed `proctor-wire:<name>`), with `unix` the
    `socket` it also listens on (in a private folder, removed afterwards)
    and, once the block has ended, `proxy` (the proxy's summary: exchanges
    recorded, failures, budget stops). With `allowance` the proxy stops requests that
    would cross it (docs/models.md, "Budgets inside an attempt").
    """
    from harness.meter.proxy import start_proxy

    folder = tempfile.mkdtemp(prefix="proctor-proxy-") if unix else None
    try:
        sock = os.path.join(folder, "proxy.sock") if folder is not None else None
        proxy = start_proxy(upstream, out, port=0, name=name, unix_socket=sock, allowance=allowance)
        metering: dict[str, Any] = {"base_url": proxy.url, "wire_log": out, "wire_name": name, "socket": sock}
        try:
            yield metering
        finally:
            metering["proxy"] = proxy.close()
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def socket_base_url(proxy_url: str) -> str:
    """The base URL a worker uses over the proxy's Unix socket: the host is ignored, the path kept."""
    from urllib.parse import urlsplit

    return "http://localhost" + urlsplit(proxy_url).path


def wire_end(metering: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The wire log as the proxy wrote it, and why the file differs from that (None when it does not).

    `lines` and `head` are the proxy's in-memory tally of the lines it appended
    and the sha256 of its last one, never read back from the file: the log
    lives in the dispatch folder, which the worker (the same user) can write
    while it runs, so a worker could append or rewrite correctly chained
    records. `interleaved` counts the proxy's appends that found a line it had
    not written at the end of the log. `file_lines`, `file_head` and `problem`
    are what the file verifies to now. `proctor record` later requires the file
    to end at the same `lines` and `head`.
    """
    from harness.evidence.chain_read import verify_log
    from harness.meter.wire import wire_seed

    path = metering["wire_log"]
    summary = metering["proxy"]
    lines, head, interleaved = summary["wire_lines"], summary["wire_head"], summary["wire_interleaved"]
    out: dict[str, Any] = {
        "path": path,
        "exchanges": summary.get("exchanges"),
        "record_failures": summary.get("record_failures"),
        "lines": lines,
        "head": head,
        "interleaved": interleaved,
    }
    if summary.get("allowance") is not None:
        out.update(budget_stops=summary["budget_stops"], allowance=summary["allowance"])
    file_lines: int | None = 0
    file_head: str | None = None
    problem: dict[str, Any] | None = None
    if os.path.lexists(path):
        try:
            status = verify_log(path, wire_seed(metering["wire_name"]))
        except Refusal as exc:  # replaced by a folder, a FIFO, a dangling link
            file_lines, problem = None, {"kind": exc.code, "message": exc.message}
        else:
            file_lines, file_head = status.lines, (status.head if status.lines else None)
            problem = None if status.problem is None else status.problem.to_json()
    out.update(file_lines=file_lines, file_head=file_head, problem=problem)
    why: str | None = None
    if problem is not None:
        why = f"it does not verify: {problem['message']}"
    elif (file_lines, file_head) != (lines, head):
        why = (
            f"it holds {file_lines} line(s) ending in {str(file_head)[:16]}, "
            f"the proxy wrote {lines} ending in {str(head)[:16]}"
        )
    elif interleaved:
        why = f"{interleaved} of the proxy's appends found a line it had not written at the end of the log"
    return out, why
