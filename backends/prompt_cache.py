"""KV caches of finished requests, reused by later requests that share their prefix.

An agent re-sends its whole history on every call, so most of a prompt was already
computed by the previous call of its session. Each finished request leaves its cache
(prompt + output); a new request starts from the entry with the longest common token
prefix, cut to that prefix, and prefills only the rest. Entries are bounded in bytes and
the least recently used goes first. Used only from the engine thread (MLX arrays).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from agentspec.backends import mlx as _engine  # noqa: F401  (loads OpenBLAS before MLX)

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402


@dataclass
class Entry:
    tokens: np.ndarray  # what the cache holds
    layers: list  # one KVCache per layer, exactly len(tokens) long
    nbytes: int


def _cut(layers: list, n: int) -> list:
    """Fresh KVCaches holding the first n positions of `layers` (the originals stay intact)."""
    out = []
    for c in layers:
        k = KVCache()
        if n > 0:
            k.keys = c.keys[..., :n, :]
            k.values = c.values[..., :n, :]
            k.offset = n
        out.append(k)
    return out


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PromptCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.nbytes = 0
        self._next = 0

    def fetch(self, tokens: list[int]) -> tuple[list | None, int]:
        """(a cache holding the longest cached prefix of `tokens`, its length); (None, 0)."""
        want = np.asarray(tokens, dtype=np.int64)
        best, best_n = None, 0
        for key, e in self.entries.items():
            n = _shared(e.tokens, want)
            if n > best_n:
                best, best_n = key, n
        if best is None:
            return None, 0
        self.entries.move_to_end(best)
        return _cut(self.entries[best].layers, best_n), best_n

    def store(self, tokens: list[int], layers: list) -> None:
        """Keep `layers` (single-row caches holding at least len(tokens) positions)."""
        n = len(tokens)
        if n == 0 or self.max_bytes <= 0:
            return
        layers = _cut(layers, n)
        for c in layers:  # own copies: the batch cache they came from keeps changing
            c.keys, c.values = mx.contiguous(c.keys), mx.contiguous(c.values)
        mx.eval([(c.keys, c.values) for c in layers])
        nbytes = sum(c.keys.nbytes + c.values.nbytes for c in layers)
        if nbytes > self.max_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int64)
        for key, e in list(self.entries.items()):  # an entry this one extends is redundant
            if len(e.tokens) <= n and _shared(e.tokens, arr) == len(e.tokens):
                self._drop(key)
        self.entries[self._next] = Entry(arr, layers, nbytes)
        self._next += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
