"""Parse, compare and bump semantic version strings."""

from .version import Version, latest

__all__ = ["Version", "latest"]
