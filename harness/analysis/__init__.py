"""A study's analysis over the validated report: the q table, break-even, tables and figures (docs/analysis.md)."""
