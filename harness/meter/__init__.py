"""Metering: what every provider exchange cost, from the wire rather than anyone's say-so.

- `pricing`: the strict pricing table ($/Mtok by model, tiers, notional flag).
- `cost`: usage x price, exact sums, unknown kept unknown.
- `exchange`: what a raw response (or stream) says about itself, asked of its adapter.
- `wire`: the chained wire log, reading it back verified, metering it.
- `relay`, `proxy`: the metering proxy that records an agent's exchanges.
- `priced_catalog`: the catalog with prices (`proctor catalog`, `--model auto`).
- `usage`: re-exports `TokenUsage` (harness.records.usage) and the registry's usage parser.

The meter never names an API shape: it asks `harness.providers.registry`.
Nothing is re-exported here, so importing one module stays cheap.
"""
