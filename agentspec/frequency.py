"""Frequency evidence beside the copies: what followed a short context across outputs.

Copying needs a context of a few tokens that occurred before; an agent that writes new prose
around short commands rarely gives one. SuffixDecoding's answer is statistics: over every
output the model wrote, how often each continuation followed the last few tokens. `OutputTree`
keeps one suffix tree over outputs (the G seed, finished outputs of every session, and each
running output as it grows) in arctic-inference's tree, and drafts its most frequent path,
with the tree's estimate of how likely each token is.

The policy's acceptance model learns, online, how often the served model actually takes such
a token, by how sure the tree was (the path's conditional frequency at that token) and how
long a context stood behind it, and weighs those drafts against its copies under one cost
model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


class FrequencyUnavailable(RuntimeError):
    """The suffix tree cannot be loaded here (arctic-inference is not installed)."""


# Classes of the tree's conditional frequency at a token: falling bands up to 1 (the only
# continuation seen, or inside a run of one). What each class is worth to the model being
# served is learned online: the policy's acceptance model keeps curves per draft kind.
_CLASS_EDGES = np.array([0.4, 0.6, 0.8, 0.999])
FREQUENCY_CLASSES = ("F<.4", "F<.6", "F<.8", "F<1", "F1")


@dataclass(frozen=True)
class FrequencyDraft:
    tokens: list[int]
    probs: list[float]  # the tree's cumulative probability of reaching each token
    match_len: int  # context tokens matched in the tree
    score: float  # SuffixDecoding's score of a draft (its probs summed): expected accepted tokens

    @property
    def classes(self) -> np.ndarray:
        """Each token's frequency class (an index into FREQUENCY_CLASSES): how sure the tree
        was of it, by P(token | tokens before it) as the tree counts it."""
        p = np.asarray(self.probs)
        conditional = p / np.concatenate(([1.0], p[:-1]))
        return np.searchsorted(_CLASS_EDGES, conditional, side="right")


NO_DRAFT = FrequencyDraft([], [], 0, 0.0)


class FrequencyTree:
    """One suffix tree over texts, each a sequence of its own; the oldest are evicted first
    past `max_texts`, as vLLM's suffix cache does."""

    def __init__(self, max_depth: int = 24, max_texts: int = 10_000):
        try:
            from arctic_inference.suffix_decoding._C import SuffixTree
        except ImportError as e:
            raise FrequencyUnavailable(
                f"arctic-inference's suffix tree is not importable ({e}); "
                "`full` drafts from copies only (scripts/setup.sh builds it)") from None
        self.tree = SuffixTree(max_depth)
        self.max_depth = max_depth
        self.max_texts = max_texts
        self._seqs: dict[int, None] = {}  # live sequences, oldest first
        self._next = 0
        self.running: dict[str, int] = {}  # request id -> its sequence
        self.error: str | None = None  # why the tree stopped taking text, if it did

    def _new_sequence(self) -> int:
        if len(self._seqs) >= self.max_texts:
            oldest = next(iter(self._seqs))
            del self._seqs[oldest]
            self.tree.remove(oldest)
        seq = self._next
        self._next += 1
        self._seqs[seq] = None
        return seq

    def add(self, tokens: Sequence[int]) -> None:
        """A finished text (e.g. an output of the G seed, a prompt)."""
        if len(tokens):
            self._extend(self._new_sequence(), tokens)

    def _extend(self, seq: int, tokens: Sequence[int]) -> None:
        if self.error is not None:
            return
        try:
            self.tree.extend(seq, list(tokens))
        except RuntimeError as e:  # the tree refused (e.g. a full child map): stop using it
            self.error = f"the frequency tree stopped: {e}"

    def start(self, request_id: str) -> None:
        self.running[request_id] = self._new_sequence()

    def extend(self, request_id: str, tokens: Sequence[int]) -> None:
        """Tokens a running request just wrote: drafts of every request see them at once."""
        seq = self.running.get(request_id)
        if seq in self._seqs:  # not evicted meanwhile
            self._extend(seq, tokens)

    def finish(self, request_id: str) -> None:
        self.running.pop(request_id, None)

    def draft(self, context: Sequence[int], max_tokens: int,
              min_token_prob: float = 0.1) -> FrequencyDraft:
        """The most frequent path after the best-scoring suffix of `context` (at most as many
        tokens as the context it matched, as SuffixDecoding drafts)."""
        ctx = list(context[-self.max_depth:])
        if len(ctx) < 2 or max_tokens <= 0 or self.error is not None:
            return NO_DRAFT
        d = self.tree.speculate(ctx, max_tokens, 1.0, 0.0, min_token_prob, False)
        if not d.token_ids:
            return NO_DRAFT
        return FrequencyDraft(d.token_ids, d.probs, d.match_len, d.score)


