"""Metering: what every provider exchange cost, from the wire rather than anyone's say-so.

- `usage`: token usage by disjoint category, per API shape.
- `pricing`: the strict pricing table ($/Mtok by model, tiers, notional flag).
- `cost`: usage x price, exact sums, unknown kept unknown.
- `exchange`: what a raw response (or stream) says about itself.
- `wire`: the chained wire log, reading it back verified, metering it.
- `proxy`: the metering proxy that records an agent's exchanges.

Nothing is re-exported here: `harness.providers.base` imports `usage`, and
`wire` imports `providers.base`, so the package itself stays import-free.
"""
