"""Who runs the next dispatch: the lane (lateral on stagnation), the catalog model, a provider switch.

The manual: docs/models.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.errors import Code, ProviderRefusal
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from harness.evidence.portable import portable_value
from harness.gate.escalation import LATERAL, EscalationState
from harness.gate.evidence import evidence_packet, render_evidence
from harness.gate.workspace import Gate
from harness.records.journal import LaneSwitch, ProviderSwitch

if TYPE_CHECKING:  # the catalog (and every provider behind it) is imported only when a model is chosen
    from harness.providers.catalog import Catalog, CatalogModel

__all__ = ["AUTO_MODEL", "ModelChoice", "choose_model", "lane_switch", "next_lane", "provider_switch"]

AUTO_MODEL = "auto"
"""`--model auto`: the cheapest catalog model of the current lane."""


@dataclass(frozen=True)
class ModelChoice:
    """The catalog model a `--model` dispatch runs, its catalog, and how it was chosen (journaled)."""

    model: CatalogModel
    catalog: Catalog
    record: dict[str, Any]


def choose_model(
    name: str, lane: str, esc: EscalationState, catalog_path: str | None, pricing_path: str | None
) -> ModelChoice:
    """The catalog model for `--model ID` or `--model auto` (the cheapest of the lane)."""
    from harness.providers.catalog import load_catalog, resolve_model

    catalog = load_catalog(catalog_path)
    if name != AUTO_MODEL:
        named = resolve_model(catalog, name)
        if named.worker is None:
            raise ProviderRefusal(Code.MODEL_HAS_NO_WORKER, f"{named.id!r} has no [model.worker] argv in the catalog", catalog.path)
        return ModelChoice(named, catalog, {"mode": "explicit", "model_lane": named.lane})
    from harness.meter.priced_catalog import cheapest_in_lane
    from harness.meter.pricing import load_pricing

    pricing = load_pricing(pricing_path)
    excluded = esc.excluded_providers(lane)
    model, considered = cheapest_in_lane(catalog, lane, pricing, excluded)
    if model is None:
        raise ProviderRefusal(
            Code.NO_MODEL_FOR_LANE,
            f"no catalog model with a worker in lane {lane!r}"
            + (f" outside the failed providers {', '.join(excluded)}" if excluded else ""),
            catalog.path,
            lane=lane,
            excluded_providers=list(excluded),
            considered=considered,
        )
    record = {
        "mode": "auto",
        "lane": lane,
        "by": "lowest output price (unpriced last)",
        "pricing": {"path": portable_value(pricing.path), "sha256": pricing.sha256},
        "excluded_providers": list(excluded),
        "considered": considered,
    }
    return ModelChoice(model, catalog, record)


def provider_switch(
    esc: EscalationState, started: list[dict[str, Any]], lane: str, choice: ModelChoice | None, dispatch_id: str
) -> ProviderSwitch | None:
    """When the last dispatch failed for provider reasons and auto picked another provider: why."""
    if choice is None or choice.record.get("mode") != "auto" or not started or not esc.provider_failures:
        return None
    last = esc.provider_failures[-1]
    if last["dispatch_id"] != started[-1]["dispatch_id"] or last["lane"] != lane:
        return None
    if last["provider"] == choice.model.provider:
        return None
    return ProviderSwitch(
        dispatch_id=dispatch_id,
        from_provider=last["provider"],
        to_provider=choice.model.provider,
        model=choice.model.id,
        lane=lane,
        reason=f"provider failure in dispatch {last['dispatch_id']} ({last['why']}): same lane, another provider",
        switch_class="provider_failure",
    )


def next_lane(gate: Gate, esc: EscalationState) -> str:
    """The lane of the next dispatch: lateral on stagnation, within `max_stagnant` switches."""
    if not esc.stagnant:
        return esc.lane
    budget = gate.task.budget
    if len(esc.switches) >= budget.max_stagnant:
        raise ProviderRefusal(
            Code.STAGNATION_LIMIT_REACHED,
            f"{esc.stagnant_count} identical failures in lane {esc.lane} after {len(esc.switches)} "
            f"lane switch(es); max_stagnant is {budget.max_stagnant}",
            gate.task.path,
            lane=esc.lane,
            fingerprint=esc.stagnant_fingerprint,
        )
    return LATERAL[esc.lane]


def lane_switch(
    gate: Gate, esc: EscalationState, dispatch_id: str, folder: str, shown_dir: str
) -> tuple[LaneSwitch, str] | None:
    """On stagnation: the lane switch event (not yet journaled) and the evidence packet as prompt text
    (naming the packet where the worker sees it, in `shown_dir`)."""
    if not esc.stagnant:
        return None
    to = LATERAL[esc.lane]
    receipts = [c["receipt_id"] for c in esc.counted[-esc.stagnant_count :]]
    reason = (
        f"stagnation: the last {esc.stagnant_count} verifications after dispatches in lane {esc.lane} "
        f"({', '.join(receipts)}) failed with the same fingerprint {str(esc.stagnant_fingerprint)[:16]}"
    )
    packet = evidence_packet(gate, esc, to, reason, dispatch_id)
    path = os.path.join(folder, "evidence.json")
    data = canonical_bytes(packet)
    atomic_write(path, data)
    switch = LaneSwitch(
        from_lane=esc.lane,
        to_lane=to,
        reason=reason,
        fingerprint=esc.stagnant_fingerprint,
        stagnant_count=esc.stagnant_count,
        receipt_ids=tuple(receipts),
        dispatch_id=dispatch_id,
        evidence_file=path,
        evidence_sha256=sha256_hex(data),
        switch_class="stagnation",
    )
    return switch, render_evidence(packet, os.path.join(shown_dir, "evidence.json"))
