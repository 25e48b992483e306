"""The catalog with prices: what each configured model costs, and choosing the cheapest.

The catalog (`harness.providers.catalog`) says how to reach a model; the
pricing table (`harness.meter.pricing`) what it costs. This module joins the
two for `proctor catalog` (`describe_catalog`) and `--model auto`
(`cheapest_in_lane`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from harness.meter.pricing import PricingTable, load_pricing
from harness.providers.catalog import Catalog, CatalogModel, load_catalog

__all__ = ["cheapest_in_lane", "describe_catalog", "price_of"]


def price_of(pricing: PricingTable | None, model: CatalogModel) -> dict[str, Any] | None:
    """The model's prices ($/Mtok) from the pricing table, or None when unpriced."""
    price = pricing.get(model.pricing_key) if pricing is not None else None
    if price is None:
        return None
    return {
        "input_per_mtok": price.input_per_mtok,
        "output_per_mtok": price.output_per_mtok,
        "cached_input_per_mtok": price.cached_input_per_mtok,
        "cache_write_per_mtok": price.cache_write_per_mtok,
        "reasoning_per_mtok": "billed_as_output" if price.reasoning_per_mtok is None else price.reasoning_per_mtok,
        "tiers": len(price.tiers),
        "notional": price.notional,
    }


def describe_catalog(
    catalog_path: str | os.PathLike[str] | None = None, pricing_path: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """What is configured and what it costs: `proctor catalog`.

    For each model: its lane, provider, shape, whether its credential variable
    is set (never the value) and its prices from the pricing table
    (`unpriced` when the table has no entry for its pricing key).
    """
    catalog = load_catalog(catalog_path)
    pricing = load_pricing(pricing_path)
    rows = []
    for model in catalog.models:
        prices = price_of(pricing, model)
        credential = model.credential_set()
        rows.append(
            {
                "id": model.id,
                "lane": model.lane,
                "provider": model.provider,
                "api_shape": model.api_shape,
                "base_url": model.effective_base_url(),
                "credential_env": model.credential_env or None,
                "credential": "not needed" if credential is None else ("yes" if credential else "no"),
                "pricing_key": model.pricing_key,
                "price": prices if prices is not None else "unpriced",
                "worker": model.worker is not None,
                "worker_network": None if model.worker is None else model.worker.network,
            }
        )
    return {
        "ok": True,
        "catalog": catalog.to_json(),
        "pricing": {"path": pricing.path, "sha256": pricing.sha256, "notional": pricing.notional},
        "models": rows,
    }


def cheapest_in_lane(
    catalog: Catalog, lane: str, pricing: PricingTable | None, exclude_providers: Sequence[str] = ()
) -> tuple[CatalogModel | None, list[dict[str, Any]]]:
    """`--model auto`: the lane's model with the lowest output price (unpriced last, then catalog order).

    Models of an excluded provider (one that failed in this lane) and models
    without a worker are skipped. Returns the pick (None when nothing is left)
    and every candidate considered, with why it was or was not eligible.
    """
    considered: list[dict[str, Any]] = []
    eligible: list[tuple[float, int, CatalogModel]] = []
    for index, model in enumerate(catalog.in_lane(lane)):
        price = pricing.get(model.pricing_key) if pricing is not None else None
        output = None if price is None else price.output_per_mtok
        row: dict[str, Any] = {"id": model.id, "provider": model.provider, "output_per_mtok": output}
        if model.provider in exclude_providers:
            row["skipped"] = "provider failed in this lane"
        elif model.worker is None:
            row["skipped"] = "no worker template"
        else:
            eligible.append((float("inf") if output is None else output, index, model))
        considered.append(row)
    eligible.sort(key=lambda item: (item[0], item[1]))
    return (eligible[0][2] if eligible else None), considered
