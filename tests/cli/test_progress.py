"""The progress display of `proctor run` (harness/cli/progress.py) on real `RunProgress` values.

The renderer is pure: one total line and one line per system, never wider than asked.
The writer is driven by an injected clock (no timing here): on a terminal it redraws in
place at most once per interval and always once at the end; on a log it writes a
system's line only when its state changes, everything every `every` seconds, and a final block.
The real process under a pseudo-terminal and a pipe: tests/e2e/test_run_progress.py.
"""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli.progress import ProgressDisplay, plain_lines, render
from harness.run.summary import RunProgress, SystemProgress
from tests.support.terminal import screen

STATES = ("running", "paused", "stopped", "refused", "done", "preflight")
NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,40}", fullmatch=True)
COUNT = st.integers(0, 10**6)
USD = st.floats(0, 10**6, allow_nan=False)


@st.composite
def progress(draw: st.DrawFn) -> RunProgress:
    names = draw(st.lists(NAMES, min_size=0, max_size=12, unique=True))
    systems = tuple(
        SystemProgress(name, draw(COUNT), draw(COUNT), draw(COUNT), draw(COUNT), draw(COUNT), draw(USD), draw(USD),
                       draw(st.sampled_from(STATES)), items_admitted_now=draw(COUNT), items=draw(COUNT))
        for name in names)
    return RunProgress(draw(NAMES), draw(NAMES), draw(USD), draw(USD), draw(st.booleans()), systems)


def stage(*states: str, attempts: int = 0, spend: float = 0.0) -> RunProgress:
    systems = tuple(SystemProgress(f"sys-{i}", 3, 0, attempts, 2, 6, spend, 1.0, state, items=6)
                    for i, state in enumerate(states))
    return RunProgress("rt", "A", spend * len(states), 3.0, False, systems)


@settings(max_examples=300)
@given(progress(), st.integers(1, 300))
def test_the_block_has_a_total_line_and_one_line_per_system_within_the_width(p: RunProgress, width: int) -> None:
    lines = render(p, width)
    assert len(lines) == 1 + len(p.systems)
    assert all(len(line) <= width for line in lines)
    assert not any(ch in line for line in lines for ch in "\r\n\x1b")


@given(progress())
def test_at_a_wide_width_each_system_has_its_own_line_with_its_counts(p: RunProgress) -> None:
    lines = render(p, 10_000)
    assert f"{p.study}/{p.stage}" in lines[0] and f"ceiling ${p.ceiling_usd:g}" in lines[0]
    assert ("CROSSED" in lines[0]) == p.crossed
    for s, line in zip(p.systems, lines[1:], strict=True):
        assert line.split()[0] == s.system and line.endswith(f"  {s.state}")
        assert f"items {s.items_admitted}/{s.items}" in line and f"standing {s.standing}/{s.cells}" in line
        assert f"attempts {s.attempts}" in line and f"/${s.cap_usd:g}" in line


def test_plain_lines_name_only_the_systems_whose_state_changed() -> None:
    first = plain_lines(None, stage("running", "running"))
    assert [line.split()[1] for line in first] == ["sys-0", "sys-1", "total"]
    assert plain_lines(stage("running", "running"), stage("running", "running", attempts=9)) == []
    changed = plain_lines(stage("running", "running"), stage("done", "running"))
    assert [line.split()[1] for line in changed] == ["sys-0", "total"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_terminal_is_redrawn_in_place_at_most_once_per_interval_and_once_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    show = ProgressDisplay(out, tty=True, interval=0.25, clock=clock)
    for i in range(200):  # 200 updates in 1 s of the clock: at most 1 / 0.25 + 1 draws
        clock.t = i * 0.005
        show(stage("running", "running", attempts=i))
    show.close()
    show.close()  # idempotent
    text = out.getvalue()
    draws = text.count("\x1b[2K") // 3
    assert 2 <= draws <= 6, draws
    assert text.count("\r\x1b[3A") == draws - 1  # every draw after the first goes back up over the block
    shown = screen(text)
    assert len(shown) == 3 and shown == render(stage("running", "running", attempts=199), 100)


def test_a_log_gets_a_line_per_state_change_and_everything_every_period_and_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    show = ProgressDisplay(out, tty=False, every=10.0, clock=clock)
    for i in range(1000):  # 1000 updates over 25 s of the clock; one state change at 12 s
        clock.t = i * 0.025
        show(stage("done" if clock.t >= 12 else "running", "running", attempts=i))
    show.close()
    lines = out.getvalue().splitlines()
    # full blocks at 0, 10 and 20 s (3 lines each), the change (2 lines), the final block (3 lines)
    assert len(lines) == 3 * 3 + 2 + 3, lines
    assert lines[-3:] == plain_lines(None, stage("done", "running", attempts=999))
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_nothing_received_nothing_drawn_and_nothing_after_close() -> None:
    out = io.StringIO()
    show = ProgressDisplay(out, tty=True)
    show.close()
    show(stage("running"))
    assert out.getvalue() == ""
