"""The baseline tree recorded at init, read back and checked against the pin.

Shared by verify (what changed since init) and the evidence packet (the diff
a worker gets after a lane switch).

The manual: docs/gated-path.md.
"""

from __future__ import annotations

from harness.errors import Code, GateRefusal
from harness.evidence.jsonio import read_json
from harness.evidence.tree_entry import TreeEntry, manifest_from_json
from harness.gate.workspace import Gate

__all__ = ["baseline_entries"]


def baseline_entries(gate: Gate) -> dict[bytes, TreeEntry]:
    """The baseline tree recorded at init, checked against the pin."""
    loaded = read_json(gate.state.path("baseline.json"))
    if loaded.sha256 != gate.pin["baseline_manifest_sha256"]:
        raise GateRefusal(Code.STATE_TAMPERED, "the baseline manifest differs from the pin", gate.state.path("baseline.json"))
    return manifest_from_json(loaded.value["entries"])
