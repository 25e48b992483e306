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

__all__ = ["Outcome", "human", "print_json"]


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
