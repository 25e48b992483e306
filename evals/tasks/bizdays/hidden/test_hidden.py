from datetime import date

import pytest

from bizdays import add_business_days, business_days_between

MON = date(2024, 3, 4)
FRI = date(2024, 3, 8)
SAT = date(2024, 3, 9)
SUN = date(2024, 3, 10)
NEXT_MON = date(2024, 3, 11)


def test_single_day():
    assert business_days_between(MON, MON) == 1
    assert business_days_between(SAT, SAT) == 0


def test_across_a_weekend():
    assert business_days_between(FRI, NEXT_MON) == 2
    assert business_days_between(SAT, SUN) == 0
    assert business_days_between(MON, date(2024, 3, 15)) == 10


def test_holiday_inside_range_on_a_weekday():
    assert business_days_between(MON, FRI, [date(2024, 3, 6)]) == 4


def test_holidays_on_weekends_outside_range_or_repeated_do_not_count():
    holidays = [SAT, date(2024, 1, 1), date(2024, 3, 6), date(2024, 3, 6)]
    assert business_days_between(MON, SUN, holidays) == 4


def test_holiday_on_an_end_date():
    assert business_days_between(MON, FRI, iter([MON, FRI])) == 3


def test_end_before_start():
    with pytest.raises(ValueError):
        business_days_between(FRI, MON)


def test_add_business_days_skips_weekends_and_holidays():
    assert add_business_days(FRI, 1) == NEXT_MON
    assert add_business_days(FRI, 1, [NEXT_MON]) == date(2024, 3, 12)
    assert add_business_days(SAT, 0) == SAT
