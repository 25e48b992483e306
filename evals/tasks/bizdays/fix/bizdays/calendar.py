"""Business days: Monday to Friday, except the given holidays."""

from collections.abc import Iterable
from datetime import date, timedelta

ONE_DAY = timedelta(days=1)


def is_business_day(day: date, holidays: Iterable[date] = ()) -> bool:
    """Return whether ``day`` is a weekday that is not one of ``holidays``."""
    return day.weekday() < 5 and day not in set(holidays)


def business_days_between(start: date, end: date, holidays: Iterable[date] = ()) -> int:
    """Count the business days from ``start`` to ``end``, both dates included.

    Raises:
        ValueError: ``end`` is before ``start``.
    """
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    off = set(holidays)
    count = 0
    day = start
    while day <= end:
        if is_business_day(day, off):
            count += 1
        day += ONE_DAY
    return count


def add_business_days(start: date, n: int, holidays: Iterable[date] = ()) -> date:
    """Return the date ``n`` business days after ``start`` (``start`` not counted).

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    off = set(holidays)
    day = start
    while n > 0:
        day += ONE_DAY
        if is_business_day(day, off):
            n -= 1
    return day
