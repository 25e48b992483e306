"""Business-day arithmetic on calendar dates."""

from bizdays.calendar import add_business_days, business_days_between, is_business_day

__all__ = ["add_business_days", "business_days_between", "is_business_day"]
