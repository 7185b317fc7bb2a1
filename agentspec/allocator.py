"""Spending a batch's draft budget where acceptance is likely.

Two allocators over the same per-request candidates:
- `agentspec_lengths`: AgentSpec's Algorithm 2 as written (redundancy score g = c/n * p(n),
  budget floor(alpha / bz), L_i = max(|CT*_i|, B_t * g_i / sum g)).
- `CostAware`: ours. It keeps, per role and match-length bucket, the online probability
  p_k that the k-th draft token is accepted, and gives a request its k-th token only while
  p_k >= lambda(b) * R. lambda(b) is the cost of verifying one more token at this batch size
  in units of one plain decoding token (shared/spec/cost-profile.md); R is the running
  speedup (tokens per unit of modeled cost). A draft token costs lambda(b) and yields p_k
  tokens, each worth 1/R of cost at the current rate: it pays only if p_k / lambda(b) > R.
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


def match_bucket(m: int) -> int:
    """Match-length buckets 1-2, 3-4, 5-8, ..., 129-256, 257+ (a followed copy's match keeps
    growing: long copies get buckets of their own)."""
    return min(8, max(0, (m - 1).bit_length() - 1))


class CostAware:
    """Online acceptance model: per (role, match-length bucket, source corpus) counts of
    'position k verified' and 'position k accepted'; P(k-th token accepted) is the product
    of per-position hazards."""

    def __init__(self, max_k: int = 64, prior: dict[str, dict[int, list[float]]] | None = None,
                 prior_weight: float = 16.0, window: float = 2000.0):
        self.max_k = max_k
        self.prior = prior or {}
        self.prior_weight = prior_weight
        self.window = window  # counts are halved past this many trials: follows drift
        self.trials: dict[tuple[str, int], np.ndarray] = {}
        self.hits: dict[tuple[str, int], np.ndarray] = {}
        self.tokens = self.cost = 1.0  # decayed sums behind the running speedup R

    def threshold(self, lam: float) -> float:
        return lam * self.tokens / self.cost

    def charge(self, lam: float, drafted: int, accepted: int, decay: float = 0.999) -> None:
        """One verified row: it cost 1 + lam * drafted and produced accepted + 1 tokens."""
        self.tokens = self.tokens * decay + accepted + 1
        self.cost = self.cost * decay + 1 + lam * drafted

    def _counts(self, role: str, m: int, source: str) -> tuple[np.ndarray, np.ndarray]:
        key = (role, match_bucket(m), source)
        shorter = (role, key[1] - 1, source)
        if key not in self.trials and shorter in self.trials and \
                not self.prior.get(role, {}).get(key[1]):
            # a copy followed into a longer bucket: start from what the shorter one learned
            hazard = self.hits[shorter] / self.trials[shorter]
            self.trials[key] = np.full(self.max_k, self.prior_weight)
            self.hits[key] = self.prior_weight * hazard
        if key not in self.trials:
            surv = np.ones(self.max_k)
            given = self.prior.get(role, {}).get(key[1])
            if given:
                surv[: min(len(given), self.max_k)] = given[: self.max_k]
                surv[len(given):] = given[-1] if len(given) else 0.5
            else:
                surv = 0.8 ** np.arange(1, self.max_k + 1)
            hazard = surv / np.concatenate([[1.0], surv[:-1]]).clip(min=1e-9)
            self.trials[key] = np.full(self.max_k, self.prior_weight)
            self.hits[key] = self.prior_weight * hazard.clip(0.0, 1.0)
        return self.trials[key], self.hits[key]

    def accept_probs(self, role: str, m: int, source: str = "") -> np.ndarray:
        trials, hits = self._counts(role, m, source)
        return np.cumprod(hits / trials)

    def length(self, role: str, m: int, cap: int, threshold: float,
               source: str = "") -> int:
        if m <= 0 or cap <= 0:
            return 0
        p = self.accept_probs(role, m, source)[: min(cap, self.max_k)]
        return int(np.count_nonzero(p >= threshold))

    def expected(self, role: str, m: int, source: str, n: int) -> float:
        """Expected accepted tokens of an n-token draft."""
        return float(np.sum(self.accept_probs(role, m, source)[:n])) if m > 0 else 0.0

    def observe(self, role: str, m: int, drafted: int, accepted: int,
                source: str = "", bonus: bool | None = None) -> None:
        """A verified draft; `bonus`, when known, says whether draft token drafted + 1
        would have been accepted."""
        if drafted <= 0 or m <= 0:
            return
        trials, hits = self._counts(role, m, source)
        seen = min(accepted + 1, drafted, self.max_k)
        trials[:seen] += 1
        hits[: min(accepted, self.max_k)] += 1
        if bonus is not None and drafted < self.max_k:  # the position just past the draft
            trials[drafted] += 1
            hits[drafted] += bonus
        if trials[0] > self.window:
            trials *= 0.5
            hits *= 0.5
