"""Checking a study from its files alone: the results walk, the run oracle, the report, the audit (docs/audit.md)."""
