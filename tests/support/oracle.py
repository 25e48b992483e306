"""Re-chaining a real stage's logs after a planted edit, so only the planted fault is wrong (the oracle tests)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.evidence.chain_read import seed_hash
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.meter.pricing import BUNDLED_PRICING
from harness.run import anchors as anchors_mod
from harness.run.layout import archive_name, log_seed
from tests.support.study import logs

Records = dict[str, list[dict[str, Any]]]


def strip(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in ("prev", "seed")}


def chain(seed: str, records: list[dict[str, Any]]) -> list[bytes]:
    """The chained lines (no newlines) of `records` under `seed`, as a `ChainedLog` writes them."""
    out: list[bytes] = []
    prev = seed_hash(seed)
    for i, r in enumerate(records):
        body = {**strip(r), "prev": prev, **({"seed": seed} if i == 0 else {})}
        line = canonical_bytes(body)
        out.append(line)
        prev = sha256_hex(line)
    return out


def rewrite(folder: Path, name: str, records: list[dict[str, Any]]) -> list[bytes]:
    """Write `records` as the stage's chained log `name` (the bytes `ChainedLog` writes, without fsync)."""
    lines = chain(log_seed("rt", "A", name), records)
    (folder / f"{name}.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def reanchor(folder: Path, prereg_dir: Path) -> None:
    """Retake every anchor (same times and reasons) over the logs as they now are."""
    old = logs(folder)["anchors"]
    names = ("attempts", "finals", "run", "admission", "host", "wire")
    paths = {n: (str(folder / f"{n}.jsonl"), log_seed("rt", "A", n)) for n in names}
    manifests = {"plan.jsonl": str(folder / "plan.jsonl"), "FROZEN.json": str(prereg_dir / "FROZEN.json"),
                 "pricing": str(BUNDLED_PRICING)}
    rewrite(folder, "anchors", [anchors_mod.anchor_record(a["at"], a["reason"], paths, manifests) for a in old])


def flip_verdict(folder: Path, final: dict[str, Any]) -> None:
    """Flip the verdict of `final`'s receipt and re-record its sha256 in `final`: every chain stays consistent."""
    path = folder / final["receipt"]
    body = json.loads(path.read_bytes())
    body["passed"] = not body["passed"]
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(data)
    final["receipt_sha256"] = sha256_hex(data)


def rebuild(folder: Path, p: Path, edit: Callable[[Records], None], *, anchors: bool = True) -> None:
    """Apply `edit` to every log's stripped records and re-chain them consistently.

    Attempt records carry `_line` (their line before the edit; None for an added one) so
    run events and finals pointing at them are re-pointed (line and sha256); finals are
    re-chained in order with their archives rewritten and `replaced` re-hashed; anchors
    are retaken unless `anchors` is False.
    """
    got = logs(folder)
    recs: Records = {n: [strip(r) for r in got[n]] for n in ("attempts", "finals", "run", "admission", "host")}
    for i, r in enumerate(recs["attempts"], start=1):
        r["_line"] = i
    edit(recs)
    old_sha = {i: sha256_hex(canonical_bytes(r)) for i, r in enumerate(got["attempts"], start=1)}
    lines = [r.pop("_line", None) for r in recs["attempts"]]
    written = rewrite(folder, "attempts", recs["attempts"])
    new_line = {old: new for new, old in enumerate(lines, start=1) if old is not None}
    new_sha = {old: sha256_hex(b) for old, b in zip(lines, written, strict=True) if old is not None}
    by_sha = {old_sha[o]: new_sha[o] for o in new_sha}
    for e in recs["run"]:
        if e.get("event") == "attempt" and e.get("attempts_line") in new_line:
            e["attempt_sha256"] = new_sha[e["attempts_line"]]
            e["attempts_line"] = new_line[e["attempts_line"]]
    for name in ("run", "admission", "host"):
        rewrite(folder, name, recs[name])
    shutil.rmtree(folder / "archive", ignore_errors=True)
    seed = log_seed("rt", "A", "finals")
    prev, out = seed_hash(seed), []
    earlier: dict[str, list[bytes]] = {}
    for f in recs["finals"]:
        if f.get("attempt_line") in new_line:
            f["attempt_sha256"] = by_sha.get(f["attempt_sha256"], f["attempt_sha256"])
            f["attempt_line"] = new_line[f["attempt_line"]]
        mine = earlier.setdefault(str(f.get("run_id")), [])
        for entry, raw in zip(f.get("replaced") or [], mine, strict=False):
            entry["attempt_sha256"] = by_sha.get(entry["attempt_sha256"], entry["attempt_sha256"])
            path = folder / archive_name(str(f["run_id"]), entry["rerun"])
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(raw + b"\n")
            entry["sha256"] = sha256_hex(raw + b"\n")
        line = canonical_bytes({**f, "prev": prev, **({"seed": seed} if not out else {})})
        out.append(line)
        mine.append(line)
        prev = sha256_hex(line)
    (folder / "finals.jsonl").write_bytes(b"".join(line + b"\n" for line in out))
    if anchors:
        reanchor(folder, p)
