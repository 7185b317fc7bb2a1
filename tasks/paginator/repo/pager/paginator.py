"""Pagination over any sequence (lists, tuples, query results with len()).

Pages are numbered from 1. An empty sequence still has one (empty) page so
that list views can always render page 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


class PageNotFound(LookupError):
    """The requested page number is out of range."""


@dataclass(frozen=True)
class Page:
    number: int
    items: list
    paginator: Paginator

    @property
    def has_next(self) -> bool:
        return self.number < self.paginator.num_pages

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def start_index(self) -> int:
        """1-based index of the first item on this page (0 if the page is empty)."""
        if not self.items:
            return 0
        return (self.number - 1) * self.paginator.per_page + 1

    @property
    def end_index(self) -> int:
        """1-based index of the last item on this page (0 if the page is empty)."""
        return self.start_index + len(self.items) - 1 if self.items else 0


class Paginator:
    def __init__(self, items: Sequence, per_page: int):
        if per_page < 1:
            raise ValueError("per_page must be at least 1")
        self.items = items
        self.per_page = per_page

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def num_pages(self) -> int:
        if self.count == 0:
            return 1
        return (self.count + self.per_page) // self.per_page

    @property
    def page_range(self) -> range:
        return range(1, self.num_pages + 1)

    def validate_number(self, number: int) -> int:
        if not isinstance(number, int) or isinstance(number, bool):
            raise TypeError(f"page number must be an int, not {type(number).__name__}")
        if number < 1 or number > self.num_pages:
            raise PageNotFound(f"page {number} does not exist (1..{self.num_pages})")
        return number

    def page(self, number: int) -> Page:
        number = self.validate_number(number)
        start = (number - 1) * self.per_page
        return Page(number, list(self.items[start:start + self.per_page]), self)
