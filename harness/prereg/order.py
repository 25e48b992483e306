"""Orders derived from hashes of the seed: draws, permutations and unit numbers.

The manual: docs/prereg.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from harness.evidence.jsonio import canonical_bytes

__all__ = ["draw", "permutation", "unit"]

_BITS = 53
"""As many bits as a float's mantissa holds, so every value of `unit` is exact."""


def _digest(seed: int, parts: Iterable[str | int]) -> bytes:
    values: list[str | int] = [_check_seed(seed)]
    for part in parts:
        # bool is an int to Python but `true` to JSON: refused, so a flag cannot pass for 1.
        if isinstance(part, bool) or not isinstance(part, (str, int)):
            raise TypeError(f"an order part must be a str or an int, not {type(part).__name__}")
        values.append(part)
    return hashlib.sha256(canonical_bytes(values)).digest()


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"a seed must be an int, not {type(seed).__name__}")
    return seed


def unit(seed: int, *parts: str | int) -> float:
    """A number in [0, 1) determined by `seed` and `parts` (53 bits of their sha256)."""
    top = int.from_bytes(_digest(seed, parts)[:8], "big") >> (64 - _BITS)
    return top / (1 << _BITS)


def permutation(seed: int, label: str, items: Sequence[str]) -> list[str]:
    """`items` in the order of sha256(canonical `[seed, label, item]`), ties broken by the item.

    Args:
        seed: the study's seed.
        label: what the order is for (e.g. `items:A:cheap`); different labels
            give independent orders from one seed.
        items: the things to order; their input order does not matter.
    """
    if not isinstance(label, str):
        raise TypeError(f"a label must be a str, not {type(label).__name__}")
    keyed = [(_digest(seed, (label, item)), item) for item in items]
    keyed.sort()
    return [item for _, item in keyed]


def draw(seed: int, item_ids: Iterable[str], n: int) -> list[str]:
    """The first `n` of `permutation(seed, "draw", sorted(item_ids))`.

    Raises:
        ValueError: `n` is negative or larger than the number of ids, or an id repeats.
    """
    ids = sorted(item_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("item ids repeat")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > len(ids):
        raise ValueError(f"cannot draw {n!r} of {len(ids)} items")
    return permutation(seed, "draw", ids)[:n]
