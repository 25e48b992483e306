"""Every file format of the evidence, each declared once as a frozen dataclass (docs/records.md)."""
