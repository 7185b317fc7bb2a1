"""The two drafting baselines a vLLM user would otherwise pick, as vLLM runs them.

ngram  -- vLLM's `ngram` method (prompt lookup): find the longest n in [min_n, max_n]
          whose last-n-token suffix occurred earlier in the request's own tokens
          (prompt + output), take its earliest occurrence, draft up to k tokens after it.
suffix -- vLLM's `suffix` method: wraps the real `arctic_inference` SuffixDecodingCache
          (a per-request prompt tree plus one engine-wide tree of past responses),
          called the way vLLM's SuffixDecodingProposer calls it. Its response tree starts
          with the past outputs every method is given (`global_seed`), as the tree of a
          server that already served them would; the bench's `suffix-cold` starts empty.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from .drafter import Drafter, Request


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """vLLM's prompt-lookup rule on one context.

    Returns up to `k` tokens following the earliest earlier occurrence of the longest
    suffix n-gram (min_n <= n <= max_n) of `tokens`; empty if none. The occurrence must
    end before the last token, so at least one token follows it; it may overlap the suffix.
    """
    total = len(tokens)
    if total < min_n or k <= 0:
        return tokens[:0]
    # Ends j (<= total-2) of occurrences matching the suffix in its last token.
    ends = np.flatnonzero(tokens[: total - 1] == tokens[total - 1])
    best = int(ends[0]) if (ends.size and min_n <= 1) else -1
    # Extend backwards one token at a time; survivors stay sorted, so ends[0] is earliest.
    for d in range(1, min(max_n, total - 1)):
        ends = ends[ends >= d]
        ends = ends[tokens[ends - d] == tokens[total - 1 - d]]
        if ends.size == 0:
            break
        if d + 1 >= min_n:
            best = int(ends[0])
    if best < 0:
        return tokens[:0]
    return tokens[best + 1 : best + 1 + k]


class _TokenBuffer:
    """A request's tokens as a growing int32 array (capacity doubles), synced by appends."""

    def __init__(self) -> None:
        self.data = np.empty(1024, dtype=np.int32)
        self.size = 0

    def sync(self, tokens: list[int]) -> np.ndarray:
        if len(tokens) < self.size:  # the engine rewound: rebuild
            self.size = 0
        new = tokens[self.size :]
        if new:
            end = self.size + len(new)
            if end > len(self.data):
                grown = np.empty(max(end, 2 * len(self.data)), dtype=np.int32)
                grown[: self.size] = self.data[: self.size]
                self.data = grown
            self.data[self.size : end] = new
            self.size = end
        return self.data[: self.size]


class NgramDrafter(Drafter):
    """vLLM `ngram` (prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=5).

    Searches only the request's own tokens. `max_model_len`, if given, caps drafts so
    the sequence never exceeds it (as vLLM does); None means no cap.
    """

    name = "ngram"
    global_seed_outputs = 0  # it searches the request's own tokens only

    def __init__(self, min_n: int = 2, max_n: int = 4, k: int = 5,
                 max_model_len: int | None = None) -> None:
        assert 1 <= min_n <= max_n
        self.min_n, self.max_n, self.k = min_n, max_n, k
        self.max_model_len = max_model_len
        self._buffers: dict[tuple[str, str], _TokenBuffer] = {}

    def start(self, request: Request) -> None:
        self._buffers[(request.session, request.id)] = _TokenBuffer()

    def propose(self, batch: Sequence[Request], padded: bool = False) -> list[list[int]]:
        drafts = []
        for req in batch:
            buf = self._buffers.setdefault((req.session, req.id), _TokenBuffer())
            tokens = buf.sync(req.tokens)
            k = self.k
            if self.max_model_len is not None:
                k = min(k, self.max_model_len - len(tokens))
            drafts.append(ngram_propose(tokens, self.min_n, self.max_n, k).tolist())
        return drafts

    def finish(self, request: Request) -> None:
        self._buffers.pop((request.session, request.id), None)


def seed_responses(cache, outputs: Sequence[Sequence[int]], new_id) -> int:
    """Put past outputs into an arctic SuffixDecodingCache's tree of responses, as if it had
    served them (each under a fresh id from `new_id()`); returns how many went in."""
    seeded = 0
    for output in outputs:
        if len(output):
            arctic_id = new_id()
            cache.start_request(arctic_id, [])
            cache.add_active_response(arctic_id, list(output))
            cache.stop_request(arctic_id)
            seeded += 1
    return seeded


class SuffixDrafter(Drafter):
    """vLLM `suffix`: arctic-inference SuffixDecodingCache with vLLM's defaults.

    One cache for the whole drafter (vLLM keeps one per engine), so past responses are
    shared across sessions. Each request gets a fresh arctic id (a counter), so ids never
    collide even if the engine reuses `Request.id`.
    """

    def __init__(self, max_tree_depth: int = 24, max_spec_tokens: int = 32,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
                 max_cached_requests: int = 10000, max_model_len: int | None = None,
                 global_seed: Sequence[Sequence[int]] = (), name: str = "suffix") -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.max_tree_depth = max_tree_depth
        self.max_spec_tokens = max_spec_tokens
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.max_model_len = max_model_len
        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth,
                                         max_cached_requests=max_cached_requests)
        self._ids = itertools.count()
        # (session, request id) -> [arctic id, number of output tokens already added]
        self._active: dict[tuple[str, str], list] = {}
        self.name = name
        self.global_seed_outputs = seed_responses(self.cache, global_seed,
                                                  lambda: next(self._ids))

    def start(self, request: Request) -> None:
        key = (request.session, request.id)
        if key in self._active:  # restarted without finish: close the old one
            self.cache.stop_request(self._active.pop(key)[0])
        arctic_id = next(self._ids)
        self.cache.start_request(arctic_id, request.tokens[: request.num_prompt])
        self._active[key] = [arctic_id, 0]

    def _catch_up(self, request: Request) -> int:
        """Feed output tokens not yet given to arctic; returns the arctic id."""
        key = (request.session, request.id)
        if key not in self._active:
            self.start(request)
        state = self._active[key]
        output = request.output
        if len(output) > state[1]:
            self.cache.add_active_response(state[0], output[state[1] :])
            state[1] = len(output)
        return state[0]

    def propose(self, batch: Sequence[Request], padded: bool = False) -> list[list[int]]:
        drafts = []
        for req in batch:
            arctic_id = self._catch_up(req)
            budget = self.max_spec_tokens
            if self.max_model_len is not None:
                budget = min(budget, self.max_model_len - len(req.tokens) - 1)
            if budget <= 0:
                drafts.append([])
                continue
            draft = self.cache.speculate(
                arctic_id,
                req.tokens[-self.max_tree_depth :],
                max_spec_tokens=budget,
                max_spec_factor=self.max_spec_factor,
                min_token_prob=self.min_token_prob,
            )
            drafts.append([int(t) for t in draft.token_ids])
        return drafts

    def finish(self, request: Request) -> None:
        key = (request.session, request.id)
        if key not in self._active:
            return
        arctic_id = self._catch_up(request)
        self.cache.stop_request(arctic_id)
        del self._active[key]
