"""`proctor prereg check`: what a registration amounts to before anything runs (cells, budgets, power).

The manual: docs/prereg.md.
"""

from __future__ import annotations

import math
import os
from typing import Any

from harness.prereg.design import Design
from harness.prereg.folder import (
    AMENDMENTS_NAME,
    CATALOG_NAME,
    FROZEN_NAME,
    open_folder,
    prepare,
    resolve_packet,
)
from harness.prereg.frozen import check_frozen
from harness.prereg.resolve import resolve_systems
from harness.providers.catalog import load_catalog

__all__ = ["budget_of", "check_prereg"]


def check_prereg(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`proctor prereg check DIR`: validate, resolve the packet, draw and systems, show cells, budgets and power.

    Every system is resolved against the catalog and pricing `plan` and `run`
    will use; a model missing from either is refused here, before the freeze.

    A frozen folder is checked against its freeze first (a change is refused,
    as every later command would); an unfrozen one is validated as freeze
    would validate it, and the report says what freeze would record.
    """
    folder = open_folder(path)
    if os.path.lexists(os.path.join(folder, FROZEN_NAME)):
        frozen = check_frozen(folder)
        design, systems_sha256 = frozen.design, frozen.systems_sha256
        catalog = None if frozen.catalog_sha256 is None else load_catalog(os.path.join(folder, CATALOG_NAME))
        files = frozen.files
        state: dict[str, Any] = {"state": "frozen", "frozen_at": frozen.frozen_at,
                                 "frozen_sha256": frozen.frozen_sha256, "files": frozen.files,
                                 "amendments": [a.to_json() for a in frozen.amendments]}
    else:
        prepared = prepare(folder)
        design, systems_sha256 = prepared.design, prepared.systems_sha256
        catalog, files = prepared.catalog, prepared.files
        state = {"state": "unfrozen", "would_record": {"study": design.study_id, "files": prepared.files,
                                                       "amendments": 0}}
    packet_items, packet_sha256 = resolve_packet(design)
    resolved = resolve_systems(folder, design, catalog, files)
    warnings: list[str] = []
    if state["state"] == "unfrozen":
        warnings.append("not frozen: plan, run and report refuse it until proctor prereg freeze DIR")
        if os.path.lexists(os.path.join(folder, AMENDMENTS_NAME)):
            warnings.append("AMENDMENTS.jsonl exists without FROZEN.json: freeze refuses; restore FROZEN.json")
    stages = [_stage_cells(design, stage_id) for stage_id in (s.id for s in design.stages)]
    budget = budget_of(design, warnings)
    power = [_comparison_power(design, i, warnings) for i in range(len(design.comparisons))]
    return {
        "ok": True, "study": design.study_id, "title": design.title, "path": folder,
        "design_sha256": design.sha256, "systems_sha256": systems_sha256,
        "systems": [{**s.manifest(), "pricing_key": s.pricing_key, "cap_usd": s.cap_usd} for s in design.systems],
        "resolved": resolved.to_json(),
        "arms": [{"id": a.id, "worker": None if a.worker is None else a.worker.to_json()} for a in design.arms],
        "packet": {"suite": design.suite_name, "path": design.packet_path, "sha256": packet_sha256,
                   "items": packet_items},
        "draw": {"items": design.draw_items, "packet_items": packet_items, "seed": design.seed},
        "stages": stages, "cells_total": sum(s["cells"] for s in stages),
        "budget": budget, "power": power, "frozen": state, "warnings": warnings,
    }


def _stage_cells(design: Design, stage_id: str) -> dict[str, Any]:
    stage = design.stage(stage_id)
    per_system = stage.items * len(stage.arms) * stage.repeats
    return {"stage": stage.id, "items": stage.items, "arms": list(stage.arms), "repeats": stage.repeats,
            "systems": {slot: per_system for slot in stage.systems},
            "cells": per_system * len(stage.systems),
            "formula": f"{stage.items} items x {len(stage.arms)} arms x {stage.repeats} repeats per system"}


def _usd(x: float) -> float:
    return round(x, 6)


def _covers(need_expected: float, need_worst: float, limit: float) -> str:
    """Which case `limit` covers: `worst` (every rerun and retry spent), `expected` (each arm once), or `neither`."""
    if need_worst <= limit:
        return "worst"
    return "expected" if need_expected <= limit else "neither"


def budget_of(design: Design, warnings: list[str]) -> dict[str, Any]:
    """Caps and the ceiling against the reserve, in the expected case and in the worst case.

    Expected: every item under way (one item of one repeat, all its arms
    answered once) holds the reserve, as admission holds it. Worst: every
    rerun and every transport retry is spent and each attempt costs the
    reserve (an unresolved cost counts as the reserve), so one item can take
    arms x (reruns + 1) x (transport retries + 1) attempts. Each cap, the
    overall cap and the ceiling say which case they cover (`covers`).
    """
    b = design.budgets
    per_attempt = (design.run.reruns + 1) * (design.run.transport_retries + 1)
    systems: list[dict[str, Any]] = []
    for system in design.systems:
        rows: list[dict[str, Any]] = []
        held = worst = 0.0
        for stage in design.stages:
            if system.slot not in stage.systems:
                continue
            items = stage.items * stage.repeats
            attempts = len(stage.arms) * per_attempt
            held = math.fsum([held, items * b.reserve_per_item_usd])
            worst = math.fsum([worst, items * attempts * b.reserve_per_item_usd])
            rows.append({"stage": stage.id, "items": items, "reserve_usd": _usd(items * b.reserve_per_item_usd),
                         "cumulative_usd": _usd(held), "covered": held <= system.cap_usd,
                         "worst_attempts_per_item": attempts,
                         "worst_usd": _usd(items * attempts * b.reserve_per_item_usd),
                         "worst_cumulative_usd": _usd(worst), "covers": _covers(held, worst, system.cap_usd)})
        covered = held <= system.cap_usd
        covers = _covers(held, worst, system.cap_usd)
        if not covered:
            short = next(r["stage"] for r in rows if not r["covered"])
            warnings.append(f"system {system.slot}: its cap ${system.cap_usd:g} cannot cover its items at the "
                            f"reserve ${b.reserve_per_item_usd:g} (${_usd(held):g} needed; short from stage {short})")
        elif covers == "expected":
            warnings.append(f"system {system.slot}: its cap ${system.cap_usd:g} covers the expected case "
                            f"(${_usd(held):g}) but not the worst case (${_usd(worst):g}, every rerun and transport "
                            "retry spent): admission refuses items once the cap is reached")
        systems.append({"slot": system.slot, "cap_usd": system.cap_usd,
                        "items": sum(r["items"] for r in rows), "reserve_needed_usd": _usd(held),
                        "covered": covered, "expected_usd": _usd(held), "worst_usd": _usd(worst),
                        "covers": covers, "stages": rows})
    total = math.fsum(s["expected_usd"] for s in systems)
    total_worst = math.fsum(s["worst_usd"] for s in systems)
    available = b.overall_cap_usd - b.spend_before_usd
    ceiling_left = b.ceiling_usd - b.spend_before_usd
    overall_covers = _covers(total, total_worst, available)
    ceiling_covers = _covers(total, total_worst, ceiling_left)
    if total > available:
        warnings.append(f"overall: the stages need ${_usd(total):g} at the reserve; the overall cap leaves "
                        f"${_usd(available):g} after ${b.spend_before_usd:g} spent before")
    if ceiling_covers != "worst":
        warnings.append(f"ceiling: ${_usd(b.ceiling_usd):g} covers {ceiling_covers} case: the worst case "
                        f"(every rerun and transport retry spent) needs ${_usd(total_worst):g} after "
                        f"${b.spend_before_usd:g} spent before")
    if sum(s.cap_usd for s in design.systems) > b.overall_cap_usd:
        warnings.append("the systems' caps add up to more than the overall cap: the overall cap binds first")
    return {"reserve_per_item_usd": b.reserve_per_item_usd, "systems": systems,
            "overall_cap_usd": b.overall_cap_usd, "ceiling_margin_usd": b.ceiling_margin_usd,
            "ceiling_usd": _usd(b.ceiling_usd), "spend_before_usd": b.spend_before_usd,
            "available_usd": _usd(available), "reserve_needed_usd": _usd(total), "covered": total <= available,
            "reruns": design.run.reruns, "transport_retries": design.run.transport_retries,
            "expected_usd": _usd(total), "worst_usd": _usd(total_worst),
            "covers": {"overall_cap": overall_covers, "ceiling": ceiling_covers,
                       **{s["slot"]: s["covers"] for s in systems}}}


def _exact_or_normal(n: int, margin: float, alpha: float, common: dict[str, Any]) -> float:
    """The registered test's exact power at n items; the normal approximation beyond the enumeration's
    reach or for a correlation the rates cannot have."""
    from harness.stats.power import EXACT_MAX_ITEMS, exact_tost_power, tost_power

    if n <= EXACT_MAX_ITEMS:
        try:
            return exact_tost_power(n, margin=margin, alpha=alpha, **common)
        except ValueError:
            pass
    return tost_power(n, margin=margin, alpha=alpha, **common)


def _comparison_power(design: Design, index: int, warnings: list[str]) -> dict[str, Any]:
    from harness.stats.power import items_needed, minimum_detectable_margin, tost_power

    c = design.comparisons[index]
    paired = design.test == "paired_tost"
    common: dict[str, Any] = {"p_a": c.expected_a, "p_b": c.expected_b, "correlation": c.correlation,
                              "paired": paired}
    needed = items_needed(margin=c.margin, alpha=design.alpha, power=design.power, **common)
    stages: list[dict[str, Any]] = []
    for stage in design.stages:
        if c.a in stage.systems and c.b in stage.systems and c.arm in stage.arms:
            n = stage.items  # distinct items: repeats of an item are clustered, not new items
            stages.append({
                "stage": stage.id, "items": n,
                "reaches": needed.n is not None and n >= needed.n,
                # the registered test's exact power (the normal approximation beside it; issue 15)
                "power_at_items": _exact_or_normal(n, c.margin, design.alpha, common),
                "power_at_items_normal": tost_power(n, margin=c.margin, alpha=design.alpha, **common),
                "minimum_detectable_margin": minimum_detectable_margin(n, alpha=design.alpha, power=design.power,
                                                                       **common),
            })
    name = f"{c.a} vs {c.b} on {c.arm}"
    if needed.n is None:
        warnings.append(f"comparison {name}: {needed.reason}")
    elif not any(s["reaches"] for s in stages):
        best = max(stages, key=lambda s: s["items"])
        warnings.append(f"comparison {name}: needs {needed.n} items for power {design.power:g} at margin "
                        f"{c.margin:g}; the largest stage has {best['items']} (power {best['power_at_items']:.3f}, "
                        f"minimum detectable margin {best['minimum_detectable_margin']:.4f})")
    return {"a": c.a, "b": c.b, "arm": c.arm, "test": design.test, "margin": c.margin, "alpha": design.alpha,
            "power": design.power, "expected_a": c.expected_a, "expected_b": c.expected_b,
            "correlation": c.correlation, "needed": needed.to_json(), "stages": stages}
