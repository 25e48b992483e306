"""Preregistration: the design, freeze and amend, hash-derived orders, the deterministic plan (docs/prereg.md)."""
