"""Strict reading of one JSON object into typed fields (shared by the gate's record types).

`Fields(obj, code, path)` checks the exact key set and each value's type,
refusing with the record's own refusal code; it never coerces.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from harness.errors import Refusal

__all__ = ["Fields"]


class Fields:
    """Typed access to one JSON object's fields; any surprise is a refusal with `code`."""

    def __init__(self, obj: object, code: str, path: str | None, what: str) -> None:
        if not isinstance(obj, Mapping):
            raise Refusal(code, f"{what}: not a JSON object", path)
        self.obj: Mapping[str, Any] = obj
        self.code, self.path, self.what = code, path, what

    def keys(self, required: Collection[str], optional: Collection[str] = ()) -> None:
        """Refuse a missing required key or a key that is neither required nor optional."""
        missing = sorted(set(required) - set(self.obj))
        unknown = sorted(set(self.obj) - set(required) - set(optional))
        if missing or unknown:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(unknown)}"] if unknown else []
            )
            raise Refusal(self.code, f"{self.what}: {'; '.join(parts)}", self.path)

    def bad(self, key: str, want: str) -> Refusal:
        return Refusal(self.code, f"{self.what}: {key} must be {want}", self.path)

    def text(self, key: str) -> str:
        value = self.obj.get(key)
        if not isinstance(value, str):
            raise self.bad(key, "a string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.obj.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, "a string or null")
        return value

    def flag(self, key: str) -> bool:
        value = self.obj.get(key)
        if not isinstance(value, bool):
            raise self.bad(key, "true or false")
        return value

    def integer(self, key: str) -> int:
        value = self.obj.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.bad(key, "an integer")
        return value

    def opt_integer(self, key: str) -> int | None:
        value = self.obj.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self.bad(key, "an integer or null")
        return value

    def number(self, key: str) -> float:
        value = self.obj.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.bad(key, "a number")
        return value

    def opt_number(self, key: str) -> float | None:
        value = self.obj.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise self.bad(key, "a number or null")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.obj.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.bad(key, "a list of strings")
        return tuple(value)

    def integers(self, key: str) -> tuple[int, ...]:
        value = self.obj.get(key)
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.bad(key, "a list of integers")
        return tuple(value)

    def obj_or_none(self, key: str) -> dict[str, Any] | None:
        value = self.obj.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.bad(key, "an object or null")
        return value

    def object(self, key: str) -> dict[str, Any]:
        value = self.obj.get(key)
        if not isinstance(value, dict):
            raise self.bad(key, "an object")
        return value
