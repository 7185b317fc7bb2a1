"""A least-recently-used cache and a memoizing decorator built on it."""

from .lru import CacheStats, LRUCache, cached

__all__ = ["CacheStats", "LRUCache", "cached"]
