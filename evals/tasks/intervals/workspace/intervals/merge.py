"""Merging closed intervals [start, end]."""


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping or touching closed intervals.

    Args:
        intervals: (start, end) pairs with start <= end, in any order. Both ends
            are inclusive, so (1, 3) and (3, 5) share the point 3.

    Returns:
        The merged intervals as (start, end) tuples, sorted by start. The input
        list is not modified.

    Raises:
        ValueError: an interval has start > end.
    """
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) has start > end")
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged
