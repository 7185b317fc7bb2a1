"""Greedy word wrapping for plain-text output."""

from .wrap import fill, indent, shorten, wrap

__all__ = ["fill", "indent", "shorten", "wrap"]
