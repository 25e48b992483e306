"""`proctor run`'s progress on stderr: a pure renderer of `RunProgress` and a small rate-limited writer.

On a terminal a block (a total line, then one line per system) is redrawn in place at
most a few times a second; elsewhere plain lines: a system's line when its state
changes, every line again every `every` seconds, and always a final block.
The manual: docs/running.md ("Progress").
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

from harness.run.summary import RunProgress, SystemProgress

__all__ = ["ProgressDisplay", "plain_lines", "render"]

UP = "\x1b[{n}A"
"""Cursor up n lines (after a carriage return: to the block's first column)."""
CLEAR = "\x1b[2K"
"""Erase the whole line the cursor is on."""


def _usd(x: float) -> str:
    return f"${x:.4f}"


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + ("~" if width > 0 else "")


def _total(p: RunProgress) -> str:
    return f"total {_usd(p.total_usd)} / ceiling ${p.ceiling_usd:g}{'  CROSSED' if p.crossed else ''}"


def _system(s: SystemProgress, pad: int) -> str:
    return (f"{s.system:<{pad}}  items {s.items_admitted}/{s.items}  standing {s.standing}/{s.cells}"
            f"  attempts {s.attempts}  {_usd(s.spend_usd)}/${s.cap_usd:g}  {s.state}")


def render(p: RunProgress, width: int = 100) -> list[str]:
    """The block: a total line, then one line per system (in the stage's order), each at most `width` long."""
    pad = max((len(s.system) for s in p.systems), default=0)
    lines = (f"{p.study}/{p.stage}  {_total(p)}", *(f"  {_system(s, pad)}" for s in p.systems))
    return [_fit(line, width) for line in lines]


def plain_lines(before: RunProgress | None, p: RunProgress) -> list[str]:
    """Lines for a log: each system whose state differs from `before` (all when None), then the total."""
    was = {} if before is None else {s.system: s.state for s in before.systems}
    pad = max((len(s.system) for s in p.systems), default=0)
    head = f"[{p.study}/{p.stage}]"
    changed = [f"{head} {_system(s, pad)}" for s in p.systems if was.get(s.system) != s.state]
    return [*changed, f"{head} {_total(p)}"] if changed else []


class ProgressDisplay:
    """The progress callback: redraws in place on a terminal, writes few plain lines elsewhere.

    `interval`: the least time between two terminal redraws; `every`: plain mode's period for
    writing every line again. `close()` draws the last progress received (idempotent).
    """

    def __init__(self, stream: TextIO, *, tty: bool | None = None, interval: float = 0.25, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.interval, self.every, self.clock = stream, interval, every, clock
        self.tty = (stream.isatty() and os.environ.get("TERM") != "dumb") if tty is None else tty
        self.latest: RunProgress | None = None
        self.shown: RunProgress | None = None  # what the screen or the log shows now
        self.drawn_lines = 0
        self.drawn_at = float("-inf")
        self.closed = False
        self.lock = threading.RLock()  # re-entrant: a second signal's exit may draw from a handler

    def __call__(self, p: RunProgress) -> None:
        with self.lock:
            if self.closed:
                return
            self.latest = p
            if self.clock() - self.drawn_at >= (self.interval if self.tty else self.every):
                self._draw(full=True)
            elif not self.tty:
                self._draw(full=False)

    def close(self) -> None:
        """The final redraw: the last progress on screen, or every line of it in the log."""
        if not self.lock.acquire(timeout=1.0):  # another thread stuck mid-write: the exit goes on without it
            return
        try:
            if not self.closed and self.latest is not None and (self.latest is not self.shown or not self.tty):
                self._draw(full=True)
            self.closed = True
        finally:
            self.lock.release()

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):  # not a real file (a test's StringIO), or no size known
            columns = 0
        return max(columns - 1, 20) if columns else 100

    def _draw(self, *, full: bool) -> None:
        p = self.latest
        assert p is not None
        if self.tty:
            lines = render(p, self._width())
            up = f"\r{UP.format(n=self.drawn_lines)}" if self.drawn_lines else "\r"
            self.stream.write(up + "".join(f"{CLEAR}{line}\n" for line in lines))
            self.drawn_lines = len(lines)
        else:
            lines = plain_lines(None if full else self.shown, p)
            if not lines:
                return
            self.stream.write("".join(f"{line}\n" for line in lines))
        self.stream.flush()
        self.shown = p
        if full:
            self.drawn_at = self.clock()
