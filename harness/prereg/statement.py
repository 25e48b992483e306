"""What a preregistration's PREREG.md states: its title, research question and hypotheses, by section.

The manual: docs/prereg.md (what PREREG.md holds) and docs/analysis.md (where the analysis shows it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Final

from harness.errors import Code, InputRefusal
from harness.evidence.jsonio import read_bytes

__all__ = ["HYPOTHESES_HEADINGS", "NOT_STATED", "QUESTION_HEADINGS", "PreregStatement", "parse_statement",
           "read_statement"]

QUESTION_HEADINGS: Final = ("question", "questions", "research question", "research questions")
"""Headings (any level from 2, case-insensitive, trailing punctuation ignored) whose section is the question."""
HYPOTHESES_HEADINGS: Final = ("hypotheses", "hypothesis", "research hypotheses", "research hypothesis")
"""Headings whose section holds the hypotheses."""
NOT_STATED: Final = "not stated"

_HEADING: Final = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCE: Final = re.compile(r"^(```|~~~)")
_MAX_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True)
class PreregStatement:
    """The sections of PREREG.md a reader of the analysis sees first.

    Attributes:
        path: the PREREG.md read (as given).
        title: the first level-1 heading, or None.
        question: the research question section's text (Markdown), or None when PREREG.md has none.
        hypotheses: the hypotheses section's text (Markdown), or None when PREREG.md has none.
    """

    path: str
    title: str | None
    question: str | None
    hypotheses: str | None


def _key(heading: str) -> str:
    return re.sub(r"[\s:.]+$", "", heading.strip()).strip("*_` ").lower()


def parse_statement(text: str, path: str = "PREREG.md") -> PreregStatement:
    """The title and the question and hypotheses sections of a PREREG.md text (no I/O).

    A section runs from its heading to the next heading of the same or a higher level;
    headings inside fenced code blocks are text. The first matching section of each kind counts.
    """
    title: str | None = None
    found: dict[str, str] = {}
    current: tuple[str, int] | None = None
    body: list[str] = []
    fenced = False

    def close() -> None:
        if current is not None and current[0] not in found:
            found[current[0]] = "\n".join(body).strip()

    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is None:
            if current is not None:
                body.append(line)
            continue
        level, heading = len(match.group(1)), match.group(2)
        if level == 1 and title is None:
            title = heading.strip()
        if current is not None and level > current[1]:
            body.append(line)  # a subsection belongs to its section
            continue
        close()
        key = _key(heading)
        kind = "question" if key in QUESTION_HEADINGS else "hypotheses" if key in HYPOTHESES_HEADINGS else None
        current, body = ((kind, level), []) if kind is not None and level >= 2 else (None, [])
    close()
    return PreregStatement(path, title, found.get("question") or None, found.get("hypotheses") or None)


def read_statement(folder: str | os.PathLike[str]) -> PreregStatement:
    """`parse_statement` of `<folder>/PREREG.md`.

    Raises:
        Refusal: `file_missing` (no PREREG.md), `invalid_utf8`, or `read_bytes`' refusals, naming the path.
    """
    path = os.path.join(os.fspath(folder), "PREREG.md")
    if not os.path.lexists(path):
        raise InputRefusal(Code.FILE_MISSING, "the preregistration has no PREREG.md (its question and "
                           "hypotheses are read from it)", path)
    raw = read_bytes(path, max_bytes=_MAX_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", path) from None
    return parse_statement(text, path)
