"""Normalize URLs so that equivalent links compare equal."""

from .normalize import normalize, same_page

__all__ = ["normalize", "same_page"]
