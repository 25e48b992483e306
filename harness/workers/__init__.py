"""Worker processes: process groups, timeouts, escaped descendants.

The manual: docs/gated-path.md.
"""
