"""Writing a suite folder byte-deterministically (the layout is described in `harness.evals.suite`).

The manual: docs/evals.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from harness.evals.suite import SUITE_SCHEMA, load_suite
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import canonical_line, sha256_hex

__all__ = ["jsonl_bytes", "manifest_bytes", "write_suite"]


def jsonl_bytes(records: Sequence[Mapping[str, Any]]) -> bytes:
    """Canonical JSON lines sorted by ``item`` (code-point order), each ending in a newline."""
    return b"".join(canonical_line(r) for r in sorted(records, key=lambda r: str(r["item"])))


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """SUITE.json as written: sorted keys, two-space indent, UTF-8, a final newline."""
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def write_suite(
    out: str | os.PathLike[str],
    *,
    suite: str,
    kind: str,
    version: int,
    source: Mapping[str, Any],
    packet: Sequence[Mapping[str, Any]],
    private: Sequence[Mapping[str, Any]],
    extra_private: Mapping[str, bytes] | None = None,
    build: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``packet.jsonl``, ``private/items.jsonl`` (and `extra_private` files) and ``SUITE.json``.

    `kind` is the suite's kind (`harness.evals.suite.SUITE_KINDS`); `build` (optional) the
    builder's parameters, recorded in the manifest so the suite can be rebuilt.

    The manifest is written last, so a crash part way leaves a suite whose
    seals do not match (refused on reading), never a half-new suite that
    passes. The folder is read back with `load_suite` before returning.

    Returns:
        What was written: the folder, item count and every file's sha256.
    """
    folder = os.fspath(out)
    os.makedirs(os.path.join(folder, "private"), exist_ok=True)
    packet_raw = jsonl_bytes(packet)
    private_raw = jsonl_bytes(private)
    files: dict[str, bytes] = {"packet.jsonl": packet_raw, "private/items.jsonl": private_raw}
    for name, data in sorted((extra_private or {}).items()):
        files[f"private/{name}"] = data
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        atomic_write(os.path.join(folder, name), data, mode=0o644)
    manifest: dict[str, Any] = {
        "schema": SUITE_SCHEMA,
        "suite": suite,
        "kind": kind,
        "version": version,
        "source": dict(source),
        "items": len(packet),
        "packet_sha256": sha256_hex(packet_raw),
        "private_sha256": sha256_hex(private_raw),
        "files": {name: sha256_hex(data) for name, data in files.items()},
    }
    if build is not None:
        manifest["build"] = dict(build)
    atomic_write(os.path.join(folder, "SUITE.json"), manifest_bytes(manifest), mode=0o644)
    load_suite(folder)
    return {
        "ok": True,
        "suite": suite,
        "out": folder,
        "items": len(packet),
        "packet_sha256": manifest["packet_sha256"],
        "private_sha256": manifest["private_sha256"],
        "files": manifest["files"],
    }
