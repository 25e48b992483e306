"""Hand-built result frames and designs for the analysis tests."""

from __future__ import annotations

import copy
from typing import Any

import polars as pl

from harness.audit.frame import TOKEN_COLUMNS
from harness.prereg.design import Design, parse_design

SCHEMA: dict[str, Any] = {
    "study": pl.String, "stage": pl.String, "system": pl.String, "arm": pl.String, "item": pl.String,
    "repeat": pl.Int64, "run_id": pl.String, "passed": pl.Boolean, "cost_usd": pl.Float64,
    "latency_s": pl.Float64, **{name: pl.Int64 for name in TOKEN_COLUMNS}, "lane": pl.String,
}


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    defaults: dict[str, Any] = {"study": "t", "stage": "A", "arm": "direct", "repeat": 0, "cost_usd": 0.01,
                                "latency_s": 1.0, "lane": "0", **{name: 1 for name in TOKEN_COLUMNS}}
    out = [{**defaults, **row} for row in rows]
    for i, row in enumerate(out):
        row.setdefault("run_id", f"r{i}")
    return pl.DataFrame(out, schema=SCHEMA)


BASE_DESIGN: dict[str, Any] = {
    "study": {"id": "t", "seed": 1, "title": "analysis test"},
    "suite": {"name": "suite", "packet": "packet.jsonl", "packet_sha256": "0" * 64},
    "draw": {"items": 50},
    "systems": [{"slot": s, "provider": "sim", "model": s, "setting": "default", "pricing_key": s, "cap_usd": 1.0}
                for s in ("x", "y", "z")],
    "arms": [{"id": "direct", "template": "{prompt}"}, {"id": "cot", "template": "Think. {prompt}"}],
    "stages": [{"id": "A", "systems": ["x", "y", "z"], "arms": ["direct", "cot"], "items": 50, "repeats": 3},
               {"id": "B", "systems": ["x"], "arms": ["direct"], "items": 5, "repeats": 1}],
    "budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": 3.0, "ceiling_margin_usd": 0.1,
                "spend_before_usd": 0.0},
    "run": {"lanes_per_system": 1, "attempt_deadline_s": 10, "reruns": 0, "transport_retries": 0,
            "max_output_tokens": 10, "full_repeats": 2},
    "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                 "comparisons": [{"a": "x", "b": "y", "arm": "direct", "margin": 0.2, "expected_a": 0.6,
                                  "expected_b": 0.65, "correlation": 0.5}]},
}


def design(**analysis: Any) -> Design:
    doc = copy.deepcopy(BASE_DESIGN)
    doc["analysis"].update(analysis)
    return parse_design(doc, path="/nowhere/design.toml", sha256="0" * 64)
