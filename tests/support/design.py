"""A tiny valid preregistration for the design, freeze and plan tests, and enough TOML to write one."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def _is_array_of_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def toml_dumps(doc: dict[str, Any], prefix: str = "") -> str:
    """Enough TOML for a design: plain keys first, then tables and arrays of tables."""
    lines = [f"{k} = {toml_value(v)}" for k, v in doc.items()
             if not isinstance(v, dict) and not _is_array_of_tables(v)]
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            lines += ["", f"[{name}]", toml_dumps(value, name + ".")]
        elif _is_array_of_tables(value):
            for table in value:
                lines += ["", f"[[{name}]]", toml_dumps(table, name + ".")]
    return "\n".join(line for line in lines if line is not None) + ("\n" if not prefix else "")


PACKET_ITEMS = 8


def packet_bytes(count: int = PACKET_ITEMS) -> bytes:
    lines = [
        json.dumps({"item": f"tiny/{i}", "prompt": f"def f{i}():\n    \"\"\"Return {i}.\"\"\"\n",
                    "entry_point": f"f{i}", "metadata": {"index": i}}, sort_keys=True, separators=(",", ":"))
        for i in range(count)
    ]
    return ("\n".join(lines) + "\n").encode()


def base_design(packet_sha256: str) -> dict[str, Any]:
    return {
        "study": {"id": "tiny", "seed": 7, "title": "A tiny study"},
        "suite": {"name": "tiny", "packet": "../../evals/tiny/packet.jsonl", "packet_sha256": packet_sha256},
        "draw": {"items": 6},
        "systems": [
            {"slot": "cheap", "provider": "sim", "model": "sim-flash", "setting": "default",
             "pricing_key": "sim-flash", "cap_usd": 1.0},
            {"slot": "strong", "provider": "sim", "model": "sim-k3", "setting": "high",
             "pricing_key": "sim-k3", "cap_usd": 2.0},
        ],
        "arms": [
            {"id": "direct", "template": "{prompt}", "temperature": 0.0},
            {"id": "think", "template": "Think first.\n\n{prompt}"},
        ],
        "stages": [
            {"id": "A", "systems": ["cheap", "strong"], "arms": ["direct"], "items": 4, "repeats": 1},
            {"id": "B", "systems": ["cheap", "strong"], "arms": ["direct", "think"], "items": 6, "repeats": 2},
        ],
        "budgets": {"reserve_per_item_usd": 0.05, "overall_cap_usd": 5.0, "ceiling_margin_usd": 0.5,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 2, "attempt_deadline_s": 120, "reruns": 2, "transport_retries": 3,
                "max_output_tokens": 1024, "full_repeats": 3},
        "analysis": {
            "alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
            "comparisons": [{"a": "cheap", "b": "strong", "arm": "direct", "margin": 0.1,
                             "expected_a": 0.6, "expected_b": 0.65, "correlation": 0.5}],
        },
    }


def manifest(design: dict[str, Any]) -> dict[str, Any]:
    return {"study": design["study"]["id"],
            "systems": [{k: s[k] for k in ("slot", "provider", "model", "setting")} for s in design["systems"]]}


def write_design(folder: Path, design: dict[str, Any], prereg_text: str | None = None) -> None:
    """A preregistration folder's design.toml and systems.json from `design` (and PREREG.md when given)."""
    (folder / "design.toml").write_text(toml_dumps(design))
    (folder / "systems.json").write_text(json.dumps(manifest(design)))
    if prereg_text is not None:
        (folder / "PREREG.md").write_text(prereg_text)


def write_prereg(
    root: Path,
    mutate: Callable[[dict[str, Any]], None] | None = None,
    *,
    systems: dict[str, Any] | None = None,
    packet_items: int = PACKET_ITEMS,
) -> Path:
    """`root/prereg/tiny/` with design.toml, PREREG.md, systems.json; the packet under `root/evals/tiny/`."""
    packet = root / "evals" / "tiny" / "packet.jsonl"
    packet.parent.mkdir(parents=True, exist_ok=True)
    packet.write_bytes(packet_bytes(packet_items))
    design = base_design(hashlib.sha256(packet.read_bytes()).hexdigest())
    if mutate is not None:
        mutate(design)
    folder = root / "prereg" / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "design.toml").write_text(toml_dumps(design), encoding="utf-8")
    (folder / "PREREG.md").write_text("# A tiny study\n\nWe register this before running it.\n", encoding="utf-8")
    body = systems if systems is not None else manifest(base_design("0" * 64))
    (folder / "systems.json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return folder
