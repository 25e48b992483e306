"""`harness.run.rules.booked_spend`: which system's spend each part of an attempt record adds to (docs/run.md,
"Cascade arms")."""

from __future__ import annotations

import math
from typing import Any

import pytest

from harness.run.rules import booked_spend

SYSTEMS = ("cheap", "strong")


def _cascade(cost: Any, steps: list[Any]) -> dict[str, Any]:
    return {"cost_usd": cost, "work": {"cascade": {"systems": ["cheap", "strong"], "steps": steps}}}


def test_a_cascade_books_each_step_to_its_own_system_and_the_parts_sum_to_the_attempt() -> None:
    record = _cascade(0.0067043, [{"system": "cheap", "cost_usd": 0.0001223}, {"system": "strong", "cost_usd": 0.006582}])
    parts = booked_spend(record, "cheap", 0.01, SYSTEMS)
    assert parts == [("cheap", 0.0001223), ("strong", 0.006582)]
    assert math.isclose(math.fsum(a for _, a in parts), record["cost_usd"])
    # one step (a passed gate): all the cell system's
    assert booked_spend(_cascade(0.5, [{"system": "cheap", "cost_usd": 0.5}]), "cheap", 0.01, SYSTEMS) == [("cheap", 0.5)]


@pytest.mark.parametrize("record", [
    {"cost_usd": 0.25},  # a completion, or a repo task of one system
    {"cost_usd": 0.25, "work": {"exchanges": 2}},
    _cascade(0.25, []),
    _cascade(0.25, [{"system": "cheap", "cost_usd": 0.05}, {"system": "other", "cost_usd": 0.2}]),  # not registered
    _cascade(0.25, [{"system": "cheap", "cost_usd": 0.05}, {"system": "strong", "cost_usd": None}]),
    _cascade(0.25, [{"system": "cheap", "cost_usd": 0.05}, {"system": "strong", "cost_usd": True}]),
    _cascade(0.25, [{"system": "cheap", "cost_usd": 0.05}, "strong"]),
    {"cost_usd": 0.25, "work": {"cascade": {"steps": "cheap"}}},
])
def test_anything_else_is_booked_whole_to_the_cell_s_system(record: dict[str, Any]) -> None:
    assert booked_spend(record, "cheap", 0.01, SYSTEMS) == [("cheap", 0.25)]


def test_an_unknown_cost_is_the_reserve_once_on_the_cell_s_system() -> None:
    record = _cascade("unknown", [{"system": "cheap", "cost_usd": 0.05}, {"system": "strong", "cost_usd": None}])
    assert booked_spend(record, "cheap", 0.01, SYSTEMS) == [("cheap", 0.01)]
    assert booked_spend({"cost_usd": "unknown"}, "strong", 0.02, SYSTEMS) == [("strong", 0.02)]
