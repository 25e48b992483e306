"""Field checks shared by every record: a declared shape (JSON name -> what it must be) and strict reads.

A record module declares its fields once as a `Shape`; `shape_error` says what is
wrong with an object (the oracle's "malformed record" messages), and `Fields` reads
typed values, refusing with the caller's code and the line.

The manual: docs/records.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, Refusal

__all__ = [
    "BOOL", "CHAIN_KEYS", "COST", "INT", "LIST", "NUM", "OPT_BOOL", "OPT_STR", "STR",
    "Field", "Fields", "Shape", "each", "is_int", "is_num", "kind_is", "object_of", "one_of",
    "refusal", "shape_error", "values_of",
]

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


def each(shape: Shape, what: str) -> Field:
    """A list of objects of `shape`."""
    return Field(what, lambda v: isinstance(v, list) and all(shape_error(x, shape) is None for x in v))


def object_of(shape: Shape, what: str) -> Field:
    return Field(what, lambda v: shape_error(v, shape) is None)


def values_of(shape: Shape | Field, what: str) -> Field:
    """An object whose every value is of `shape` (an object shape, or one field)."""
    def ok(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        if isinstance(shape, Field):
            return all(shape.ok(x) for x in v.values())
        return all(shape_error(x, shape) is None for x in v.values())

    return Field(what, ok)


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

    def values(self, shape: Shape) -> dict[str, Any]:
        """The fields of `shape` but `kind`, once every one is present with its type (`shape`)."""
        self.shape(shape)
        return {k: self.obj[k] for k in shape if k != "kind"}

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
