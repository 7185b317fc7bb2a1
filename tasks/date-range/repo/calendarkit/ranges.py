"""Inclusive date ranges.

A `DateRange(start, end)` contains every day from `start` to `end`, both
included, so `DateRange(d, d)` is a single day.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Iterator

ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class DateRange:
    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"range ends before it starts: {self.start} > {self.end}")

    def __len__(self) -> int:
        return (self.end - self.start).days

    def __iter__(self) -> Iterator[date]:
        for offset in range(len(self)):
            yield self.start + offset * ONE_DAY

    def __contains__(self, day: object) -> bool:
        return isinstance(day, date) and self.start <= day <= self.end

    def overlaps(self, other: DateRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: DateRange) -> DateRange | None:
        """The days both ranges share, or None if they are disjoint."""
        if not self.overlaps(other):
            return None
        return DateRange(max(self.start, other.start), min(self.end, other.end))

    def business_days(self) -> int:
        """Number of days in the range that fall on Monday to Friday."""
        return sum(1 for day in self if day.weekday() < 5)

    def weeks(self) -> list[DateRange]:
        """Split the range at Sundays into ISO-week chunks (Monday..Sunday)."""
        chunks = []
        start = self.start
        while start <= self.end:
            sunday = start + (6 - start.weekday()) * ONE_DAY
            end = min(sunday, self.end)
            chunks.append(DateRange(start, end))
            start = end + ONE_DAY
        return chunks


def month_range(year: int, month: int) -> DateRange:
    """The whole calendar month as a range."""
    last = calendar.monthrange(year, month)[1]
    return DateRange(date(year, month, 1), date(year, month, last))
