"""Python source parsed to an AST, one parse at a time per process.

CPython 3.11's `ast.parse` is not safe to run in two threads at once (its AST conversion keeps a
per-interpreter recursion depth: "SystemError: AST constructor recursion depth mismatch"); the runner's
concurrent repository-task attempts parse in threads (the gate's scan and results, the mutants' tasks).
The manual: docs/evidence.md.
"""

from __future__ import annotations

import ast
import threading
from typing import Final

__all__ = ["parse_python"]

_ONE_PARSE: Final = threading.Lock()


def parse_python(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, under a process-wide lock."""
    with _ONE_PARSE:
        return ast.parse(source, filename=filename)
