"""The match engine every drafting policy uses.

A `Corpus` is an append-only token stream with an index that answers one question fast:
what is the longest suffix of the current context that occurs in the corpus, and what
came after it?  `Corpus.match` applies this exact rule:

* length: the largest m (min_match <= m <= max_match, m <= len(context)) such that
  context[-m:] occurs in the corpus followed by at least one real token (matches and
  continuations never cross a document boundary).  No such m: Match(length=0).
* candidates: of the occurrences of that longest suffix, the `max_candidates` most recent.
* vote: candidates are grouped by their next 3 tokens (a continuation cut short by a
  boundary or the corpus end is keyed by what it has); the largest group wins, ties go to
  the group holding the most recent candidate; the chosen occurrence is the most recent
  one in the winning group.  `agree` is the group's size, `agreed` the length of the
  common prefix (<= k) of its members' continuations.

Design (numpy, optionally numba; no per-token Python work):

* Tokens live in one int32 buffer that starts with `max_match` boundary sentinels (-1) and
  keeps as many spare sentinel slots past its end, so every window around a position is a
  row of a strided view; boundaries (`end_document`) are the same sentinel, which never
  equals a token id (ids are >= 0).
* An entry is a position e whose token exists and is real (the continuation start).  For
  each *level* q (default 2, 3, 4, 8, 64 for min_match=2, max_match=64) every entry whose
  q tokens before it are real gets a 32-bit key: the high half of sum_i t[e-1-i]*B**(i+1)
  mod 2**64 (for a chunk of tokens by doubling, for a few by one small matrix product).
  Hash equality is only a hint: every occurrence used in an answer is compared against the
  real tokens first.
* The index of each level is an LSM: sorted runs of (key, position) pairs, ordered by key
  then position (so all occurrences of a q-gram are one slice, oldest first), plus a small
  unsorted tail of the newest entries scanned with one vectorized compare (the kernels,
  once it is large, follow the key's chain instead: each level's entries linked by key,
  newest first, so a lookup reads a key's entries, not the tail).  When the tail passes
  `tail_max` tokens it is sorted into a run (windows crossing a boundary are dropped then;
  in the tail the token check rejects them); a run is merged into the previous one while
  that one is at most MERGE_FACTOR times larger (a linear merge: newer positions are
  always larger, so no re-sort).  Runs of at least DIR_MIN entries store keys as a 2**16
  directory plus 16-bit low halves: 2 bytes per key instead of 4, and a lookup searches
  only its key's directory slot, not the whole run (fewer cache misses in a large
  corpus). From 2**16 entries: below, the directory's 256 KB a level outweighs what it
  saves.
* Lookup goes down the levels from the longest that fits the context.  The first level
  with a verified occurrence bounds the answer: m >= q there and m < the next level's q
  (which had none).  If the two are adjacent the answer is q and only the most recent
  occurrences are read (and verified); otherwise the level's occurrences are scanned newest
  first: exact lengths (2-D row compares) for a chunk, then older ones are kept only if
  they match the context one token beyond the best length so far (one gather), so the
  true maximum costs about one gather per occurrence.  Levels 2, 3, 4 are adjacent
  because short suffixes of code have huge occurrence lists.
* The vote reads each candidate's row once (q tokens back for the check, up to k ahead)
  and groups the next 3 tokens packed into one exact int64.
* Tokens are indexed lazily (in `flush`, called by `match` and by `extend` when enough are
  pending), so one-token appends stay cheap.
* max_tokens: when the tokens held pass max_tokens by a quarter, the oldest are dropped so
  that max_tokens remain; entries whose window reached into the dropped part are removed
  (a linear filter of every run, no re-sort).

* Optional numba kernels (agentspec/_match_nb.py, used when numba imports and
  AGENTSPEC_NO_NUMBA is not 1) do a whole lookup (every level and the vote) and the
  indexing of new tokens as compiled loops over the same structures: same answers, without
  the ~50 small numpy calls a lookup makes here.  The numpy code is their reference.

Positions (`Match.position`) count real tokens (not boundaries) since the corpus was
created, dropped ones included, so they stay valid across evictions.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from agentspec.allocator import token_rows
from agentspec.frequency import (EVIDENCE_EDGES, NO_DRAFT, SHARE_EDGES, FrequencyDraft,
                                 expected_accepted, frequency_classes)

TAIL_MAX = 8192  # tokens whose entries stay in the unsorted tail before becoming a run
MERGE_FACTOR = 4  # merge a run into the previous one while that one is <= this many times larger
DIR_MIN = 1 << 16  # runs with this many entries (or more) keep keys as directory + low 16 bits
CHUNK = 1 << 18  # tokens indexed per vectorized pass (bounds transient memory)
FLUSH_MIN = 2048  # extend indexes pending tokens once this many wait
SCAN_CHUNK = 256  # candidates whose exact length is computed at once while scanning

BOUNDARY = -1
_NEVER = -2  # what context ids that cannot be corpus tokens become
_INT32_MAX = 2**31 - 1
_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_KEY_MASK = _M32  # keys keep these bits (tests narrow it to make every bucket collide)
_PACK_LIMIT = (1 << 21) - 1  # ids below this: the vote packs 3 tokens (>= -1) into one int64
_CHAIN_FROM = 1024  # tail entries from which the kernels reach a key's entries by chains
_TAIL_START = 256  # initial tail capacity
_NO_CHAINS = np.zeros((0, 0), dtype=np.int32)  # the kernels' "no chains (yet)"
_PACK = np.array([1 << 42, 1 << 21, 1], dtype=np.int64)
_BASE = 0x9E3779B97F4A7C15  # odd: multiplication by it is a bijection mod 2**64

# numba kernels for the hot paths (agentspec/_match_nb.py) when numba imports, decided once
# here; AGENTSPEC_NO_NUMBA=1 keeps the numpy code, which is their reference.  A Corpus uses
# what this was when it was made.
_nb = None
if os.environ.get("AGENTSPEC_NO_NUMBA", "") != "1":
    try:
        from agentspec import _match_nb as _nb
    except Exception:  # not installed, or unusable here (say, no cache dir): numpy it is
        _nb = None


@dataclass
class Match:
    length: int  # m: tokens of the context's suffix matched (0 = no match), <= max_match
    tokens: list[int]  # continuation after the chosen occurrence, up to k tokens
    candidates: int  # n: occurrences of the longest match that were considered
    agree: int  # c: size of the majority group (same next 3 tokens as the chosen one)
    agreed: int  # |CT*|: common prefix length (<= k) of the majority group's continuations
    position: int  # corpus position where the chosen continuation starts (-1: no match)


NO_MATCH = Match(0, [], 0, 0, 0, -1)  # (never changed in place: every Match is replaced)


def _powers(n: int) -> np.ndarray:
    out, p = [], 1
    for _ in range(n + 1):
        out.append(p)
        p = (p * _BASE) & _M64
    return np.array(out, dtype=np.uint64)


def _key(h: np.ndarray) -> np.ndarray:
    """Hashes sum_i t[-1-i] * B**(i+1) mod 2**64 -> 32-bit keys (multiplicative hashing: the
    high half mixes every token in).  The numba kernels compute the same."""
    k = (h >> np.uint64(32)).astype(np.uint32)
    return k if _KEY_MASK == _M32 else k & np.uint32(_KEY_MASK)


def _window_hashes(s: np.ndarray, qs: Sequence[int], pw: np.ndarray) -> dict[int, np.ndarray]:
    """For each q: G[x] = sum_{i<q} s[x+q-1-i] * B**i (mod 2**64), for x in [0, len(s)-q]."""
    pow2 = {1: s}
    w = 1
    while 2 * w <= max(qs):
        g = pow2[w]
        pow2[2 * w] = g[w:] + pw[w] * g[: len(g) - w]
        w *= 2
    out = {}
    for q in qs:
        acc, width = None, 0
        p = 1 << (q.bit_length() - 1)
        while p:
            if q & p:
                g = pow2[p]
                if acc is None:
                    acc, width = g, p
                else:  # acc covers the older `width` tokens, g the newer p tokens
                    n = len(g) - width
                    acc = g[width:] + pw[p] * acc[:n]
                    width += p
            p >>= 1
        out[q] = acc
    return out


class _Keys:
    """Sorted uint32 keys: plain, or a 2**16 directory on the high halves plus low halves."""

    __slots__ = ("plain", "dir", "lo")

    def __init__(self, keys: np.ndarray, dir_min: int):
        if len(keys) >= dir_min:
            counts = np.bincount(keys >> np.uint32(16), minlength=1 << 16)
            self.dir = np.zeros((1 << 16) + 1, dtype=np.int32)
            np.cumsum(counts, out=self.dir[1:])
            self.lo = (keys & np.uint32(0xFFFF)).astype(np.uint16)
            self.plain = None
        else:
            self.plain = keys
            self.dir = self.lo = None

    def __len__(self) -> int:
        return len(self.plain) if self.plain is not None else len(self.lo)

    def full(self) -> np.ndarray:
        if self.plain is not None:
            return self.plain
        hi = np.repeat(np.arange(1 << 16, dtype=np.uint32), np.diff(self.dir))
        return (hi << np.uint32(16)) | self.lo

    @property
    def nbytes(self) -> int:
        if self.plain is not None:
            return self.plain.nbytes
        return self.dir.nbytes + self.lo.nbytes


class _Run:
    """Sorted (key, position) entries of every level, for the tokens in [start, end)."""

    __slots__ = ("keys", "pos", "start", "end")

    def __init__(self, keys: list[_Keys], pos: list[np.ndarray], start: int, end: int):
        self.keys, self.pos, self.start, self.end = keys, pos, start, end

    @classmethod
    def build(cls, keys: list[np.ndarray], pos: list[np.ndarray], start: int, end: int,
              dir_min: int) -> "_Run":
        """From entries (positions are unique and >= 0), each level sorted by key, then
        position: one sort of the pairs packed into uint64 (~10x a stable argsort)."""
        ks, ps = [], []
        for k, p in zip(keys, pos):
            packed = np.sort((k.astype(np.uint64) << np.uint64(32)) | p.astype(np.uint64))
            ks.append(_Keys((packed >> np.uint64(32)).astype(np.uint32), dir_min))
            ps.append((packed & np.uint64(_M32)).astype(np.int32))
        return cls(ks, ps, start, end)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes for k in self.keys) + sum(p.nbytes for p in self.pos)


def _merge(old: _Run, new: _Run, dir_min: int) -> _Run:
    """Merge two runs; every position in `new` is larger than every position in `old`."""
    keys, pos = [], []
    for ko, kn, po, pn in zip(old.keys, new.keys, old.pos, new.pos):
        a, b = ko.full(), kn.full()
        slots = a.searchsorted(b, "right") + np.arange(len(b))
        rest = np.ones(len(a) + len(b), dtype=bool)
        rest[slots] = False
        k = np.empty(len(a) + len(b), dtype=np.uint32)
        p = np.empty(len(a) + len(b), dtype=np.int32)
        k[slots], k[rest] = b, a
        p[slots], p[rest] = pn, po
        keys.append(_Keys(k, dir_min))
        pos.append(p)
    return _Run(keys, pos, old.start, new.end)


def _grown(a: np.ndarray, size: int, used: int) -> np.ndarray:
    """A tail array (entries along its last axis) with room for `size` entries, holding
    its first `used`."""
    out = np.empty(a.shape[:-1] + (size,), dtype=a.dtype)
    out[..., :used] = a[..., :used]
    return out


def default_levels(min_match: int, max_match: int) -> tuple[int, ...]:
    """min_match, +1, +2 (adjacent: short suffixes have huge occurrence lists), 8, max_match."""
    lv = {min_match, min_match + 1, min_match + 2, max(min_match + 3, 8), max_match}
    return tuple(sorted(q for q in lv if q <= max_match))


def put(buf: np.ndarray, at: int, tokens) -> None:
    """buf[at : at + len(tokens)] = tokens: a decoding step's few by item writes, which
    cost half of what converting the list for a slice does."""
    if len(tokens) <= 4:
        for i, t in enumerate(tokens, at):
            buf[i] = t
    else:
        buf[at : at + len(tokens)] = tokens


def context_ids(context) -> np.ndarray:
    """A lookup context as int32 ids; ids that cannot be tokens become _NEVER. A caller that
    looks up one context in several corpora converts it once."""
    if isinstance(context, np.ndarray):
        if context.dtype == np.int32:
            return context
        c = context.astype(np.int64)
        c[(c < 0) | (c > _INT32_MAX)] = _NEVER
        return c.astype(np.int32)
    try:
        return np.array(context, dtype=np.int32)
    except OverflowError:
        return np.array([t if 0 <= t <= _INT32_MAX else _NEVER for t in context], dtype=np.int32)


class ContextWindow:
    """The last `size` tokens of a token list that grows by a decoding step's few tokens at
    a time, as lookup context ids (`context_ids`). One buffer holds them: a step converts
    only the tokens added since it last read the list, and reads the window as a view."""

    def __init__(self, size: int):
        self.size = size
        self._buf = np.empty(4 * size + 64, dtype=np.int32)
        self._n = 0  # ids in the buffer
        self._seen = 0  # tokens of the list read into it

    def ids(self, tokens: Sequence[int]) -> np.ndarray:
        """The last `size` of `tokens` (the list read before, grown since) as ids: a view,
        valid until the next call. A list cut back, or grown by more than the window, is
        read anew."""
        n = len(tokens)
        if n < self._seen or n - self._seen > self.size:
            self._n, self._seen = 0, max(0, n - self.size)
        if n > self._seen:
            new = tokens[self._seen :]
            if self._n + len(new) > len(self._buf):  # what the window still needs: to the front
                keep = min(self._n, self.size - len(new))
                self._buf[:keep] = self._buf[self._n - keep : self._n]
                self._n = keep
            try:
                put(self._buf, self._n, new)
            except OverflowError:
                self._buf[self._n : self._n + len(new)] = context_ids(new)
            self._n += len(new)
            self._seen = n
        return self._buf[max(0, self._n - self.size) : self._n]


class Corpus:
    """Append-only token corpus answering longest-suffix-match queries (see module doc).

    max_tokens: keep at most this many tokens (the oldest go, in chunks of a quarter);
    min_match / max_match: shortest and longest suffix matched; max_candidates: how many of
    the most recent occurrences vote.  min_context: the shortest context indexed (default
    min_match; shorter ones are only read by `frequent_drafts`).
    levels: the indexed lengths (default: min_context up to min_match, then
    `default_levels`); tail_max: tokens in the unsorted tail before it becomes a sorted run
    (default TAIL_MAX; tiny values exercise runs and merges in tests).
    """

    def __init__(self, max_tokens: int | None = None, min_match: int = 2, max_match: int = 64,
                 max_candidates: int = 64, *, min_context: int | None = None,
                 levels: Sequence[int] | None = None, tail_max: int | None = None):
        min_context = min_match if min_context is None else min_context
        if not 1 <= min_context <= min_match <= max_match or max_candidates < 1:
            raise ValueError("need 1 <= min_context <= min_match <= max_match and "
                             "max_candidates >= 1")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be >= 1 (or None)")
        levels = tuple(levels) if levels is not None else \
            tuple(range(min_context, min_match)) + default_levels(min_match, max_match)
        if (list(levels) != sorted(set(levels)) or levels[0] != min_context
                or min_match not in levels or levels[-1] != max_match):
            raise ValueError("levels must be increasing, from min_context to max_match, "
                             "with min_match")
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._first = levels.index(min_match)  # copies read levels from this one on
        self.max_match = max_match
        self.max_candidates = max_candidates
        self.levels = levels
        self.tail_max = max(1, tail_max if tail_max is not None else TAIL_MAX)
        self._dir_min = DIR_MIN
        self._pw = _powers(max_match + 1)
        # sentinel padding at the buffer start: the longest window (and >= 3 for the vote)
        W = self._W = max(max_match, 3)
        # row l: B**(i+1) at column W-1-i for i < levels[l]: keys of a context's suffixes
        self._qmat = np.zeros((len(levels), W), dtype=np.uint64)
        for l, q in enumerate(levels):
            self._qmat[l, W - q :] = self._pw[1 : q + 1][::-1]
        # the buffer keeps >= W slots past the end, all BOUNDARY, so forward rows never clip
        self._buf = np.full(2 * W + 256, BOUNDARY, dtype=np.int32)
        self._sw = self._windows()
        self._n = self._W  # buffer slots used
        self._indexed = self._W  # entries e < _indexed are in the tail or a run
        self._tail_start = self._W  # entries in [_tail_start, _indexed) are in the tail
        nl = len(levels)
        # tail buffers grow up to tail_max (many small corpora stay small)
        cap = min(self.tail_max, _TAIL_START)
        # the tail holds every entry with a real token, its keys for all levels side by side
        # (windows that cross a boundary are only dropped when it becomes a run: until then
        # the token check rejects them)
        self._tail_keys = np.empty((nl, cap), dtype=np.uint32)
        self._tail_pos = np.empty(cap, dtype=np.int32)
        self._tail_len = 0
        # with the kernels, once the tail is large: its entries chained by key, per level
        # (_match_nb.CHAIN_BUCKETS): a lookup reads a key's entries, not the whole tail
        self._tail_head: np.ndarray | None = None
        self._tail_prev: np.ndarray | None = None
        self._runs: list[_Run] = []
        self._bounds: list[int] = []  # buffer indices of boundaries, increasing
        self._held = 0  # real tokens held
        self._max_id = -1  # largest token id ever added
        self._dropped = 0  # real tokens evicted so far
        self._nb = _nb
        self._state: tuple | None = None  # _nb_state, until what it holds changes
        if _nb is not None:
            self._levels_arr = np.array(levels, dtype=np.int64)
            self._mask = np.uint32(_KEY_MASK)
            self._pack_runs()

    # ------------------------------------------------------------------ updates

    def __len__(self) -> int:
        return self._held

    def reaches_open_end(self, m: Match) -> bool:
        """Whether m's continuation runs up to the last token held, in a document still
        being written (no end_document since)."""
        return (m.position >= 0 and m.position + len(m.tokens) == self._dropped + self._held
                and self._n > 0 and self._buf[self._n - 1] != BOUNDARY)

    @property
    def nbytes(self) -> int:
        """Bytes held by the token buffer, the runs and the tail."""
        return (self._buf.nbytes + sum(r.nbytes for r in self._runs)
                + self._tail_keys.nbytes + self._tail_pos.nbytes
                + sum(a.nbytes for a in (self._tail_head, self._tail_prev) if a is not None)
                + 8 * len(self._bounds))

    def documents(self) -> list[np.ndarray]:
        """The tokens held, one array per document, oldest first (the last one may still be
        open): what `extend` and `end_document` would build this corpus again from."""
        held = self._buf[self._W : self._n]
        pieces = np.split(held, np.flatnonzero(held == BOUNDARY))
        # every piece after the first starts at its boundary
        return [p.copy() for p in (pieces[0], *(q[1:] for q in pieces[1:])) if len(p)]

    def extend(self, tokens) -> None:
        """Append tokens (ids >= 0, < 2**31)."""
        if isinstance(tokens, (list, tuple)) and len(tokens) <= 32:  # decode-step sized
            t = tokens
            if not t:
                return
            lo = hi = t[0]
            for x in t:  # (isinstance against np.integer, an abstract class, is slow)
                if type(x) is not int and not isinstance(x, (int, np.integer)):
                    raise ValueError("tokens must be integers")
                if x < lo:
                    lo = x
                elif x > hi:
                    hi = x
        else:
            t = np.asarray(tokens)
            if t.size == 0:
                return
            if t.ndim != 1 or t.dtype.kind not in "iu":
                raise ValueError("tokens must be a 1-D sequence of integers")
            lo, hi = t.min(), t.max()
        if lo < 0 or hi > _INT32_MAX:
            raise ValueError("token ids must be in [0, 2**31)")
        if hi > self._max_id:
            self._max_id = int(hi)
        self._append(t)
        self._held += len(t)
        mt = self.max_tokens
        if mt is not None and self._held > mt + mt // 4:
            self._evict(self._held - mt)
        if self._n - self._indexed >= FLUSH_MIN:
            self.flush()

    def end_document(self) -> None:
        """A boundary: no match or continuation crosses it."""
        if self._buf[self._n - 1] != BOUNDARY:
            self._bounds.append(self._n)
            self._append(np.array([BOUNDARY], dtype=np.int32))

    def _append(self, t) -> None:
        end = self._n + len(t)
        if end + self._W > len(self._buf):
            if end + self._W > _INT32_MAX:
                raise OverflowError("corpus buffer is limited to 2**31 slots; set max_tokens")
            cap = max(end + self._W + 1024, len(self._buf) + len(self._buf) // 8)
            buf = np.full(cap, BOUNDARY, dtype=np.int32)
            buf[: self._n] = self._buf[: self._n]
            self._buf = buf
            self._sw = self._windows()
            self._state = None
        put(self._buf, self._n, t)
        self._n = end

    def _windows(self) -> np.ndarray:
        """Rows buf[r : r + W] (a view); other widths are made (and kept) on demand."""
        self._views: dict[int, np.ndarray] = {}
        return self._view(self._W)

    def _view(self, width: int) -> np.ndarray:
        v = self._views.get(width)
        if v is None:
            b, st = self._buf, self._buf.strides[0]
            v = as_strided(b, shape=(len(b) - width + 1, width), strides=(st, st),
                           writeable=False)
            self._views[width] = v
        return v

    def flush(self) -> None:
        """Index pending tokens now (match does it anyway; call it to keep match latency even)."""
        while self._indexed < self._n:
            a = self._indexed
            b = min(self._n, a + CHUNK)
            if b - self._tail_start > self.tail_max:  # tail + these become a run
                e, keys = self._entries(a, b)
                t0 = self._tail_len
                self._seal(np.concatenate((self._tail_pos[:t0], e)),
                           np.concatenate((self._tail_keys[:, :t0], keys), axis=1), b)
            else:
                self._to_tail(a, b)
            self._indexed = b

    def _to_tail(self, a: int, b: int) -> None:
        """The entries of [a, b) and their keys into the tail, which has room for them (the
        tail's entries lie in [tail start, b), at most tail_max)."""
        t0 = self._tail_len
        if t0 + (b - a) > len(self._tail_pos):  # room for every position of [a, b)
            size = min(self.tail_max, max(t0 + (b - a), 2 * len(self._tail_pos)))
            self._tail_keys = _grown(self._tail_keys, size, t0)
            self._tail_pos = _grown(self._tail_pos, size, t0)
            if self._tail_prev is not None:
                self._tail_prev = _grown(self._tail_prev, size, t0)
        if self._nb is not None:  # (one call: the keys go straight into the tail)
            self._tail_len = self._nb.index_tail(
                self._buf, a, b, self._pw, self._levels_arr, self._mask,
                self._tail_keys, self._tail_pos, t0, *self._chains())
            self._chain_if_long()
        else:
            e, keys = self._entries(a, b)
            self._tail_len = t0 + len(e)
            self._tail_keys[:, t0 : self._tail_len] = keys
            self._tail_pos[t0 : self._tail_len] = e
        self._state = None

    def _chain_if_long(self) -> None:
        """Chain the tail's entries by key once it holds _CHAIN_FROM (compiled only)."""
        if self._tail_head is None and self._tail_len >= _CHAIN_FROM:
            self._tail_head = np.empty((len(self.levels), self._nb.CHAIN_BUCKETS),
                                       dtype=np.int32)
            self._tail_prev = np.empty_like(self._tail_keys, dtype=np.int32)
            self._link_tail(self._tail_len)
            self._state = None

    def _chains(self) -> tuple[np.ndarray, np.ndarray]:
        """The tail's chains (head, prev) as the kernels take them."""
        if self._tail_head is None:
            return _NO_CHAINS, _NO_CHAINS
        return self._tail_head, self._tail_prev

    def _link_tail(self, n: int) -> None:
        """Chain the tail's first n entries anew (it was just made large, or filtered)."""
        self._tail_head.fill(-1)
        self._nb.link_tail(self._tail_keys, n, self._tail_head, self._tail_prev)

    def _entries(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions e in [a, b) whose token is real, and their keys at every level (L, n)."""
        if self._nb is not None:
            return self._nb.entry_keys(self._buf, a, b, self._pw, self._levels_arr,
                                       self._mask)
        real = self._buf[a:b] >= 0
        e = np.arange(a, b, dtype=np.int32)[real]
        if b - a <= 32:  # few: one small matrix product
            rows = self._sw[e - self._W].astype(np.uint64)
            return e, _key(self._qmat @ rows.T)
        Q = self.max_match
        hashes = _window_hashes(self._buf[a - Q : b].astype(np.uint64), self.levels, self._pw)
        keys = np.stack([hashes[q][Q - q : Q - q + (b - a)] for q in self.levels])
        return e, _key(keys[:, real] * self._pw[1])

    def _seal(self, e: np.ndarray, keys: np.ndarray, end: int) -> None:
        """Entries e (increasing, all before `end`) with keys (L, n) become a run; the tail
        is emptied.  Windows that cross a boundary are left out here."""
        start = self._tail_start
        if len(e):
            Q = self.max_match
            lo = int(e[0]) - Q
            neg = np.zeros(end - lo + 1, dtype=np.int32)
            np.cumsum(self._buf[lo:end] < 0, out=neg[1:])
            at = neg[e - lo]
            ks, ps = [], []
            for i, q in enumerate(self.levels):
                ok = at == neg[e - lo - q]
                ks.append(keys[i][ok])
                ps.append(e[ok])
            self._push(_Run.build(ks, ps, start, end, self._dir_min))
        self._tail_len = 0
        if self._tail_head is not None:
            self._tail_head.fill(-1)
        self._tail_start = end
        self._state = None

    def _push(self, run: _Run) -> None:
        runs = self._runs
        runs.append(run)
        while len(runs) >= 2 and runs[-2].size <= MERGE_FACTOR * runs[-1].size:
            new = runs.pop()
            runs[-1] = _merge(runs[-1], new, self._dir_min)
        if self._nb is not None:
            self._pack_runs()

    def _pack_runs(self) -> None:
        """The runs as the kernels read them: laid end to end in four arrays, located by a
        table (see `_match_nb`), rebuilt whenever the runs change (rarely). The runs' own
        arrays then become views of these, so the corpus holds each entry once."""
        runs = self._runs
        located = np.zeros((len(self.levels), len(runs), 4), dtype=np.int64)
        plain, dirs, lows, pos = [], [], [], []
        n_plain = n_dirs = n_lows = n_pos = 0  # what each array holds so far
        for r, run in enumerate(runs):
            for i, (k, p) in enumerate(zip(run.keys, run.pos)):
                if k.plain is not None:
                    located[i, r] = n_plain, -1, n_pos, len(p)
                    plain.append(k.plain)
                    n_plain += len(p)
                else:
                    located[i, r] = n_lows, n_dirs, n_pos, len(p)
                    lows.append(k.lo)
                    dirs.append(k.dir)
                    n_lows += len(p)
                    n_dirs += len(k.dir)
                pos.append(p)
                n_pos += len(p)
        keys_all, dirs_all, lows_all, pos_all = (
            np.concatenate(parts) if parts else np.empty(0, dtype=dtype) for parts, dtype in
            ((plain, np.uint32), (dirs, np.int32), (lows, np.uint16), (pos, np.int32)))
        for r, run in enumerate(runs):
            for i, k in enumerate(run.keys):
                start, d, p, n = located[i, r]
                run.pos[i] = pos_all[p : p + n]
                if d < 0:
                    k.plain = keys_all[start : start + n]
                else:
                    k.lo, k.dir = lows_all[start : start + n], dirs_all[d : d + len(k.dir)]
        self._packed = (keys_all, dirs_all, lows_all, pos_all, located)
        self._state = None

    def _evict(self, drop: int) -> None:
        """Drop the oldest `drop` real tokens (and whatever index entries saw them)."""
        W, bounds = self._W, self._bounds

        def real_before(c: int) -> int:
            return c - W - bisect.bisect_left(bounds, c)

        # first kept token: the smallest c with `drop` real tokens before it, itself real
        cut = W + bisect.bisect_left(range(W, self._n), drop + 1,
                                     key=lambda c: real_before(c + 1))
        shift = cut - W
        keep = self._n - cut
        self._buf[W : W + keep] = self._buf[cut : self._n]
        self._buf[W + keep : self._n] = BOUNDARY
        self._n = W + keep
        if len(self._buf) > 2 * (self._n + W + 1024):
            self._buf = self._buf[: self._n + W + 1024].copy()
            self._sw = self._windows()
        runs = []
        for run in self._runs:
            if run.end <= cut:
                continue
            ks, ps = [], []
            for i, q in enumerate(self.levels):
                p = run.pos[i]
                ok = p >= cut + q
                ks.append(_Keys(run.keys[i].full()[ok], self._dir_min))
                ps.append(p[ok] - shift)
            runs.append(_Run(ks, ps, max(run.start, cut) - shift, run.end - shift))
        self._runs = runs
        if self._nb is not None:
            self._pack_runs()
        n = self._tail_len
        ok = self._tail_pos[:n] >= cut  # windows reaching past the cut fail the token check
        m = int(ok.sum())
        self._tail_keys[:, :m] = self._tail_keys[:, :n][:, ok]
        self._tail_pos[:m] = self._tail_pos[:n][ok] - shift
        self._tail_len = m
        if self._tail_head is not None:
            self._link_tail(m)
        self._tail_start = max(self._tail_start, cut) - shift
        self._indexed = max(self._indexed, cut) - shift
        self._bounds = [x - shift for x in bounds if x >= cut]
        self._dropped += drop
        self._held -= drop
        self._state = None

    # ------------------------------------------------------------------ lookup

    def match(self, context, k: int) -> Match:
        """Longest suffix of `context` in the corpus and up to k tokens that followed it."""
        ctx = self._context(context)
        if self._nb is not None:  # all of the below, and the vote, in one compiled call
            window = self._lookup_window(ctx, k)
            if window is None:
                return NO_MATCH
            return self.looked_up(*self._nb.lookup(
                self._nb_state(), ctx, self._pw, self._levels_arr, self._first,
                self._mask, self.max_candidates, *window, self._n))
        if self._n > self._indexed:
            self.flush()
        L = len(ctx)
        if L < self.min_match or self._held == 0:
            return NO_MATCH
        levels = self.levels
        fwd = min(max(int(k), 3), self._W)  # continuation tokens read with each candidate
        # keys of the context's last q tokens (garbage for levels longer than L)
        keys = _key(self._qmat[:, self._W - L :] @ ctx.astype(np.uint64))
        top = bisect.bisect_right(levels, L) - 1
        for i in range(top, self._first - 1, -1):
            q = levels[i]
            cap = levels[i + 1] - 1 if i < top else L
            parts = self._occurrences(i, keys[i])
            if not parts:
                continue
            if cap == q:
                m, found = q, self._recent(parts, q, ctx, fwd)
            else:
                m, found = self._scan(parts, q, cap, ctx, fwd)
            if found is not None:
                return self._vote(*found, q, m, k)
        return NO_MATCH

    def _lookup_window(self, ctx: np.ndarray, k: int) -> tuple[int, int] | None:
        """A compiled lookup of an int32 context (`_context`) up to its kernel call: (the
        continuation's most tokens, the first buffer slot the kernel indexes), or None where
        nothing can match. The tokens added since the last lookup that fit the tail as it
        is are indexed in the kernel's own call (a decoding step's few); others now."""
        if len(ctx) < self.min_match or not self._held:
            self.flush()
            return None
        a = self._indexed
        if self._tail_len + self._n - a > len(self._tail_pos) \
                or self._n - self._tail_start > self.tail_max:
            self.flush()  # (more than the tail holds as it is)
            a = self._indexed
        self._indexed = self._n
        return min(int(k), self._n), a

    def looked_up(self, m: int, chosen: int, n_cand: int, members: int, agreed: int, n: int,
                  tail_len: int) -> Match:
        """The Match of `_match_nb.lookup`'s answer (see `_lookup_window`, `copy_lookup`)."""
        self.indexed_to(tail_len)
        if not m:
            return NO_MATCH
        return self._answer(m, chosen, self._buf[chosen : chosen + n], n_cand, members, agreed)

    def indexed_to(self, tail_len: int) -> None:
        """Take the tail's length a compiled lookup left (it indexed the step's tokens)."""
        if tail_len != self._tail_len:
            self._tail_len, self._state = tail_len, None
        self._chain_if_long()

    def position(self, slot: int) -> int:
        """The corpus position (`Match.position`) of buffer slot `slot`."""
        return self._dropped + slot - self._W - bisect.bisect_left(self._bounds, slot)

    def _recent_occurrences(self, i: int, key: np.uint32, q: int, ctx: np.ndarray, top: int,
                            cap: int, want: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The `want` most recent occurrences of the context's last q tokens (level i's
        key), most recent first: their positions, the cap tokens after each (-1 from where
        it ended) and how many context tokens before each match (up to top)."""
        parts = self._occurrences(i, key)
        found = self._recent(parts, q, ctx, cap, want) if parts else None
        if found is None:
            return np.zeros(0, np.int64), np.zeros((0, cap), np.int32), np.zeros(0, np.int64)
        e, rows = found
        conts = rows[:, q : q + cap]
        conts = np.where(np.logical_or.accumulate(conts < 0, axis=1), -1, conts)
        return e, conts, self._lengths(e, q, top, ctx)

    def _open_start(self) -> int:
        """Buffer index where the document being written starts (the end: none is open).
        Every boundary after the sentinels is in _bounds, so the last one ends the
        documents before it."""
        return self._bounds[-1] + 1 if self._bounds else self._W

    def _nb_state(self) -> tuple:
        """This corpus as the kernels read it (`_match_nb`'s corpus tuple); kept until an
        array in it is replaced or the tail's length changes (where `_state` is reset)."""
        if self._state is None:
            self._state = (*self._packed, self._tail_keys, self._tail_pos, self._tail_len,
                           *self._chains(), self._buf)
        return self._state

    def _context(self, context) -> np.ndarray:
        """The last max_match ids as int32 (see `context_ids`)."""
        c = context_ids(context[-self.max_match :])
        if self._nb is None and len(c) and c.min() < 0:  # (the kernel does this itself)
            c = np.where(c < 0, _NEVER, c).astype(np.int32)
        return c

    def _occurrences(self, i: int, v32: np.uint32) -> list[np.ndarray]:
        """Positions whose level-i key is v32: arrays in increasing position order."""
        parts = []
        v = int(v32)
        for run in self._runs:
            keys = run.keys[i]
            a = keys.plain
            if a is not None:
                lo = int(a.searchsorted(v32))
                if lo == len(a) or a.item(lo) != v:
                    continue
                hi = int(a.searchsorted(v32, "right"))
            else:
                d, hb = keys.dir, v >> 16
                s, e = d.item(hb), d.item(hb + 1)
                if s == e:
                    continue
                a = keys.lo[s:e]
                low = v & 0xFFFF
                lo = int(a.searchsorted(low))
                if lo == e - s or a.item(lo) != low:
                    continue
                lo, hi = s + lo, s + int(a.searchsorted(low, "right"))
            parts.append(run.pos[i][lo:hi])
        n = self._tail_len
        if n:
            hit = (self._tail_keys[i, :n] == v32).nonzero()[0]
            if hit.size:
                parts.append(self._tail_pos[hit])
        return parts

    def _recent(self, parts: list[np.ndarray], q: int, ctx: np.ndarray, fwd: int,
                want: int | None = None):
        """The most recent `want` (default max_candidates) positions e of `parts` whose q
        tokens before them are the context's last q, most recent first, with rows
        buf[e - q : e + fwd]; or None."""
        want = want or self.max_candidates
        view = self._view(q + fwd)
        target = ctx[len(ctx) - q :]
        # usually every hash hit is a real occurrence: check the newest `want` at once
        e = parts[-1][-want:] if len(parts) == 1 else \
            np.concatenate([p[-want:] for p in parts])[-want:]
        e = e[::-1]
        rows = view[e - q]
        if (rows[:, :q] == target).all():
            return e, rows
        got_e, got_rows = [], []
        have = 0
        for part in reversed(parts):
            end = len(part)
            while end > 0 and have < want:
                start = max(0, end - (want - have))
                e = part[start:end][::-1]
                rows = view[e - q]
                ok = (rows[:, :q] == target).all(axis=1)
                if not ok.all():
                    e, rows = e[ok], rows[ok]
                got_e.append(e)
                got_rows.append(rows)
                have += len(e)
                end = start
            if have >= want:
                break
        if not have:
            return None
        if len(got_e) == 1:
            return got_e[0], got_rows[0]
        return np.concatenate(got_e), np.concatenate(got_rows)

    def _scan(self, parts: list[np.ndarray], q: int, cap: int, ctx: np.ndarray, fwd: int):
        """All occurrences at level q, whose true length lies in [q, cap]: (m, _recent of the
        longest).  Newest first, in chunks: once a length `best` is known, an older candidate
        can only beat it if it matches the context `best + 1` tokens back, one gather each."""
        buf, L = self._buf, len(ctx)
        P = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if len(P) <= SCAN_CHUNK:  # one chunk: exact lengths of all, newest of the longest
            lengths = self._lengths(P, q, cap, ctx)
            best = int(lengths.max())
            if best < q:
                return 0, None
            found = P[lengths == best][-self.max_candidates :]
            return best, self._recent([found], q, ctx, fwd)
        best, rest = q - 1, P
        while len(rest) and best < cap:
            chunk, rest = rest[-SCAN_CHUNK:], rest[:-SCAN_CHUNK]
            top = int(self._lengths(chunk, q, cap, ctx).max())
            if top > best:
                best = top
                if len(rest) and best < cap:
                    rest = rest[buf[rest - (best + 1)] == ctx[L - best - 1]]
        if best < q:
            return 0, None
        # the newest max_candidates of length `best` (all of them end `best` tokens back)
        cand = P if best == q else P[buf[P - best] == ctx[L - best]]
        want, got, have = self.max_candidates, [], 0
        end = len(cand)
        while end > 0 and have < want:
            start = max(0, end - max(want - have, SCAN_CHUNK))
            e = cand[start:end]
            e = e[self._lengths(e, q, cap, ctx) == best]
            got.append(e[-(want - have):])
            have += len(got[-1])
            end = start
        found = np.concatenate(got[::-1]) if len(got) > 1 else got[0]
        return best, self._recent([found], q, ctx, fwd)

    def _lengths(self, e: np.ndarray, q: int, cap: int, ctx: np.ndarray) -> np.ndarray:
        """Exact match lengths (capped at cap) of candidates e; -1 where under q."""
        eq = self._view(cap)[e - cap] == ctx[len(ctx) - cap :]
        run = np.logical_and.accumulate(eq[:, ::-1], axis=1).sum(axis=1)
        return np.where(run >= q, run, -1)

    def _vote(self, e: np.ndarray, rows: np.ndarray, q: int, m: int, k: int) -> Match:
        """e: candidates, most recent first; rows[j] = buf[e_j - q : e_j + fwd] (a copy)."""
        n_cand = len(e)
        if n_cand == 1:
            i, same = 0, None
        else:
            # the continuation's first token is real; the third counts only if the second is
            ended = rows[:, q + 1] < 0
            if ended.any():
                rows[:, q + 2][ended] = BOUNDARY
            if self._max_id < _PACK_LIMIT:  # next 3 tokens as one exact int64
                key = rows[:, q : q + 3] @ _PACK
            else:  # ids up to 2**31: first two tokens as one int64, vote on (that, third)
                key = list(zip(rows[:, q : q + 2].copy().view(np.int64)[:, 0].tolist(),
                               rows[:, q + 2].tolist()))
            keys = key if isinstance(key, list) else key.tolist()
            count = Counter(keys)
            top = max(count.values())
            if top == n_cand:
                i, same = 0, slice(None)
            else:
                i = next(j for j, x in enumerate(keys) if count[x] == top)  # most recent
                same = np.array([x == keys[i] for x in keys]) if isinstance(key, list) \
                    else key == keys[i]
        chosen = int(e[i])
        seg = self._buf[chosen : chosen + max(int(k), 0)]
        stop = (seg < 0).nonzero()[0]
        tokens = seg[: stop[0]] if stop.size else seg
        n = len(tokens)
        agreed = n
        members = 1 if same is None else (n_cand if isinstance(same, slice) else int(same.sum()))
        if members > 1 and n:
            if n <= rows.shape[1] - q:
                conts = rows[same][:, q : q + n]
            else:
                conts = self._buf.take(e[same][:, None] + np.arange(n), mode="clip")
            eq = conts == tokens
            if not eq.all():
                agreed = int(np.logical_and.accumulate(eq, axis=1).sum(axis=1).min())
        return self._answer(m, chosen, tokens, n_cand, members, agreed)

    def _answer(self, m: int, chosen: int, tokens: np.ndarray, n_cand: int, members: int,
                agreed: int) -> Match:
        """The Match for buffer index `chosen`, whose continuation is `tokens`."""
        return Match(m, tokens.tolist(), n_cand, members, agreed, self.position(chosen))


# SuffixDecoding's search, as the policy runs it: contexts of up to MAX_CONTEXT tokens, the
# OCCURRENCES most recent of each, paths cut before a token under MIN_PROB
MAX_CONTEXT, OCCURRENCES, MIN_PROB = 8, 16, 0.1


def frequent_drafts(session: Corpus, outputs: Corpus | None, context, k: int,
                    max_context: int = MAX_CONTEXT, occurrences: int = OCCURRENCES,
                    min_prob: float = MIN_PROB,
                    worth: np.ndarray | None = None) -> tuple[FrequencyDraft, FrequencyDraft]:
    """SuffixDecoding's drafts for a request whose output is being written at the end of
    `session` (its open document; `context` ends there): one from the session's text, one
    from every output (`outputs`' and the one being written). For each context length
    m <= max_context that occurs, the most frequent path (`_frequent_path`, at most m and k
    tokens) after the occurrences at least that long among the `occurrences` most recent
    (in each corpus) of the longest indexed length <= m; each draft is the path with the
    highest score: its expected accepted tokens under `worth[d]` for draft d
    (`frequency.expected_accepted`, a table per frequency class and matched length), or
    without one, as SuffixDecoding scores a path, its probabilities summed. A path after m
    tokens scores at most min(m, k), so shorter contexts are only read while they could
    still win.
    The context counts as an occurrence too, one whose next token is not written yet, where
    its last m tokens lie in the open document (as a suffix tree over the text being written
    does). Both corpora index the same lengths (`Corpus(min_context=1)` reads one-token
    contexts)."""
    ctx = _frequent_context(session, outputs, session._context(context), k)
    if ctx is None:
        return NO_DRAFT, NO_DRAFT
    if _compiled(session, outputs):
        k = int(k)
        found, found_tokens = frequent_buffers(k)
        session._nb.frequent(*_frequent_args(session, outputs, ctx, k, max_context, occurrences,
                                             min_prob, worth), found, found_tokens)
        header = found[:6].tolist()
        return _found_draft(found, found_tokens, header, 0, k), \
            _found_draft(found, found_tokens, header, 1, k)
    s_open = session._open_start()
    open_len = session._n - s_open  # (a document holds no boundary)
    L, levels = len(ctx), session.levels
    keys = _key(session._qmat[:, session._W - L :] @ ctx.astype(np.uint64))
    best = [NO_DRAFT, NO_DRAFT]
    for i in range(len(levels) - 1, -1, -1):
        q = levels[i]
        if q > min(L, max_context):
            continue
        top = min(L, max_context, levels[i + 1] - 1 if i + 1 < len(levels) else L)
        if min(d.score for d in best) >= min(top, int(k)):
            break
        cap = min(top, int(k))
        e, conts, lens = session._recent_occurrences(i, keys[i], q, ctx, top, cap, occurrences)
        from_s = (conts, lens, np.ones(len(e), bool))
        # every output: the session's open document, then the other outputs
        from_outputs = [(conts, lens, e >= s_open)]
        if outputs is not None:
            _, g_conts, g_lens = outputs._recent_occurrences(i, keys[i], q, ctx, top, cap,
                                                             occurrences)
            from_outputs.append((g_conts, g_lens, np.ones(len(g_lens), bool)))
        for m in range(top, q - 1, -1):
            for d, sources in enumerate(([from_s], from_outputs)):
                if best[d].score >= m:
                    continue
                rows = [c[(l >= m) & use] for c, l, use in sources]
                rows = np.concatenate(rows)[:, : min(m, int(k))]
                if not len(rows):
                    continue
                tokens, probs, evidence = _frequent_path(rows, int(m <= open_len), min_prob)
                classes = frequency_classes(probs, evidence)
                score = sum(probs) if worth is None else expected_accepted(classes, m, worth[d])
                if score > best[d].score:
                    best[d] = FrequencyDraft(tokens, probs, evidence, classes, m, score)
    return best[0], best[1]


_NO_WORTH = np.zeros((0, 0, 0))  # (the kernel's "no table")


def frequent_candidate(session: Corpus, outputs: Corpus | None, context, k: int,
                       kinds: np.ndarray, token_classes: np.ndarray, prefix_ids: np.ndarray,
                       prefix_rows: np.ndarray, session_text: bool = True,
                       max_context: int = MAX_CONTEXT, occurrences: int = OCCURRENCES,
                       min_prob: float = MIN_PROB,
                       worth: np.ndarray | None = None
                       ) -> tuple[list[int], int, np.ndarray, np.ndarray] | None:
    """The draft a policy takes of `frequent_drafts`' two (the session's text's where
    `session_text` and it scores higher, else every output's) as the policy's acceptance
    model reads it: (tokens, context length m, ids, rows). ids: prefix_ids (the token before
    the draft, then the tokens of a draft it continues), then its tokens; rows: prefix_rows,
    then each token's kind (kinds[0] from the session's text, kinds[1] from every output,
    by frequency class) plus its token class (`token_classes`, ids past it taking its last;
    empty: none). None: no draft. Compiled, the search and all of this are one call."""
    ctx = _frequent_context(session, outputs, session._context(context), k)
    if ctx is None:
        return None
    if _compiled(session, outputs):
        k, p = int(k), len(prefix_rows)
        found, found_tokens = frequent_buffers(k)
        ids, rows = np.empty(p + 1 + k, dtype=np.int64), np.empty(p + k, dtype=np.int64)
        length, m = session._nb.frequent_candidate(
            *_frequent_args(session, outputs, ctx, k, max_context, occurrences, min_prob, worth),
            found, found_tokens, session_text, kinds, token_classes, prefix_ids, prefix_rows,
            ids, rows)
        if not m:
            return None
        return ids[p + 1 : p + 1 + length].tolist(), int(m), ids[: p + 1 + length], \
            rows[: p + length]
    local, every = frequent_drafts(session, outputs, ctx, k, max_context, occurrences, min_prob,
                                   worth)
    from_session = session_text and local.score > every.score
    d = local if from_session else every
    if not d.tokens:
        return None
    rows = token_rows(kinds[0 if from_session else 1].take(d.classes), d.tokens, token_classes)
    return d.tokens, d.match_len, np.concatenate((prefix_ids, d.tokens)).astype(np.int64), \
        np.concatenate((prefix_rows, rows)).astype(np.int64)


def search_constants(corpus: Corpus) -> tuple:
    """What the compiled plan (`_policy_nb.plan_request`) reads of the corpora that never
    changes, in its order: their hash powers, levels and key mask, the first level copies
    read and the occurrences that vote on a copy, then the frequency search's constants
    (see `frequent_drafts`). A policy's corpora are made alike, so one corpus gives them."""
    return (corpus._pw, corpus._levels_arr, corpus._mask, corpus._first,
            corpus.max_candidates, OCCURRENCES, MAX_CONTEXT, MIN_PROB, SHARE_EDGES,
            EVIDENCE_EDGES)


def plan_reads(session: Corpus, outputs: Corpus | None, context: np.ndarray, k: int,
               look: bool) -> tuple:
    """What the compiled plan reads of the corpora in a step, in its order: the corpus
    tuple of `session` (the request writes at its end), where its open document starts and
    how many tokens it holds, the tuple of `outputs` (None: the session's, unread) and
    whether it is read, the context, and for a copy looked up in `session` (`look`, as
    `Corpus.match` does it in its kernel): the continuation's most tokens (0: no lookup),
    then the buffer slots [a, b) the kernel indexes first (a lookup leaves a step's few
    new tokens to its kernel; the search reads them after it). Both corpora index the same
    levels (`search_constants`). context: int32 ids (`context_ids`)."""
    if outputs is not None and outputs._indexed < outputs._n:
        outputs.flush()
    window = session._lookup_window(context, k) if look else None
    if session._indexed < session._n:  # (no lookup: the search reads every token indexed)
        session.flush()
    s_open = session._open_start()
    look_k, a = window or (0, 0)
    return (session._nb_state(), s_open, session._n - s_open,
            (session if outputs is None else outputs)._nb_state(), outputs is not None,
            context, look_k, a, session._n)


def _frequent_context(session: Corpus, outputs: Corpus | None, ctx: np.ndarray, k: int
                      ) -> np.ndarray | None:
    """ctx (int32, at most max_match ids) as the search reads it, both corpora indexed up to
    their last token; None where no draft can follow (a context under the shortest indexed
    length, or k <= 0)."""
    if session._indexed < session._n:
        session.flush()
    if outputs is not None:
        if outputs._indexed < outputs._n:
            outputs.flush()
        if outputs.levels != session.levels or outputs.max_match != session.max_match:
            raise ValueError("frequent_drafts: both corpora need the same levels and max_match")
    return None if len(ctx) < session.levels[0] or k <= 0 else ctx


def _compiled(session: Corpus, outputs: Corpus | None) -> bool:
    return session._nb is not None and (outputs is None or outputs._nb is not None)


def _frequent_args(session: Corpus, outputs: Corpus | None, ctx: np.ndarray, k: int,
                   max_context: int, occurrences: int, min_prob: float,
                   worth: np.ndarray | None) -> tuple:
    """What `_match_nb.frequent` reads, up to its output buffers (without outputs, the
    session stands in for them, unread)."""
    s_open = session._open_start()
    g = outputs if outputs is not None else session
    return (session._nb_state(), s_open, session._n - s_open, g._nb_state(),
            outputs is not None, ctx, session._pw, session._levels_arr, session._mask,
            occurrences, k, max_context, min_prob, SHARE_EDGES, EVIDENCE_EDGES,
            _NO_WORTH if worth is None else worth)


def _found_draft(found: np.ndarray, found_tokens: np.ndarray, header: list, d: int, k: int
                 ) -> FrequencyDraft:
    """Draft d as the compiled search wrote it (see `_match_nb.frequent`)."""
    length, m = int(header[3 * d]), int(header[3 * d + 1])
    if not m:
        return NO_DRAFT
    at = 3 * d * k
    ints = found_tokens[at : at + 3 * length].tolist()
    return FrequencyDraft(ints[:length], found[6 + d * k : 6 + d * k + length].tolist(),
                          ints[length : 2 * length], ints[2 * length :], m, header[3 * d + 2])


_buffers = threading.local()


def frequent_buffers(k: int, shared: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Where the compiled search writes its drafts of at most k tokens: a pair per k and
    thread, for a caller that reads them out at once, else (`shared` False) a pair of its
    own."""
    if not shared:
        return np.empty(6 + 2 * k), np.empty(6 * k, dtype=np.int64)
    pairs = _buffers.__dict__
    if k not in pairs:
        pairs[k] = frequent_buffers(k, shared=False)
    return pairs[k]


def _frequent_path(continuations: np.ndarray, unwritten: int,
                   min_prob: float) -> tuple[list[int], list[float], list[int]]:
    """The most frequent path through occurrences' continuations (rows, most recent first;
    -1 where one ended), with `unwritten` more occurrences whose next token is not known: at
    each step the token most of the occurrences still on the path continue with (a tie goes
    to the most recent), its probability the product of those shares; it stops before a
    token whose probability falls under min_prob. Returns the tokens, their probabilities
    and their evidence (how many occurrences continue with each)."""
    tokens, probs, evidence, p = [], [], [], 1.0
    rows = continuations
    for j in range(continuations.shape[1]):
        column = rows[:, j]
        real = column[column >= 0]
        if not len(real):
            break
        values, first, counts = np.unique(real, return_index=True, return_counts=True)
        top = np.lexsort((first, -counts))[0]
        total = len(column) + (unwritten if j == 0 else 0)
        if p * counts[top] / total < min_prob:  # (in the kernel's order: the same roundings)
            break
        p = p * counts[top] / total
        tokens.append(int(values[top]))
        probs.append(p)
        evidence.append(int(counts[top]))
        rows = rows[column == values[top]]
    return tokens, probs, evidence
