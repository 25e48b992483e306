"""Merge closed integer intervals."""

from intervals.merge import merge

__all__ = ["merge"]
