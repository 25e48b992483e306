"""Money: strict cost parsing and exact sums (docs/design.md, "Reading saved inputs")."""

from __future__ import annotations

import math
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.jsonio import loads_strict
from harness.evidence.money import RunningSum, parse_cost, sum_costs

# --------------------------------------------------------------------------- parse_cost


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0.0),
        (1, 1.0),
        (10**6, 1e6),
        (0.0, 0.0),
        (0.01, 0.01),
        (1.5, 1.5),
        (5e-324, 5e-324),
        (sys.float_info.max, sys.float_info.max),
        (10**300, 1e300),
    ],
)
def test_parse_cost_accepts(value: Any, expected: float) -> None:
    got = parse_cost(value)
    assert type(got) is float
    assert got == expected


def test_parse_cost_negative_zero_is_zero() -> None:
    assert parse_cost(-0.0) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        "1",
        "0.5",
        "",
        None,
        [],
        [1],
        {},
        {"usd": 1},
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        -0.01,
        -1,
        -5e-324,
        10**400,
        -(10**400),
        Decimal("1"),
        Fraction(1, 2),
        1j,
        b"1",
    ],
)
def test_parse_cost_refuses(value: Any) -> None:
    with pytest.raises(Refusal) as info:
        parse_cost(value, field="usage.cost", path="attempt.json")
    assert info.value.code == "invalid_cost"
    assert "usage.cost" in info.value.message
    assert info.value.path == "attempt.json"


def test_parse_cost_refusal_path_optional(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as info:
        parse_cost(None)
    assert info.value.path is None
    assert "cost" in info.value.message
    with pytest.raises(Refusal) as info:
        parse_cost(None, path=tmp_path / "x.json")
    assert info.value.path == str(tmp_path / "x.json")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (b'{"cost": 0.25}', True),
        (b'{"cost": 3}', True),
        (b'{"cost": true}', False),
        (b'{"cost": "0.25"}', False),
        (b'{"cost": null}', False),
        (b'{"cost": -1}', False),
        (b'{"cost": 1' + b"0" * 400 + b"}", False),  # a valid JSON integer, too large for a float
    ],
)
def test_parse_cost_on_decoded_json(text: bytes, ok: bool) -> None:
    value = loads_strict(text)["cost"]
    if ok:
        assert parse_cost(value) == float(value)
    else:
        with pytest.raises(Refusal):
            parse_cost(value)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, allow_nan=False, allow_infinity=False))
def test_parse_cost_identity_on_valid_floats(x: float) -> None:
    assert parse_cost(x) == x


@settings(max_examples=200, deadline=None)
@given(st.floats(max_value=-5e-324, allow_nan=False))
def test_parse_cost_refuses_negative_floats(x: float) -> None:
    with pytest.raises(Refusal):
        parse_cost(x)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**308))
def test_parse_cost_accepts_ints_in_float_range(n: int) -> None:
    assert parse_cost(n) == float(n)


# --------------------------------------------------------------------------- sum_costs


def test_sum_costs_is_exact() -> None:
    assert sum([0.1] * 10) != 1.0  # the naive sum drifts
    assert sum_costs([0.1] * 10) == 1.0
    assert sum_costs([0.01] * 100) == 1.0
    assert sum_costs([1e16, 1.0, 1.0]) == 1e16 + 2.0
    assert sum_costs([]) == 0.0


def test_sum_costs_accepts_any_iterable() -> None:
    assert sum_costs(x for x in [0.25, 0.5, 0.25]) == 1.0
    assert sum_costs((1, 2, 3)) == 6.0


_costs = st.floats(min_value=0, max_value=1e300, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(_costs, max_size=60))
def test_sum_costs_is_fsum_and_correctly_rounded(xs: list[float]) -> None:
    total = sum_costs(xs)
    assert total == math.fsum(xs)
    assert total == float(sum(map(Fraction, xs), Fraction(0)))


_cents = st.integers(min_value=0, max_value=10**9).map(lambda c: c / 100)


@settings(max_examples=200, deadline=None)
@given(st.lists(_cents, max_size=300))
def test_many_small_costs_sum_exactly(xs: list[float]) -> None:
    assert sum_costs(xs) == float(sum(map(Fraction, xs), Fraction(0)))


@pytest.mark.parametrize(
    "values",
    [
        [1e308, 1e308],
        [sys.float_info.max, sys.float_info.max],
        [sys.float_info.max] * 3,
        [math.inf],
        [1.0, math.inf],
        [math.inf, math.inf],
        [math.inf, -math.inf],  # not costs, but must still be a refusal, not ValueError
        [math.nan],
    ],
)
def test_sum_costs_overflow_refused(values: list[float]) -> None:
    with pytest.raises(Refusal) as info:
        sum_costs(values, path="results/attempts.jsonl")
    assert info.value.code == "cost_overflow"
    assert info.value.path == "results/attempts.jsonl"


def test_sum_costs_near_the_top_is_fine() -> None:
    assert sum_costs([sys.float_info.max, 0.0]) == sys.float_info.max
    assert sum_costs([sys.float_info.max / 2, sys.float_info.max / 2]) == sys.float_info.max


# --------------------------------------------------------------------------- RunningSum


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=0, max_value=1e6), st.floats(min_value=0, max_value=1e-3),
                          st.sampled_from([0.0, 0.01, 0.1, 1e-300, 5e-324, 1e16, 1.0 / 3])), max_size=60),
       st.floats(min_value=0, max_value=1e3))
def test_running_sum_equals_sum_costs_after_every_value(xs: list[float], before: float) -> None:
    running = RunningSum([before])
    for i, x in enumerate(xs):
        running.add(x)
        assert running.value() == sum_costs([before, *xs[: i + 1]])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300), max_size=40))
def test_running_sum_is_exact_with_mixed_signs(xs: list[float]) -> None:
    running = RunningSum()
    for i, x in enumerate(xs):
        running.add(x)
        assert running.value() == sum_costs(xs[: i + 1])
    assert running.values == xs


def test_running_sum_overflow_refused_as_sum_costs() -> None:
    running = RunningSum([sys.float_info.max])
    assert running.value() == sys.float_info.max
    running.add(sys.float_info.max)
    with pytest.raises(Refusal) as got:
        running.value()
    with pytest.raises(Refusal) as want:
        sum_costs([sys.float_info.max, sys.float_info.max])
    assert got.value.code == want.value.code


def test_running_sum_of_nothing_is_zero() -> None:
    assert RunningSum().value() == 0.0 == sum_costs([])
