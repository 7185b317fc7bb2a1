"""Least-recently-used cache.

Entries are kept in an OrderedDict from least to most recently used: the
first entry is the next one to be evicted. Both `get` (on a hit) and `put`
mark a key as most recently used.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

_MISSING = object()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class LRUCache:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.stats = CacheStats()
        self._data: OrderedDict[Hashable, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        """Membership test; does not count as a use of the key."""
        return key in self._data

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.stats.misses += 1
            return default
        self.stats.hits += 1
        self._data.move_to_end(key, last=False)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.stats.evictions += 1

    def clear(self) -> None:
        self._data.clear()
        self.stats = CacheStats()

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        return list(self._data)


def cached(capacity: int = 128) -> Callable[[Callable], Callable]:
    """Memoize a function of hashable positional arguments in an LRUCache."""

    def decorate(func: Callable) -> Callable:
        cache = LRUCache(capacity)

        @functools.wraps(func)
        def wrapper(*args: Hashable) -> Any:
            result = cache.get(args, _MISSING)
            if result is _MISSING:
                result = func(*args)
                cache.put(args, result)
            return result

        wrapper.cache = cache
        return wrapper

    return decorate
