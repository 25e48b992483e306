"""What a `proctor` command prints: one JSON object (`--json`) or indented text, and its exit code.

A handler returns an `Outcome`: the JSON payload and the exit code the CLI
chose from the library's typed result.

The manual: docs/commands.md.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NamedTuple

from harness.errors import EXIT_FAILED, EXIT_OK

__all__ = ["Outcome", "human", "print_json", "text_table"]


class Outcome(NamedTuple):
    """A command's payload and its exit code (immutable; a NamedTuple keeps `proctor --help` fast)."""

    payload: dict[str, Any]
    exit_code: int

    @classmethod
    def of(cls, payload: dict[str, Any]) -> Outcome:
        """Exit 0 unless the payload says `"ok": false` (then 1: the thing checked failed)."""
        return cls(payload, EXIT_OK if payload.get("ok", True) else EXIT_FAILED)


def print_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, ensure_ascii=True) + "\n")


def human(obj: Any, indent: int = 0) -> list[str]:
    """The text form: keys in the payload's order, nested values indented."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (dict, list)) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(human(value, indent + 1))
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}")
    elif isinstance(obj, list):
        for value in obj:
            if isinstance(value, dict):
                sub = human(value, indent + 1)
                lines.append(f"{pad}- {sub[0].strip()}" if sub else f"{pad}-")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_scalar(value)}")
    return lines


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) and "\n" in value:
        return "\n    " + value.rstrip("\n").replace("\n", "\n    ")
    if value == [] or value == {}:
        return "(none)"
    return str(value)


def _rounded(value: Any, places: int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if places is None:
            return format(value, ".4g")
        if value != 0 and abs(value) < 0.5 * 10 ** -places:
            return format(value, ".1e")  # too small for the places: never shown as 0
        return format(value, f".{places}f")
    return str(value)


def text_table(rows: list[dict[str, Any]], columns: list[str], places: dict[str, int] | None = None) -> str:
    """Rows as aligned text for people: a header, a rule, numbers right-aligned and rounded to `places`
    (column -> decimals; other floats to 4 significant digits). Full precision stays in `--json`."""
    digits = places or {}
    cells = [[_rounded(row.get(c), digits.get(c)) for c in columns] for row in rows]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in columns]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(columns), "  ".join("-" * w for w in widths), *(line(r) for r in cells)])
