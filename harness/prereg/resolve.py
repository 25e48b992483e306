"""Every system resolved against the catalog and the pricing a plan and a run will use, before the freeze.

`proctor prereg check`, `freeze` and `amend` call `resolve_systems`, so what
`plan` or `run` would refuse (a model missing from the catalog, a provider or
pricing key that disagrees with it, a model with no price) is refused before
anything is frozen. The catalog is the folder's `catalog.toml`, else the
bundled one; the pricing is the folder's `pricing.yaml`, else the bundled one:
the same choice `plan` and `run` make (never the environment's).

The manual: docs/prereg.md.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, PreregRefusal, ProviderRefusal, Refusal
from harness.meter.pricing import BUNDLED_PRICING, PricingTable, load_pricing
from harness.prereg.design import Design
from harness.prereg.folder import repo_task_suite
from harness.providers.catalog import BUNDLED_CATALOG, Catalog, load_catalog, resolve_model

__all__ = ["PRICING_NAME", "Resolved", "resolve_systems"]

PRICING_NAME = "pricing.yaml"


@dataclass(frozen=True)
class Resolved:
    """Where each system's model is reached and what it costs: `catalog` and `pricing` are the files used."""

    catalog: Catalog
    pricing: PricingTable
    systems: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"catalog": self.catalog.path, "catalog_sha256": self.catalog.sha256,
                "pricing": self.pricing.path, "pricing_sha256": self.pricing.sha256,
                "systems": list(self.systems)}


def resolve_systems(folder: str, design: Design, catalog: Catalog | None, files: Collection[str]) -> Resolved:
    """Resolve every system of `design`; refuses as `plan` and `run` would.

    Args:
        folder: the preregistration folder.
        design: its validated design.
        catalog: the folder's own catalog, or None for the bundled one.
        files: the names of the folder's registered files (its `pricing.yaml`, when one of them, is used).

    Refuses `unknown_model` (a model not in the catalog), `systems_catalog_mismatch`
    (a provider or pricing key that disagrees with the catalog) and `system_unpriced`
    (a pricing key the pricing does not list), each naming the file.
    """
    used = catalog if catalog is not None else load_catalog(BUNDLED_CATALOG)
    pricing = load_pricing(os.path.join(folder, PRICING_NAME) if PRICING_NAME in files else BUNDLED_PRICING)
    mismatched: list[str] = []
    unpriced: list[str] = []
    rows: list[dict[str, Any]] = []
    for system in design.systems:
        try:
            model = resolve_model(used, system.model)
        except Refusal as exc:
            raise type(exc)(exc.code, f"system {system.slot}: {exc.message}", exc.path,
                            system=system.slot, **exc.details) from None
        if model.provider != system.provider:
            mismatched.append(f"system {system.slot}: provider {system.provider!r} in design.toml, "
                              f"{model.provider!r} in the catalog")
        if model.pricing_key != system.pricing_key:
            mismatched.append(f"system {system.slot}: pricing key {system.pricing_key!r} in design.toml, "
                              f"{model.pricing_key!r} in the catalog")
        priced = pricing.get(system.pricing_key) is not None
        if not priced:
            unpriced.append(f"system {system.slot}: no price for {system.pricing_key!r}")
        if model.worker is None and repo_task_suite(design):
            raise ProviderRefusal(Code.MODEL_HAS_NO_WORKER, f"system {system.slot}: {model.id!r} has no "
                                "[model.worker] in the catalog; a repo_task suite runs each system's worker",
                                used.path, system=system.slot)
        rows.append({"slot": system.slot, "model": model.id, "api_shape": model.api_shape,
                     "api_model": model.api_model, "pricing_key": system.pricing_key, "priced": priced})
    if mismatched:
        raise PreregRefusal(Code.SYSTEMS_CATALOG_MISMATCH, "; ".join(mismatched), used.path, problems=mismatched)
    if unpriced:
        raise PreregRefusal(Code.SYSTEM_UNPRICED, "; ".join(unpriced) + " in the pricing (a run would refuse it)",
                            pricing.path, problems=unpriced)
    return Resolved(used, pricing, tuple(rows))
