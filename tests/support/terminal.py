"""A tiny terminal screen for the progress tests: what text written with \\r, \\n and cursor-up leaves on screen.

It keeps the lines written, handles carriage return, newline, `ESC [ n A` (cursor
up), `ESC [ 2 K` / `ESC [ K` (erase line) and plain characters; any other escape
sequence fails the test (the display must not use what this does not model).
"""

from __future__ import annotations

import re

ESCAPE = re.compile(r"\x1b\[(\d*)([A-Za-z])")


def screen(text: str) -> list[str]:
    """The screen's lines (trailing spaces and the final empty line dropped) after `text` is written."""
    rows: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = ESCAPE.match(text, i)
            assert m is not None, f"an escape sequence the screen does not know: {text[i:i + 8]!r}"
            n, op = int(m.group(1) or 1), m.group(2)
            if op == "A":
                row = max(row - n, 0)
            elif op == "K":
                assert m.group(1) in ("", "2"), f"erase-line mode {m.group(1)} is not modelled"
                rows[row] = [] if m.group(1) == "2" else rows[row][:col]
            else:
                raise AssertionError(f"an escape sequence the screen does not know: {m.group(0)!r}")
            i = m.end()
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            if row == len(rows):
                rows.append([])
        else:
            line = rows[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        i += 1
    out = ["".join(r).rstrip() for r in rows]
    while out and out[-1] == "":
        out.pop()
    return out
