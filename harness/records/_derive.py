"""A record's `Shape` derived from its frozen dataclass, so its fields are declared once.

`shape_of` turns each field's annotation into a `harness.records._shape.Field`
(str, int, float, bool, `X | None`, `tuple[str, ...]`, `dict[...]`); `read`
checks a JSON object strictly against it and builds the dataclass (lists as
tuples); `write` gives the fields back as JSON in declaration order.

The manual: docs/records.md.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from harness.errors import Code
from harness.records._shape import BOOL, CHAIN_KEYS, INT, NUM, STR, Field, Fields, Shape

__all__ = ["read", "shape_of", "write"]

T = TypeVar("T")


def _field(hint: Any) -> Field:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        inner = _field(next(a for a in args if a is not type(None)))
        return Field(f"{inner.what} or null", lambda v: v is None or inner.ok(v))
    if origin is tuple:
        item = _field(args[0])
        return Field(f"a list, each {item.what}", lambda v: isinstance(v, list) and all(item.ok(x) for x in v))
    if origin is dict or hint is dict:
        return Field("an object", lambda v: isinstance(v, dict))
    simple = {str: STR, int: INT, float: NUM, bool: BOOL}
    if hint in simple:
        return simple[hint]
    raise TypeError(f"no JSON field for {hint!r}")


def shape_of(cls: type, rename: Mapping[str, str] | None = None) -> Shape:
    """JSON name -> Field for every field of the dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    names = rename or {}
    return {names.get(f.name, f.name): _field(hints[f.name]) for f in dataclasses.fields(cls)}


def read(
    cls: type[T],
    obj: Mapping[str, Any],
    *,
    code: Code,
    path: str | None,
    line: int | None = None,
    optional: frozenset[str] = frozenset(),
    rename: Mapping[str, str] | None = None,
    ignore: frozenset[str] = CHAIN_KEYS,
) -> T:
    """Build `cls` from `obj` strictly: exact keys, each of its type; an absent `optional` key is the
    field's default, or None."""
    names = rename or {}
    shape = shape_of(cls, names)
    checked = Fields(obj, line, path, code)
    checked.keys(frozenset(shape) - optional, ignore=ignore | (optional & set(obj)))
    checked.shape({k: f for k, f in shape.items() if k in obj})
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = names.get(f.name, f.name)
        if key not in obj and f.default is not dataclasses.MISSING:
            continue  # an absent optional field takes its declared default
        value = obj.get(key)
        values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def write(record: Any, rename: Mapping[str, str] | None = None, omit_none: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The dataclass's fields as JSON in declaration order (tuples as lists; `omit_none` left out when None)."""
    names = rename or {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is None and f.name in omit_none:
            continue
        out[names.get(f.name, f.name)] = list(value) if isinstance(value, tuple) else value
    return out
