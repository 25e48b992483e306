"""The evidence spine: strict reading, canonical writing, chained logs, trees, locks, time, money.

The manual: docs/evidence.md.
"""
