"""Spending a batch's draft budget where acceptance is likely.

Two allocators over the same per-request candidates:
- `agentspec_lengths`: AgentSpec's Algorithm 2 as written (redundancy score g = c/n * p(n),
  budget floor(alpha / bz), L_i = max(|CT*_i|, B_t * g_i / sum g)).
- `CostAware`: ours. It keeps, per role and draft source (for the policy: the corpus and
  whether the match's occurrences agree), the online hazard that a copy of length L
  continues, turns it into the probability p_k that the k-th draft token is accepted, and
  drafts the length n that maximizes p_1 + ... + p_n - R * C(n). C(n) is what
  verifying n draft tokens per row costs at this batch size, in plain decode steps (read
  off the measured cost profile, shared/spec/cost-profile.md, or lambda * n); R is the
  running speedup, so R * C(n) is what that time would have produced at the current rate.
  With linear costs this drafts token k while p_k >= lambda(b) * R.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def redundancy(c: int, n: int, g_min: float) -> float:
    """g(c, n) = c/n * p(n), p(n) = g_min + (1 - g_min)(1 - exp(1 - n))."""
    if n <= 0:
        return 0.0
    return c / n * (g_min + (1.0 - g_min) * (1.0 - math.exp(1 - n)))


def agentspec_lengths(cands: Sequence[tuple[int, int, int] | None], alpha: float,
                      g_min: float) -> list[int]:
    """Algorithm 2. `cands[i]` = (n, c, |CT*|) of request i, or None without candidates."""
    bz = len(cands)
    budget = math.floor(alpha / bz) if bz else 0
    g = [redundancy(c[1], c[0], g_min) if c else 0.0 for c in cands]
    total = sum(g)
    return [0 if c is None else max(c[2], int(budget * gi / total) if total > 0 else 0)
            for c, gi in zip(cands, g)]


COPY_BINS = 64


def copy_bin(length: int) -> int:
    """Bin of a copy length L >= 1: one per length up to 32, then four per doubling (a
    followed copy keeps growing past the longest match: up to ~2**12 tokens get bins)."""
    if length <= 32:
        return max(length, 1) - 1
    return min(COPY_BINS - 1, 32 + int(4 * math.log2(length / 32)))


# copy_bin of every length up to where the bins end (the hot path indexes this)
_BIN_OF = np.array([copy_bin(n) for n in range(8192)])


def copy_bins(lengths: np.ndarray) -> np.ndarray:
    return _BIN_OF[np.minimum(lengths, len(_BIN_OF) - 1)]


def hazard_counts(runs: Sequence[tuple[int, int]], max_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(trials, hits) per copy-length bin from (match length m, R) pairs, where R is how far
    a max_k-token draft after a match of length m matched: the j-th draft token continues a
    copy of length m + j, and it was reached when j <= R and accepted when j < R."""
    trials, hits = np.zeros(COPY_BINS), np.zeros(COPY_BINS)
    for m, r in runs:
        for j in range(min(r + 1, max_k)):
            b = copy_bin(m + j)
            trials[b] += 1
            hits[b] += j < r
    return trials, hits


# what one observation at a copy length adds to its bin and to the two on either side:
# copies of nearly the same length break alike, and one bin per length learns slowly alone
_SPREAD = np.array([0.25, 0.5, 1.0, 0.5, 0.25])


def _spread(counts: np.ndarray) -> np.ndarray:
    """Counts per bin (the prior's) spread as `CostAware.observe` spreads observations."""
    return np.convolve(counts, _SPREAD, mode="same")


class CostAware:
    """Online acceptance model: per (role, source), the hazard h(L) that a copy which
    already matched L tokens continues one more, from counts per copy-length bin. A draft of
    n tokens after a match of length m is accepted up to its k-th token with probability
    h(m) h(m+1) ... h(m+k-1): fresh matches and followed copies share one curve, so what
    the model learns at any length serves every draft that reaches it.

    Each count is spread over its neighbouring bins (`_SPREAD`), and counts are pooled in
    two levels: a role's curve over all sources starts from the Kmax profile's prior
    (replayed traces, often another model's outputs) and learns from every draft; a
    source's own counts are shrunk toward it with `source_weight` pseudo-trials. So a
    source seen rarely starts from what the model being served does elsewhere, not from
    the traces' prior, and a well-observed source stands on its own counts."""

    def __init__(self, max_k: int = 64,
                 prior: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                 prior_weight: float = 16.0, source_weight: float = 8.0,
                 window: float = 2000.0):
        self.max_k = max_k
        self.prior = prior or {}
        self.prior_weight = prior_weight
        self.source_weight = source_weight
        self.window = window  # a bin's counts are halved past this many trials: follows drift
        # (trials, hits) per copy-length bin: per role over every source, prior included,
        # and per (role, source), observations only
        self.pool: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.by_source: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        self.tokens = self.cost = 1.0  # decayed sums behind the running speedup R

    @property
    def rate(self) -> float:
        """R: tokens per plain decode step of cost, recently, and never below 1: drafting
        nothing already makes 1, so a worse recent rate must not make drafts look cheaper
        (which would lengthen the very drafts that brought it down)."""
        return max(1.0, self.tokens / self.cost)

    def charge(self, cost: float, accepted: int, decay: float = 0.999) -> None:
        """One verified row: it cost 1 + `cost` steps and produced accepted + 1 tokens."""
        self.tokens = self.tokens * decay + accepted + 1
        self.cost = self.cost * decay + 1 + cost

    def _pooled(self, role: str) -> tuple[np.ndarray, np.ndarray]:
        """The role's counts over every source, starting from the profile's prior."""
        if role not in self.pool:
            hazard, weight = np.full(COPY_BINS, 0.8), np.full(COPY_BINS, 4.0)
            if role in self.prior:
                trials, hits = (np.asarray(a, dtype=np.float64) for a in self.prior[role])
                seen = trials > 0
                if seen.any():
                    # bins the profile never reached take the hazard of the nearest
                    # shorter one that it did (or the first), with little weight
                    idx = np.maximum.accumulate(np.where(seen, np.arange(COPY_BINS), -1))
                    idx[idx < 0] = int(np.argmax(seen))
                    hazard = hits[idx] / trials[idx]
                    weight = np.where(seen, np.minimum(trials, self.prior_weight), 2.0)
            self.pool[role] = (_spread(weight), _spread(weight * hazard))
        return self.pool[role]

    def hazard(self, role: str, source: str) -> np.ndarray:
        """h per copy-length bin: the source's own counts, shrunk toward the role's pooled
        hazard, so a source seen rarely borrows what this model does on all the others."""
        pt, ph = self._pooled(role)
        if (role, source) not in self.by_source:
            return ph / pt
        t, h = self.by_source[role, source]
        w = self.source_weight
        return (h + w * ph / pt) / (t + w)

    def accept_probs(self, role: str, m: int, source: str = "", n: int | None = None) -> np.ndarray:
        """P(draft token k is accepted), k = 1..n (default max_k), after a match of length m."""
        n = self.max_k if n is None else n
        return np.cumprod(self.hazard(role, source)[copy_bins(m + np.arange(n))])

    def length(self, role: str, m: int, cap: int, costs: np.ndarray, source: str = "") -> int:
        """The draft length n <= cap that gains most: expected accepted tokens minus what
        the n tokens cost (costs[n], in plain steps) times R, each step's worth in tokens.
        With linear costs lambda * n this drafts token k while p_k >= lambda * R."""
        if m <= 0 or cap <= 0:
            return 0
        n = min(cap, self.max_k, len(costs) - 1)
        p = self.accept_probs(role, m, source, n)
        gain = np.concatenate(([0.0], np.cumsum(p))) - self.rate * np.asarray(costs[: n + 1])
        return int(np.argmax(gain))

    def expected(self, role: str, m: int, source: str, n: int) -> float:
        """Expected accepted tokens of an n-token draft."""
        return float(np.sum(self.accept_probs(role, m, source, min(n, self.max_k)))) \
            if m > 0 else 0.0

    def observe(self, role: str, m: int, drafted: int, accepted: int,
                source: str = "", bonus: bool | None = None) -> None:
        """A verified draft; `bonus`, when known, says whether draft token drafted + 1
        would have been accepted."""
        if drafted <= 0 or m <= 0:
            return
        # position j of the draft continues a copy of length m + j: reached when
        # j <= accepted, a hit when j < accepted; then the bonus position, when known
        reached = min(accepted + 1, drafted)
        lengths = m + np.arange(reached + (bonus is not None))
        hit = lengths < m + accepted
        if bonus is not None:
            hit[-1] = bonus
        bins = copy_bins(lengths)
        trials = _spread(np.bincount(bins, minlength=COPY_BINS).astype(np.float64))
        hits = _spread(np.bincount(bins, weights=hit, minlength=COPY_BINS))
        if (role, source) not in self.by_source:
            self.by_source[role, source] = (np.zeros(COPY_BINS), np.zeros(COPY_BINS))
        for t, h in (self._pooled(role), self.by_source[role, source]):
            t += trials
            h += hits
            full = t > self.window  # halve full bins: the model follows drift
            t[full] *= 0.5
            h[full] *= 0.5
