"""Date range helpers for reports and schedules."""

from .ranges import DateRange, month_range

__all__ = ["DateRange", "month_range"]
