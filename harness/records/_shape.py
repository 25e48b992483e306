"""A record's shape (JSON name -> what it must be), derived from its frozen dataclass, and strict reads.

Every record declares each field once, as a dataclass field: `shape_of` turns the
annotations into `Field`s (str, int, float, bool, `X | None`, tuples, dicts, nested
dataclasses); `Annotated[T, Field(...)]` states a check the type cannot (a value set,
a message of its own) and `Annotated[T, Key("class")]` a JSON name that is not the
attribute's. `shape_error` says what is wrong with an object (the oracle's messages),
`read`/`build`/`write` go between JSON and the dataclass, and `Fields` reads typed
values refusing with the caller's code and the line.

The manual: docs/records.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from harness.errors import Code, Refusal

__all__ = [
    "BOOL", "CHAIN_KEYS", "COST", "INT", "LIST", "NUM", "OPT_BOOL", "OPT_STR", "STR",
    "Field", "Fields", "Key", "Shape", "build", "is_int", "is_num", "keys_of", "kind_is", "one_of",
    "optional_keys", "read", "refusal", "shape_error", "shape_of", "values_of", "write",
]

T = TypeVar("T")

CHAIN_KEYS: Final = frozenset({"prev", "seed"})
"""The keys a chained log adds to every record (never a record's own field)."""
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Field:
    """What a JSON value must be: `what` names it in a message, `ok` tests it."""

    what: str
    ok: Callable[[Any], bool]


Shape = Mapping[str, Field]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


STR: Final = Field("a string", lambda v: isinstance(v, str))
OPT_STR: Final = Field("a string or null", lambda v: v is None or isinstance(v, str))
INT: Final = Field("an integer", is_int)
NUM: Final = Field("a finite number", is_num)
BOOL: Final = Field("true or false", lambda v: isinstance(v, bool))
OPT_BOOL: Final = Field("true, false or null", lambda v: v is None or isinstance(v, bool))
COST: Final = Field('a non-negative number or "unknown"', lambda v: v == "unknown" or (is_num(v) and v >= 0))
LIST: Final = Field("a list", lambda v: isinstance(v, list))
ANY: Final = Field("any value", lambda v: True)


def one_of(*values: str) -> Field:
    return Field(f"one of {', '.join(values)}", lambda v: v in values)


def kind_is(kind: str) -> Field:
    return Field(repr(kind), lambda v: v == kind)


def shape_error(rec: Any, shape: Shape) -> str | None:
    """What is wrong with `rec` under `shape` (the first missing or mistyped field), or None."""
    if not isinstance(rec, dict):
        return "not an object"
    for key, field in shape.items():
        if key not in rec:
            return f"no field {key!r}"
        if not field.ok(rec[key]):
            return f"{key} {rec[key]!r} is not {field.what}"
    return None


def _nested_error(rec: Any, shape: Shape, optional: frozenset[str]) -> str | None:
    """`shape_error` for a nested record: a field with a default may be absent, as at the top level."""
    if isinstance(rec, dict) and optional & set(shape) - set(rec):
        return shape_error(rec, {k: f for k, f in shape.items() if k in rec or k not in optional})
    return shape_error(rec, shape)


def values_of(shape: Shape | Field, what: str) -> Field:
    """An object whose every value is of `shape` (an object shape, or one field)."""
    def ok(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        if isinstance(shape, Field):
            return all(shape.ok(x) for x in v.values())
        return all(shape_error(x, shape) is None for x in v.values())

    return Field(what, ok)


@dataclass(frozen=True)
class Key:
    """A field's JSON name when it is not the attribute's: `cls: Annotated[str, Key("class")]`."""

    name: str


@dataclass(frozen=True)
class _Spec:
    attr: str
    key: str
    hint: Any
    field: Field
    optional: bool


def _specs(cls: type) -> tuple[_Spec, ...]:
    """Each field of the dataclass `cls`: its attribute, JSON name, type, check, and whether it has a default."""
    return _specs_of(cls)


@functools.cache
def _specs_of(cls: Any) -> tuple[_Spec, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        hint, extras = hints[f.name], []
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
        stated = next((x for x in extras if isinstance(x, Field)), None)
        key = next((x.name for x in extras if isinstance(x, Key)), f.name)
        optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append(_Spec(f.name, key, hint, stated or _field(hint), optional))
    return tuple(out)


def _non_null(hint: Any) -> Any:
    """`X` for `X | None` (the first type that is not None), else `hint`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _nested(hint: Any) -> bool:
    """Whether `hint` is a dataclass (a nested record, read and written as an object)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _braces(shape: Shape) -> str:
    return "{" + ", ".join(shape) + "}"


def _field(hint: Any) -> Field:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        inner = _field(_non_null(hint))
        return Field(f"{inner.what} or null", lambda v: v is None or inner.ok(v))
    if _nested(hint):
        shape, optional = shape_of(hint), optional_keys(hint)
        return Field(_braces(shape), lambda v: _nested_error(v, shape, optional) is None)
    if origin is tuple and _nested(args[0]):
        each, optional = shape_of(args[0]), optional_keys(args[0])
        return Field(f"a list of {_braces(each)}",
                     lambda v: isinstance(v, list) and all(_nested_error(x, each, optional) is None for x in v))
    if origin is tuple:
        item = _field(args[0])
        return Field(f"a list, each {item.what}", lambda v: isinstance(v, list) and all(item.ok(x) for x in v))
    if origin is list or hint is list:
        return LIST
    if origin is dict or hint is dict:
        return Field("an object", lambda v: isinstance(v, dict))
    simple = {str: STR, int: INT, float: NUM, bool: BOOL}
    if hint in simple:
        return simple[hint]
    raise TypeError(f"no JSON field for {hint!r}")


def shape_of(cls: type) -> Shape:
    """JSON name -> Field for every field of the dataclass `cls`, in declaration order."""
    return {s.key: s.field for s in _specs(cls)}


def keys_of(cls: type) -> dict[str, str]:
    """Attribute -> JSON name for every field of the dataclass `cls`."""
    return {s.attr: s.key for s in _specs(cls)}


def optional_keys(cls: type) -> frozenset[str]:
    """The JSON names of the fields of `cls` that have a default (a key that may be absent)."""
    return frozenset(s.key for s in _specs(cls) if s.optional)


def _value(hint: Any, value: Any) -> Any:
    hint = _non_null(hint)
    if value is None:
        return None
    if _nested(hint):
        return build(hint, value)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return tuple(build(item, x) if _nested(item) else x for x in value)
    return value


def build(cls: type[T], obj: Mapping[str, Any]) -> T:
    """`cls` from a JSON object already checked against its shape: lists as tuples, nested dataclasses
    built; an absent key takes the field's default, or None."""
    values = {}
    for s in _specs(cls):
        if s.key not in obj and s.optional:
            continue
        values[s.attr] = _value(s.hint, obj.get(s.key))
    return cls(**values)


def read(
    cls: type[T],
    obj: Mapping[str, Any],
    *,
    code: Code,
    path: str | None,
    line: int | None = None,
    optional: frozenset[str] = frozenset(),
    ignore: frozenset[str] = CHAIN_KEYS,
) -> T:
    """Build `cls` from `obj` strictly: exact keys, each of its type; a field with a default, or an
    `optional` key, may be absent (its default, or None)."""
    shape, optional = shape_of(cls), optional | optional_keys(cls)
    checked = Fields(obj, line, path, code)
    checked.keys(frozenset(shape) - optional, ignore=ignore | (optional & set(obj)))
    checked.shape({k: f for k, f in shape.items() if k in obj})
    return build(cls, obj)


_ATOMS: Final = frozenset({str, int, float, bool, type(None)})


def _json(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMS:  # most values: no dataclass or ABC check (a receipt's sandbox record has ~60 strings)
        return value
    if kind is list or kind is tuple:
        return [x if type(x) in _ATOMS else _json(x) for x in value]
    if kind is dict:
        return {k: v if type(v) in _ATOMS else _json(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return write(value)
    if isinstance(value, list | tuple):
        return [_json(x) for x in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


def write(record: Any, omit_none: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The dataclass's fields as JSON in declaration order, by JSON name (`omit_none` left out when None)."""
    out: dict[str, Any] = {}
    for s in _specs(type(record)):
        value = getattr(record, s.attr)
        if value is None and s.attr in omit_none:
            continue
        out[s.key] = _json(value)
    return out


def refusal(code: Code, message: str, path: str | None, line: int | None) -> Refusal:
    """A refusal naming the line (as "line N: ...") when there is one."""
    where = "" if line is None else f"line {line}: "
    return Refusal(code, where + message, path, **({} if line is None else {"line": line}))


class Fields:
    """Typed reads of one JSON object; a problem is `code` naming the line."""

    def __init__(self, obj: Mapping[str, Any], line: int | None, path: str | None, code: Code) -> None:
        self.obj, self.line, self.path, self.code = obj, line, path, code

    def bad(self, message: str, code: Code | None = None) -> Refusal:
        return refusal(code or self.code, message, self.path, self.line)

    def keys(self, required: frozenset[str], *, extra_ok: bool = False, ignore: frozenset[str] = frozenset()) -> None:
        keys = set(self.obj) - ignore
        missing, extra = sorted(required - keys), sorted(keys - required)
        if missing:
            raise self.bad(f"missing {', '.join(missing)}")
        if extra and not extra_ok:
            raise self.bad(f"unknown field {', '.join(extra)}")

    def shape(self, shape: Shape) -> None:
        """Every field of `shape` present with its type (else the `shape_error` message)."""
        bad = shape_error(self.obj, shape)
        if bad is not None:
            raise self.bad(bad)

    def string(self, key: str, *, nullable: bool = False, empty_ok: bool = True) -> str | None:
        value = self.obj[key]
        if value is None and nullable:
            return None
        if not isinstance(value, str) or (not empty_ok and not value):
            kind = "a string" if empty_ok else "a non-empty string"
            raise self.bad(f"{key} must be {kind}{' or null' if nullable else ''}")
        return value

    def text(self, key: str) -> str:
        value = self.string(key, empty_ok=False)
        assert value is not None
        return value

    def integer(self, key: str, *, minimum: int, nullable: bool = False) -> int | None:
        value = self.obj[key]
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.bad(f"{key} must be an integer >= {minimum}{' or null' if nullable else ''}")
        return value

    def count(self, key: str, *, minimum: int = 0) -> int:
        value = self.integer(key, minimum=minimum)
        assert value is not None
        return value

    def number(self, key: str) -> float:
        value = self.obj[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(f"{key} must be a number")
        if not math.isfinite(value) or value < 0:
            raise self.bad(f"{key} must be finite and not negative")
        return float(value)

    def sha(self, key: str, *, nullable: bool = False) -> str | None:
        value = self.obj[key]
        if value is None and nullable:
            return None
        if not isinstance(value, str) or _HEX64.fullmatch(value) is None:
            raise self.bad(f"{key} must be a lowercase sha256 hex digest")
        return value

    def utf8(self, key: str, value: str) -> bytes:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise self.bad(f"{key} holds a lone surrogate and has no UTF-8 bytes") from None
