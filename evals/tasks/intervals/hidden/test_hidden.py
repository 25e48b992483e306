import pytest

from intervals import merge


def test_chain_of_touching_intervals():
    assert merge([(3, 4), (1, 2), (2, 3)]) == [(1, 4)]


def test_point_interval_touching_an_end():
    assert merge([(5, 5), (1, 5)]) == [(1, 5)]
    assert merge([(1, 1), (1, 1)]) == [(1, 1)]


def test_adjacent_but_not_touching_stay_apart():
    assert merge([(1, 2), (3, 4)]) == [(1, 2), (3, 4)]


def test_contained_and_overlapping():
    assert merge([(1, 10), (2, 3), (9, 12)]) == [(1, 12)]


def test_negative_bounds_touching():
    assert merge([(-5, -2), (-2, 0)]) == [(-5, 0)]


def test_empty_and_single():
    assert merge([]) == []
    assert merge([(4, 7)]) == [(4, 7)]


def test_input_not_modified():
    given = [(3, 5), (1, 3)]
    merge(given)
    assert given == [(3, 5), (1, 3)]


def test_reversed_interval_is_rejected():
    with pytest.raises(ValueError):
        merge([(1, 2), (5, 4)])
