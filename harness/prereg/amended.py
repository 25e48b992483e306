"""A stage's plan under later amendments: does the freeze it ran under still hold for it?

The manual: docs/prereg.md ("Amendments and stages that ran").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, Refusal
from harness.evidence.jsonio import loads_strict
from harness.prereg.frozen import FrozenPrereg

__all__ = ["AMENDABLE_HEADER", "StagePlanCheck", "check_stage_plan"]

AMENDABLE_HEADER: Final = frozenset({"frozen_sha256", "design_sha256", "systems_sha256", "catalog_sha256",
                                     "amendments"})
"""Plan header fields an amendment may change without changing what a stage ran (its cells say that)."""

_WHAT: Final = {"draw": "its draw", "packet_sha256": "the packet", "seed": "the seed",
                "requests": "its number of requests", "stage": "its stage", "study": "the study",
                "scope": "the scope"}


@dataclass(frozen=True)
class StagePlanCheck:
    """The verdict on a stage's stored plan against the current preregistration.

    Attributes:
        ok: the stage stands under the current freeze (its plan is the current plan of the stage but
            for the fields `AMENDABLE_HEADER` names, and it ran under this freeze or one before it).
        code: when not ok, `amendment_changes_stage` (an amendment since its freeze changed what it
            ran) or `run_plan_changed` (anything else: another preregistration, packet or catalog).
        message: what differs, naming the stage and the amendments.
        ran_under: how many amendments the freeze it ran under had (None when not in the history).
        amendments: the numbers of the amendments since that freeze.
    """

    ok: bool
    code: Code | None
    message: str
    ran_under: int | None
    amendments: tuple[int, ...]


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")


def _object(line: bytes) -> dict[str, Any] | None:
    try:
        value = loads_strict(line)
    except Refusal:
        return None
    return value if isinstance(value, dict) else None


def _differences(stored: list[bytes], fresh: list[bytes]) -> list[str]:
    """What differs between two plans of a stage, beyond the fields an amendment may change."""
    old, new = _object(stored[0]) if stored else None, _object(fresh[0]) if fresh else None
    if old is None or new is None:
        return ["the plan's header does not read"]
    # A plan written before the header recorded the arms' workers has no "arms": they are the design's,
    # whose sha256 the header pins, so the same design means the same workers (docs/prereg.md).
    older = "arms" not in old and old.get("design_sha256") == new.get("design_sha256")
    out = [_WHAT.get(k, k) for k in sorted(set(old) | set(new))
           if k not in AMENDABLE_HEADER and old.get(k) != new.get(k) and not (k == "arms" and older)]
    cells_old, cells_new = stored[1:], fresh[1:]
    if len(cells_old) != len(cells_new):
        out.append(f"{len(cells_new)} requests where it ran {len(cells_old)}")
    differing, fields = 0, set[str]()
    for a, b in zip(cells_old, cells_new, strict=False):
        if a == b:
            continue
        differing += 1
        x, y = _object(a) or {}, _object(b) or {}
        fields |= {k for k in set(x) | set(y) if x.get(k) != y.get(k)}
    if differing:
        out.append(f"{differing} of its {len(cells_old)} requests (in {', '.join(sorted(fields)) or 'their bytes'})")
    if len(cells_old) != len(cells_new) and _WHAT["requests"] in out:
        out.remove(_WHAT["requests"])  # the count of requests says it
    return out


def check_stage_plan(stored: bytes, fresh: bytes, frozen: FrozenPrereg, stage: str) -> StagePlanCheck:
    """Check a stage's stored `plan.jsonl` (`stored`) against its plan under the current freeze (`fresh`).

    The stored header names the freeze the stage ran under (`frozen_sha256`); it must be the current
    FROZEN.json or one the chained amendments lead from (`FrozenPrereg.freezes`). The amendments since
    then may change the text, later stages, comparisons, budgets: anything but what the stage ran
    (its systems, draw, arms, prompts and bodies: every byte of its cells and its header but for
    `AMENDABLE_HEADER`).
    """
    freezes = frozen.freezes()
    now = len(freezes) - 1
    if stored == fresh:
        return StagePlanCheck(True, None, "", now, ())
    s_lines, f_lines = _lines(stored), _lines(fresh)
    header = _object(s_lines[0]) if s_lines else None
    ran = header.get("frozen_sha256") if header is not None else None
    if not isinstance(ran, str) or ran not in freezes:
        return StagePlanCheck(False, Code.RUN_PLAN_CHANGED, f"the plan of stage {stage!r} names the freeze "
                              f"{str(ran)[:12]}, which is neither this preregistration's FROZEN.json nor one its "
                              f"{now} amendments lead from (another preregistration, or the packet or catalog "
                              "changed)", None, ())
    k = freezes.index(ran)
    since = tuple(a.number for a in frozen.amendments[k:])
    differs = _differences(s_lines, f_lines)
    if not differs:
        return StagePlanCheck(True, None, "", k, since)
    what = "; ".join(differs)
    if not since:
        return StagePlanCheck(False, Code.RUN_PLAN_CHANGED, f"the plan of stage {stage!r} differs from the one "
                              f"its freeze gives now ({what}): the packet or catalog changed", k, ())
    named = ", ".join(str(n) for n in since)
    return StagePlanCheck(False, Code.AMENDMENT_CHANGES_STAGE,
                          f"stage {stage!r} ran under freeze {ran[:12]} (after {k} amendments), and "
                          f"amendment{'s' if len(since) > 1 else ''} {named} change{'' if len(since) > 1 else 's'} "
                          f"what it ran ({what}); a stage keeps what it ran: undo that change in a new amendment, "
                          "or register it as a new stage", k, since)
