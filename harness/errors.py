"""Refusals and exit codes: the contract every command keeps (DESIGN.md, Commands)."""

from __future__ import annotations

import os
from typing import Any, Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the thing checked failed (a verifier failed, an audit found a break)
EXIT_USAGE: Final = 2
EXIT_REFUSED: Final = 3
EXIT_INTERNAL: Final = 4

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "Refusal",
]


class Refusal(Exception):
    """A named, stable refusal of bad input or a forbidden action.

    Args:
        code: stable snake_case code, listed in the README.
        message: what was wrong, for a person.
        path: the file or folder involved, if any.
        details: extra JSON-safe fields reported beside the refusal.
    """

    def __init__(
        self,
        code: str,
        message: str,
        path: str | os.PathLike[str] | os.PathLike[bytes] | bytes | None = None,
        **details: Any,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.path = None if path is None else _path_text(path)
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """The refusal object printed under `--json`."""
        out: dict[str, Any] = {"ok": False, "refusal": self.code, "message": self.message}
        if self.path is not None:
            out["path"] = self.path
        out.update(self.details)
        return out


def _path_text(path: str | os.PathLike[str] | os.PathLike[bytes] | bytes) -> str:
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "backslashreplace")
    try:
        data = raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate outside the surrogateescape range, e.g. from JSON
        return raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return data.decode("utf-8", "backslashreplace")
