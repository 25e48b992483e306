"""Hash-derived orders: permutations are permutations, stable, independent across labels and seeds, balanced."""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.prereg.order import draw, permutation, unit
from tests.support.paths import REPO

ids = st.lists(st.text(min_size=1, max_size=12), max_size=30, unique=True)
seeds = st.integers(min_value=0, max_value=2**63)


def test_unit_is_the_top_53_bits_of_the_sha256_of_the_canonical_array() -> None:
    digest = hashlib.sha256(json.dumps([7, "a", 3], separators=(",", ":")).encode()).digest()
    assert unit(7, "a", 3) == (int.from_bytes(digest[:8], "big") >> 11) / 2**53


@given(seeds, st.lists(st.one_of(st.text(), st.integers()), max_size=4))
def test_unit_is_in_the_half_open_interval_and_deterministic(seed: int, parts: list[str | int]) -> None:
    value = unit(seed, *parts)
    assert 0.0 <= value < 1.0
    assert value == unit(seed, *parts)


def test_unit_is_roughly_uniform() -> None:
    values = [unit(20261130, "u", i) for i in range(4000)]
    assert abs(sum(values) / len(values) - 0.5) < 0.02
    deciles = Counter(int(v * 10) for v in values)
    assert all(330 < deciles[d] < 470 for d in range(10)), deciles


def test_unit_separates_string_and_integer_parts_and_refuses_bools() -> None:
    assert unit(1, "1") != unit(1, 1)
    with pytest.raises(TypeError):
        unit(1, True)
    with pytest.raises(TypeError):
        unit(True, "a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        unit(1, 1.5)  # type: ignore[arg-type]


@given(seeds, st.text(max_size=20), ids)
def test_every_permutation_is_a_permutation(seed: int, label: str, items: list[str]) -> None:
    out = permutation(seed, label, items)
    assert sorted(out) == sorted(items)
    assert len(out) == len(items)


@given(seeds, st.text(max_size=20), ids, st.data())
def test_permutation_does_not_depend_on_the_input_order(
    seed: int, label: str, items: list[str], data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(items))
    assert permutation(seed, label, shuffled) == permutation(seed, label, items)


def test_permutation_keys_on_the_canonical_triple() -> None:
    items = ["b", "a", "c", "d"]

    def key(item: str) -> str:
        return hashlib.sha256(json.dumps([5, "L", item], separators=(",", ":")).encode()).hexdigest()

    assert permutation(5, "L", items) == sorted(items, key=lambda i: (key(i), i))


def test_duplicates_are_kept_and_tie_broken_by_the_item() -> None:
    assert permutation(3, "x", ["a", "b", "a"]).count("a") == 2


def test_different_labels_and_seeds_give_different_orders_over_many_seeds() -> None:
    items = [f"item-{i}" for i in range(8)]  # 8! orders: a coincidence is ~1 in 40320
    same_label = sum(permutation(s, "items:A:x", items) == permutation(s, "items:A:y", items) for s in range(300))
    same_seed = sum(permutation(s, "L", items) == permutation(s + 1, "L", items) for s in range(300))
    assert same_label <= 2
    assert same_seed <= 2
    assert len({tuple(permutation(s, "L", items)) for s in range(300)}) >= 295


@pytest.mark.parametrize("k", [2, 3, 5])
def test_arm_orders_are_balanced_in_expectation(k: int) -> None:
    """Over many seeds each arm comes first ~1/k of the time, and each position is balanced too."""
    arms = [f"arm{j}" for j in range(k)]
    n = 3000
    for position in range(k):
        counts = Counter(permutation(seed, f"arms:A:cheap:item-{seed % 17}", arms)[position] for seed in range(n))
        expected = n / k
        chi2 = sum((counts[a] - expected) ** 2 / expected for a in arms)
        # df = k-1; 25 is far beyond the 99.99th percentile for df <= 4.
        assert chi2 < 25, (position, counts)


def test_arm_orders_vary_between_items_under_one_seed() -> None:
    arms = ["direct", "cot", "plan"]
    firsts = Counter(permutation(11, f"arms:A:cheap:item-{i}", arms)[0] for i in range(600))
    assert all(150 < firsts[a] < 250 for a in arms), firsts


@given(seeds, ids, st.data())
def test_draw_is_the_head_of_the_draw_permutation_of_the_sorted_ids(
    seed: int, items: list[str], data: st.DataObject
) -> None:
    n = data.draw(st.integers(min_value=0, max_value=len(items)))
    out = draw(seed, items, n)
    assert out == permutation(seed, "draw", sorted(items))[:n]
    assert out == draw(seed, list(reversed(items)), n)
    assert len(set(out)) == n and set(out) <= set(items)


@settings(max_examples=30)
@given(seeds, ids)
def test_a_smaller_draw_is_a_prefix_of_a_larger_one(seed: int, items: list[str]) -> None:
    full = draw(seed, items, len(items))
    for n in range(len(items) + 1):
        assert draw(seed, items, n) == full[:n]


def test_draw_refuses_more_than_there_is_and_repeated_ids() -> None:
    with pytest.raises(ValueError):
        draw(1, ["a", "b"], 3)
    with pytest.raises(ValueError):
        draw(1, ["a", "b"], -1)
    with pytest.raises(ValueError):
        draw(1, ["a", "a"], 1)


def test_no_random_module_in_the_plan_or_order_code() -> None:
    for name in ("order.py", "plan.py"):
        tree = ast.parse((REPO / "harness" / "prereg" / name).read_text(encoding="utf-8"))
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        } | {
            (node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        }
        assert not imported & {"random", "secrets", "numpy"}, (name, imported)
