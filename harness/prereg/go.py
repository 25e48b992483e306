"""The go: a dated, chained authorization to run one stage of the current freeze (GO.jsonl).

`proctor prereg go DIR --stage S --by NAME [--note TEXT]` shows the stage's budget and appends a
go; the runner refuses `go_required` before its first call to a paid provider when the stage has
no go for the freeze it runs under (`needs_go` is the rule). GO.jsonl is not part of the freeze.
The manual: docs/prereg.md ("The go").
"""

from __future__ import annotations

import ipaddress
import math
import os
import stat
import urllib.parse
from collections.abc import Iterable
from typing import Any, Final

from harness.errors import Code, PreregRefusal, Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.evidence.clock import Clock, utc_iso
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.prereg.check import budget_of
from harness.prereg.folder import GO_NAME, locked, open_folder
from harness.prereg.frozen import FrozenPrereg, check_frozen, epoch
from harness.prereg.plan import FULL_STAGE, MATRIX_STAGE
from harness.providers.catalog import CatalogModel
from harness.records.go import Go

__all__ = ["FREE_PROVIDERS", "LOCAL_PROVIDERS", "give_go", "go_for", "go_problem", "go_seed", "needs_go", "read_gos"]

FREE_PROVIDERS: Final = ("sim", "simulator")
"""Catalog providers that never cost money: the simulator."""
LOCAL_PROVIDERS: Final = ("llama-cpp",)
"""Catalog providers of a model on this machine (`proctor local-model`): free at a loopback base URL."""


def go_seed(study: str) -> str:
    """The seed of a study's go log (it names the study, so logs cannot be swapped)."""
    return f"proctor-go:{study}"


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def needs_go(model: CatalogModel, base_url: str) -> bool:
    """Whether calling `model` at `base_url` needs a go: every provider but the simulator and a local model.

    The simulator is a catalog entry whose provider is `sim` or `simulator` (wherever it listens);
    a local model is one whose provider is `llama-cpp` and whose base URL is a loopback address.
    """
    provider = model.provider.lower()
    if provider in FREE_PROVIDERS:
        return False
    return not (provider in LOCAL_PROVIDERS and _loopback(base_url))


def _parse(record: dict[str, Any], index: int, path: str) -> tuple[Go, str]:
    """One log line as a go and its line's sha256 (the lines are canonical, so it is recomputed)."""
    go = Go.from_json(record, path=path, line=index)

    def bad(message: str) -> Refusal:
        return PreregRefusal(Code.GO_INVALID, f"line {index}: {message}", path, line=index)

    if go.number != index:
        raise bad(f"go must be {index} (numbered 1, 2, ... in order)")
    if epoch(go.at) is None:
        raise bad("at must be an ISO-8601 UTC time")
    if not all(v.strip() for v in (go.stage, go.by, go.frozen_sha256)):
        raise bad("stage, by and frozen_sha256 must be non-empty")
    return go, sha256_hex(canonical_bytes(record))


def read_gos(folder: str, study: str) -> list[Go]:
    """Every go of the folder's GO.jsonl, in order (none when there is no log)."""
    path = os.path.join(folder, GO_NAME)
    if not os.path.lexists(path):
        return []
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise PreregRefusal(Code.GO_INVALID, "GO.jsonl must be a regular file, not a link or anything else", path)
    gos = [_parse(r, i, path)[0] for i, r in enumerate(read_log(path, go_seed(study)), 1)]
    last = 0.0
    for g in gos:
        at = epoch(g.at) or 0.0
        if at < last:
            raise PreregRefusal(Code.GO_INVALID, f"line {g.number}: dated before the go above it", path, line=g.number)
        last = at
    return gos


def go_for(gos: Iterable[Go], stage: str, frozen_sha256: str) -> Go | None:
    """The latest go for `stage` under the freeze `frozen_sha256`, or None."""
    found = [g for g in gos if g.stage == stage and g.frozen_sha256 == frozen_sha256]
    return found[-1] if found else None


def _budget(frozen: FrozenPrereg, stage: str) -> tuple[float, dict[str, float]]:
    d = frozen.design
    slots = tuple(s.slot for s in d.systems) if stage in (MATRIX_STAGE, FULL_STAGE) else d.stage(stage).systems
    return d.budgets.ceiling_usd, {s: d.system(s).cap_usd for s in slots}


def give_go(path: str | os.PathLike[str], stage: str, by: str, note: str | None = None,
            show: Any = None) -> dict[str, Any]:
    """`proctor prereg go DIR --stage S --by NAME [--note TEXT]`: record a go for one stage of the current freeze.

    `show`, when given, is called with the stage's budget (caps and ceiling) before the go is written.
    """
    folder = open_folder(path)
    if not isinstance(by, str) or not by.strip():
        raise PreregRefusal(Code.GO_BY_EMPTY, "a go names who gives it (--by NAME)", folder)
    if note is not None and not note.strip():
        note = None
    frozen = check_frozen(folder)  # refuses an unfrozen or changed preregistration
    ceiling, caps = _budget(frozen, stage)  # refuses an unknown stage
    budget: dict[str, Any] = {"stage": stage, "caps_usd": caps, "ceiling_usd": ceiling,
                              "spend_before_usd": frozen.design.budgets.spend_before_usd}
    rows = {s["slot"]: next((r for r in s["stages"] if r["stage"] == stage), None)
            for s in budget_of(frozen.design, [])["systems"] if s["slot"] in caps}
    if all(r is not None for r in rows.values()):  # a registered stage: its expected and worst case (`prereg check`)
        budget["expected_usd"] = {slot: r["reserve_usd"] for slot, r in rows.items() if r is not None}
        budget["worst_usd"] = {slot: r["worst_usd"] for slot, r in rows.items() if r is not None}
        budget["worst_total_usd"] = math.fsum(budget["worst_usd"].values())
    if show is not None:
        show(budget)
    log_path = os.path.join(folder, GO_NAME)
    with locked(folder, exclusive=True):
        gos = read_gos(folder, frozen.design.study_id)
        floor = max([epoch(frozen.frozen_at) or 0.0] + [epoch(g.at) or 0.0 for g in gos])
        record = Go(len(gos) + 1, utc_iso(Clock(floor).now()), stage, by.strip(), note, frozen.frozen_sha256,
                    ceiling, caps)
        line = ChainedLog(log_path, go_seed(frozen.design.study_id)).append(record.to_json())
        record, line_sha256 = _parse(line, record.number, log_path)
    return {"ok": True, "study": frozen.design.study_id, "path": folder, "budget": budget,
            "go": {**record.to_json(), "line_sha256": line_sha256}}


def go_problem(frozen: FrozenPrereg, stage: str, models: dict[str, CatalogModel],
               base_urls: dict[str, str]) -> tuple[str, list[str]] | None:
    """Why the stage may not call its providers yet (a message and the paid systems), or None when it may.

    Only systems that `needs_go` count; the go must name the stage and the freeze it runs under.
    """
    paid = sorted(slot for slot, model in models.items() if needs_go(model, base_urls.get(slot, "")))
    if not paid:
        return None
    with locked(frozen.path, exclusive=False):
        gos = read_gos(frozen.path, frozen.design.study_id)
    if go_for(gos, stage, frozen.frozen_sha256) is not None:
        return None
    return (f"stage {stage!r} calls paid providers (systems {', '.join(paid)}) and has no go for the current freeze "
            f"(FROZEN.json {frozen.frozen_sha256[:12]}): run `proctor prereg go {frozen.path} --stage {stage} "
            "--by NAME` after reading its budget", paid)
