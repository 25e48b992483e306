from datetime import date

from bizdays import business_days_between


def test_monday_to_friday_is_five_days():
    assert business_days_between(date(2024, 3, 4), date(2024, 3, 8)) == 5
