"""Split sequences into numbered pages."""

from .paginator import Page, PageNotFound, Paginator

__all__ = ["Page", "PageNotFound", "Paginator"]
