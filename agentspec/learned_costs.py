"""What a draft token costs on this engine, learned from its own steps.

A cost profile is measured once, with every row drafting alike (`profile-lambda`). Served
batches are mixed: rows draft different lengths, some none, and a step's cost moves with
what the whole batch verifies. On vLLM's CPU build, for one, a profiled batch of 4 rows
pays 40% of a step for each row's first draft token (the batch leaves the pure-decode
path), while in a served batch, where some row nearly always drafts, a draft token costs
about 3% of a step; and a profile measured while the machine was busy overprices every
draft. So the engine reports each decode step (rows, draft tokens verified, wall seconds)
and `LearnedCosts` fits, with old steps fading,

    seconds = base + per_row * rows + per_draft * drafts

then prices n draft tokens per row at batch size b as b * n * per_draft / step(b): what a
step of b rows that each draft n tokens costs beyond a plain step, in plain steps, the
profile's unit. (The policy charges a row that whole price because the step it lengthens
carries all b rows' tokens.) Until enough steps with varied drafts are seen, the prior (the
profile's curve, or a fixed lambda) stands.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

MIN_STEPS = 64  # decode steps seen before the fit replaces the prior
MIN_DRAFT_SPREAD = 1.0  # standard deviation of drafts per step the fit needs
DECAY = 0.998  # weight of a step per newer step: a half-life of ~350 steps
REFIT_EVERY = 32  # steps between refreshes of the prices the policy reads


class LearnedCosts:
    def __init__(self, prior: Callable[[int, int], np.ndarray]):
        self.prior = prior
        self.moments = np.zeros((4, 4))  # weighted sums of [1, rows, drafts, seconds] products
        self.steps = 0
        self.coef: np.ndarray | None = None  # base, per_row, per_draft once fitted

    def observe(self, rows: int, drafts: int, seconds: float) -> bool:
        """One decode step; True when the prices changed (every REFIT_EVERY steps)."""
        if rows <= 0 or seconds <= 0:
            return False
        if self.coef is not None and seconds > 3 * self._step(rows, drafts):
            return False  # a pause outside the step (a collection, another process)
        x = np.array([1.0, rows, drafts, seconds])
        self.moments = DECAY * self.moments + np.outer(x, x)
        self.steps += 1
        if self.steps % REFIT_EVERY or self.steps < MIN_STEPS:
            return False
        return self._fit()

    def _fit(self) -> bool:
        m = self.moments / self.moments[0, 0]  # weighted means of the products

        def spread(i: int) -> float:
            return m[i, i] - m[0, i] ** 2

        if spread(2) < MIN_DRAFT_SPREAD ** 2:
            return False
        # with one batch size seen, rows repeats the intercept: fit base + per_draft only
        used = [0, 1, 2] if spread(1) > 0.01 else [0, 2]
        solved = np.linalg.lstsq(m[np.ix_(used, used)], m[used, 3], rcond=None)[0]
        coef = np.zeros(3)
        coef[used] = solved
        if coef[2] < 0 or coef[0] + coef[1] <= 0:
            return False
        self.coef = coef
        return True

    def _step(self, rows: int, drafts: int) -> float:
        base, per_row, per_draft = self.coef
        return base + per_row * rows + per_draft * drafts

    def draft_costs(self, b: int, max_k: int) -> np.ndarray:
        """C[n], n = 0..max_k: n draft tokens per row at batch size b, in plain steps."""
        if self.coef is None or self._step(b, 0) <= 0:
            return self.prior(b, max_k)
        return np.arange(max_k + 1, dtype=np.float64) * b * self.coef[2] / self._step(b, 0)
