"""What a draft token costs on this engine, learned from its own steps.

A cost profile is measured once, with every row drafting alike (`profile-lambda`). Served
batches are mixed: rows draft different lengths, some none, and a step's cost moves with
what the whole batch verifies. On vLLM's CPU build, for one, a profiled batch of 4 rows
pays 40% of a step for each row's first draft token (the batch leaves the pure-decode
path), while in a served batch, where some row nearly always drafts, a draft token costs
about 3% of a step; and a profile measured while the machine was busy overprices every
draft. So the engine reports each decode step (the draft length it verified in each row,
wall seconds) and `LearnedCosts` fits, with old steps fading,

    seconds = base + per_row * rows + per_drafting_row * rows_that_draft + per_draft * drafts

(a row that drafts at all pays a fixed part too: on vLLM's CPU build ~4 ms, two draft
tokens' worth, for the bookkeeping of a speculative row; on MLX, verifying 2 tokens
instead of 1 leaves the matrix-vector kernels), then prices n draft tokens per row at batch
size b as b * (per_drafting_row + n * per_draft) / step(b), zero for n = 0: what a step of
b rows that each draft n tokens costs beyond a plain step, in plain steps, the profile's
unit. (The policy charges a row that whole price because the step it lengthens carries all
b rows' tokens.) Until enough steps with varied drafts are seen, the prior (the profile's
curve, or a fixed lambda) stands.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

MIN_STEPS = 64  # decode steps seen before the fit replaces the prior
MIN_DRAFT_SPREAD = 1.0  # standard deviation of drafts per step the fit needs
DECAY = 0.998  # weight of a step per newer step: a half-life of ~350 steps
REFIT_EVERY = 32  # steps between refreshes of the prices the policy reads
TERMS = ("base", "per_row", "per_drafting_row", "per_draft")  # the fit's, in seconds
BASE, PER_ROW, PER_DRAFTING_ROW, PER_DRAFT = range(len(TERMS))


class LearnedCosts:
    def __init__(self, prior: Callable[[int, int], np.ndarray]):
        self.prior = prior
        # weighted sums of products of [1, rows, rows that draft, drafts, seconds]
        self.moments = np.zeros((5, 5))
        self.steps = 0
        self.coef: np.ndarray | None = None  # the TERMS once fitted

    def observe(self, verified: Sequence[int], seconds: float) -> bool:
        """One decode step that verified `verified[i]` draft tokens in row i; True when the
        prices changed (every REFIT_EVERY steps)."""
        rows, drafting, drafts = len(verified), sum(1 for n in verified if n), sum(verified)
        if rows <= 0 or seconds <= 0:
            return False
        if self.coef is not None and seconds > 3 * self._step(rows, drafting, drafts):
            return False  # a pause outside the step (a collection, another process)
        x = np.array([1.0, rows, drafting, drafts, seconds])
        self.moments = DECAY * self.moments + np.outer(x, x)
        self.steps += 1
        if self.steps % REFIT_EVERY or self.steps < MIN_STEPS:
            return False
        return self._fit()

    def state(self) -> dict[str, np.ndarray]:
        """What it learned, as named arrays (`restore` takes them back)."""
        return {"moments": self.moments.copy(), "steps": np.array([self.steps]),
                "coef": np.zeros(0) if self.coef is None else self.coef.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        moments, coef = state["moments"], state["coef"]
        if moments.shape != self.moments.shape or not np.isfinite(moments).all() \
                or coef.shape not in ((0,), (len(TERMS),)) or state["steps"].shape != (1,):
            raise ValueError("step costs: moments must be 5 x 5, a step count, and no fit "
                             "or one of 4 terms")
        self.moments = moments.astype(np.float64)
        self.steps = int(state["steps"][0])
        self.coef = coef.astype(np.float64) if len(coef) else None

    def _fit(self) -> bool:
        m = self.moments / self.moments[0, 0]  # weighted means of the products

        def spread(i: int, j: int = BASE) -> float:
            """Variance of term i minus term j (of term i alone by default)."""
            return m[i, i] - 2 * m[i, j] + m[j, j] - (m[0, i] - m[0, j]) ** 2

        if spread(PER_DRAFT) < MIN_DRAFT_SPREAD ** 2:
            return False
        # a term that another one fixes is left out: rows when one batch size was seen (the
        # intercept), the fixed part when every row always drafted (rows, or the intercept);
        # and so is a fixed part the steps price below zero
        varies = {PER_ROW: spread(PER_ROW),
                  PER_DRAFTING_ROW: min(spread(PER_DRAFTING_ROW),
                                        spread(PER_ROW, PER_DRAFTING_ROW))}
        used = [BASE] + [i for i, v in varies.items() if v > 0.01] + [PER_DRAFT]
        coef = self._solve(m, used)
        if coef[PER_DRAFTING_ROW] < 0:
            coef = self._solve(m, [i for i in used if i != PER_DRAFTING_ROW])
        if coef[PER_DRAFT] < 0 or coef[BASE] + coef[PER_ROW] <= 0:
            return False
        self.coef = coef
        return True

    @staticmethod
    def _solve(m: np.ndarray, used: list[int]) -> np.ndarray:
        seconds = len(TERMS)  # the moments' last column
        coef = np.zeros(len(TERMS))
        coef[used] = np.linalg.lstsq(m[np.ix_(used, used)], m[used, seconds], rcond=None)[0]
        return coef

    def _step(self, rows: int, drafting: int, drafts: int) -> float:
        return float(self.coef @ [1.0, rows, drafting, drafts])

    def draft_costs(self, b: int, max_k: int) -> np.ndarray:
        """C[n], n = 0..max_k: n draft tokens per row at batch size b, in plain steps."""
        if self.coef is None or self._step(b, 0, 0) <= 0:
            return self.prior(b, max_k)
        n = np.arange(max_k + 1, dtype=np.float64)
        extra = np.where(n > 0, self.coef[PER_DRAFTING_ROW], 0.0) + n * self.coef[PER_DRAFT]
        return b * extra / self._step(b, 0, 0)
