"""What a run of one method measured, and the cost model that turns it into speedups.

Every backend records its verification steps in a `Meter`; `Meter.report` produces one
method entry of the bench report (shared/spec/bench-json.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from agentspec.costs import CostProfile

DEFAULT_LAMBDAS = (0.02, 0.1, 0.2, 0.5)


@dataclass
class Counts:
    output_tokens: int = 0
    steps: int = 0  # request-steps: one verification of one request
    drafted: int = 0
    accepted: int = 0

    def add(self, emitted: int, drafted: int, accepted: int) -> None:
        self.output_tokens += emitted
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted

    @property
    def al(self) -> float:
        return self.output_tokens / self.steps if self.steps else 0.0

    @property
    def rejected_per_token(self) -> float:
        return (self.drafted - self.accepted) / self.output_tokens if self.output_tokens else 0.0


class Meter:
    """Per-step and per-role statistics of one method's run."""

    def __init__(self) -> None:
        self.total = Counts()
        self.by_role: dict[str, Counts] = defaultdict(Counts)
        self.step_rows: list[int] = []  # b: requests verified in each batch step
        self.step_drafts: list[int] = []  # K: draft tokens verified in each batch step
        self.drafter_ns = 0  # in propose and observe: the spec's overhead
        # in registering, starting and finishing calls, and dropping sessions (between
        # steps; None where the backend does not time them)
        self.call_ns: int | None = None

    @classmethod
    def plain(cls, output_tokens: int) -> "Meter":
        """What plain decoding of `output_tokens` tokens measures: one token per step."""
        m = cls()
        m.step_rows = [1] * output_tokens
        m.step_drafts = [0] * output_tokens
        return m

    def row(self, role: str, emitted: int, drafted: int, accepted: int) -> None:
        self.total.add(emitted, drafted, accepted)
        self.by_role[role].add(emitted, drafted, accepted)

    def step(self, rows: int, drafts: int) -> None:
        self.step_rows.append(rows)
        self.step_drafts.append(drafts)

    def cost(self, lam: float) -> float:
        """Modeled time of the run in decode steps, at a fixed lambda."""
        b = np.asarray(self.step_rows, dtype=np.float64)
        k = np.asarray(self.step_drafts, dtype=np.float64)
        return float(np.sum(1.0 + lam * k / np.maximum(b, 1)))

    def profile_cost(self, profile: CostProfile) -> float:
        """Modeled time of the run in seconds under a measured cost profile."""
        b = np.asarray(self.step_rows)
        k = np.asarray(self.step_drafts, dtype=np.float64)
        total = 0.0
        for rows in np.unique(b):
            sel = b == rows
            t1, lam = profile.step_time(int(rows)), profile.lam(int(rows))
            total += float(np.sum(t1 * (1.0 + lam * k[sel] / rows)))
        return total

    def report(self, plain: "Meter", lambdas=DEFAULT_LAMBDAS,
               profile: CostProfile | None = None) -> dict:
        plain_steps = len(plain.step_rows)
        entry = {
            "al": round(self.total.al, 4),
            "rejected_per_token": round(self.total.rejected_per_token, 4),
            "draft_per_step": round(self.total.drafted / max(self.total.steps, 1), 4),
            "steps": self.total.steps,
            "output_tokens": self.total.output_tokens,
            "modeled_speedup": {str(l): round(plain_steps / self.cost(l), 4) for l in lambdas},
            "tokens_per_s": None,
            "speedup": None,
            "identical_to_plain": None,
            "overhead_us_per_step": round(self.drafter_ns / 1e3 / max(self.total.steps, 1), 2),
            "by_role": {
                role: {"al": round(c.al, 4), "rejected_per_token": round(c.rejected_per_token, 4),
                       "output_tokens": c.output_tokens}
                for role, c in sorted(self.by_role.items())
            },
        }
        if self.call_ns is not None:
            entry["call_overhead_us_per_step"] = round(
                self.call_ns / 1e3 / max(self.total.steps, 1), 2)
        if profile is not None:
            entry["modeled_speedup"]["profile"] = round(
                plain.profile_cost(profile) / self.profile_cost(profile), 4)
        return entry
