"""Notebooks as evidence: papermill execution, anchoring executed copies, batch, display helpers (docs/notebooks.md)."""
