from datetime import date

import pytest

from calendarkit import DateRange, month_range


def test_rejects_reversed_range():
    with pytest.raises(ValueError):
        DateRange(date(2024, 1, 2), date(2024, 1, 1))


def test_membership_is_inclusive():
    r = DateRange(date(2024, 3, 4), date(2024, 3, 8))
    assert date(2024, 3, 4) in r and date(2024, 3, 8) in r
    assert date(2024, 3, 9) not in r


def test_iteration_includes_both_ends():
    r = DateRange(date(2024, 3, 4), date(2024, 3, 8))
    days = list(r)
    assert len(r) == 5
    assert days[0] == date(2024, 3, 4) and days[-1] == date(2024, 3, 8)
    assert list(DateRange(date(2024, 1, 1), date(2024, 1, 1))) == [date(2024, 1, 1)]


def test_business_days():
    assert DateRange(date(2024, 3, 4), date(2024, 3, 10)).business_days() == 5
    assert DateRange(date(2024, 3, 4), date(2024, 3, 8)).business_days() == 5
    assert DateRange(date(2024, 3, 9), date(2024, 3, 10)).business_days() == 0


def test_intersection():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 5), date(2024, 1, 20))
    assert a.intersection(b) == DateRange(date(2024, 1, 5), date(2024, 1, 10))
    assert a.intersection(DateRange(date(2024, 2, 1), date(2024, 2, 2))) is None


def test_weeks_and_months():
    feb = month_range(2024, 2)
    assert feb.end == date(2024, 2, 29)
    weeks = feb.weeks()
    assert weeks[0] == DateRange(date(2024, 2, 1), date(2024, 2, 4))
    assert weeks[-1] == DateRange(date(2024, 2, 26), date(2024, 2, 29))
    assert len(weeks) == 5
