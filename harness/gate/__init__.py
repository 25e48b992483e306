"""The gated path: one coding task from a task file to an accepted, receipted result.

The manual: docs/gated-path.md.
"""
