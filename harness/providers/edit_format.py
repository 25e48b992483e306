"""The whole-file edit format spoken between the llm-edit worker and a model.

The manual: docs/models.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["parse_files", "render_files"]

_BLOCK = re.compile(r"^<<<FILE (?P<path>[^\n]+)\n(?P<body>.*?)^>>>END$", re.MULTILINE | re.DOTALL)


def render_files(files: Mapping[str, str]) -> str:
    """Files as blocks, in path order; every body ends with a newline before the end marker."""
    parts = []
    for path in sorted(files):
        body = files[path]
        if body and not body.endswith("\n"):
            body += "\n"
        parts.append(f"<<<FILE {path}\n{body}>>>END\n")
    return "".join(parts)


def parse_files(text: str) -> dict[str, str]:
    """The files in a model's answer; a later block for the same path wins."""
    return {m.group("path").strip(): m.group("body") for m in _BLOCK.finditer(text)}
