"""The one speculation loop: propose, verify, accept, roll back, observe.

Every engine drives it: the oracle replay (the recorded output is the verifier), the MLX
engine (one row, or a batch whose rows join and leave between steps) and `agentspec serve`.
An engine supplies a `Target`: clip a row's draft, verify the rows' drafts (the target's
own token at each position) and roll back each row's rejected tokens. The arithmetic of
what is accepted and emitted lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter_ns, thread_time_ns
from typing import Any, Callable, Protocol, Sequence

from agentspec.drafter import Drafter, Request


def drafter_clock() -> tuple[int, int]:
    """Start timing a drafter call; `drafter_ns(start)` reads it."""
    return thread_time_ns(), perf_counter_ns()


def drafter_ns(start: tuple[int, int]) -> int:
    """The drafter's CPU time since `start` (bench-json.md): the lesser of two bounds from
    above. The thread's CPU clock also counts its own reads (a system call: 1-6 us each in
    this sandbox, ~3 us of a ~150 us step), the wall clock the turns other processes take
    on this core."""
    wall = perf_counter_ns() - start[1]
    return min(thread_time_ns() - start[0], wall)


def draft_room(max_tokens: int, done: int) -> int:
    """How many draft tokens a step may send to an output of `done` tokens that may not pass
    `max_tokens`: a step gives at most its draft + 1 tokens."""
    return max(max_tokens - done - 1, 0)


def accepted_prefix(draft: Sequence[int], choices: Sequence[int]) -> int:
    """How many draft tokens equal the target's choice at their position."""
    n = min(len(draft), len(choices))
    a = 0
    while a < n and draft[a] == choices[a]:
        a += 1
    return a


def take(new: Sequence[int], done: int, stop: frozenset | set, max_tokens: int
         ) -> tuple[list[int], str]:
    """Tokens of `new` that join an output of `done` tokens, and why it ends ('' = it goes on)."""
    taken = []
    for t in new:
        if t in stop:
            return taken, "stop"
        taken.append(t)
        if done + len(taken) >= max_tokens:
            return taken, "length"
    return taken, ""


@dataclass(eq=False)  # rows are compared by identity
class Row:
    """One request being generated: its output so far and how each step went."""

    request: Request
    max_tokens: int
    stop: frozenset = frozenset()
    pending: int = -1  # the target's last token, not yet fed to it
    tokens: list[int] = field(default_factory=list)  # output, without the stop token
    finish: str = ""  # stop | length once done
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (emitted, drafted, accepted)
    drafter_ns: int = 0  # CPU time in propose (this row's share) and observe
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0  # sampling seed of this row
    state: Any = None  # what the engine keeps for the row (a prefilled cache, a cursor)


class Target(Protocol):
    """What an engine supplies to the loop."""

    padded: bool  # verifies a batch as one rectangle: every row pays the longest draft

    def join(self, rows: Sequence[Row]) -> None:
        """Rows enter the batch (prefill, merge caches)."""

    def clip(self, rows: Sequence[Row], drafts: list[list[int]]) -> list[list[int]]:
        """The part of each row's draft this engine will verify."""

    def verify(self, rows: Sequence[Row], drafts: Sequence[list[int]]) -> list[list[int]]:
        """The target's token at each position of each row's pending token + draft.

        Usually len(draft) + 1 tokens; fewer when the target has no more to say (replay).
        """

    def verified_drafts(self, drafts: Sequence[list[int]]) -> list[int] | None:
        """Draft tokens the last `verify` computed in each row: what its time paid for (an
        engine that pads rows to the longest draft computes every row at that width); None
        when its time says nothing about this machine (replay reads a recording)."""

    def rollback(self, rows: Sequence[Row], drafts: Sequence[list[int]],
                 accepted: Sequence[int]) -> None:
        """Remove each row's rejected draft tokens (len(draft) - accepted) from its state."""

    def leave(self, keep: Sequence[int]) -> None:
        """Only the rows at these indices stay in the batch."""


@dataclass
class Loop:
    """Rows in flight on one target, drafted by one drafter (None: plain decoding).

    `on_finish` runs for a row as soon as it ends, within the step (before the next row is
    observed), so a drafter sees the same call order at any batch size. It may re-arm the
    row for its session's next request and return True: the row then keeps its slot
    (replay does, so batches keep their order). The drafter is told what each verification
    of a real engine cost (`observe_step`), to price its drafts by this machine's own steps.
    """

    target: Target
    drafter: Drafter | None = None
    on_finish: Callable[[Row], bool | None] | None = None
    rows: list[Row] = field(default_factory=list)

    def join(self, rows: Sequence[Row]) -> None:
        if rows:
            self.target.join(rows)
            self.rows.extend(rows)

    def propose(self) -> list[list[int]]:
        if self.drafter is None:
            return [[] for _ in self.rows]
        start = drafter_clock()
        proposed = self.drafter.propose([r.request for r in self.rows],
                                        padded=self.target.padded and len(self.rows) > 1)
        share = drafter_ns(start) // len(self.rows)
        for row in self.rows:
            row.drafter_ns += share
        return self.target.clip(self.rows, [list(d) for d in proposed])

    def step(self) -> list[Row]:
        """One verification step of every row; returns the rows that finished in it.

        A re-armed row is in the list too; `row.finish` says ''.
        """
        drafts = self.propose()
        t0 = perf_counter_ns()
        choices = self.target.verify(self.rows, drafts)
        accepted = [accepted_prefix(d, c) for d, c in zip(drafts, choices)]
        self.target.rollback(self.rows, drafts, accepted)
        verified = self.target.verified_drafts(drafts)
        if verified is not None and self.drafter is not None:
            self.drafter.observe_step(verified, (perf_counter_ns() - t0) / 1e9)
        finished, keep = [], []
        for j, (row, d, c, a) in enumerate(zip(self.rows, drafts, choices, accepted)):
            new, row.finish = take(d[:a] + list(c[a:a + 1]), len(row.tokens), row.stop,
                                   row.max_tokens)
            row.tokens.extend(new)
            row.request.tokens.extend(new)
            row.steps.append((len(new), len(d), a))
            if self.drafter is not None:
                start = drafter_clock()
                self.drafter.observe(row.request, len(d), a)
                row.drafter_ns += drafter_ns(start)
            if not row.finish:
                row.pending = c[a] if a < len(c) else -1
                keep.append(j)
                continue
            finished.append(row)
            if self.on_finish and self.on_finish(row):
                keep.append(j)
        if len(keep) < len(self.rows):
            self.target.leave(keep)
            self.rows = [self.rows[j] for j in keep]
        return finished

    def drop(self, rows: Sequence[Row]) -> None:
        """Rows leave before they finish (their client went away)."""
        gone = {id(r) for r in rows}
        keep = [j for j, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) < len(self.rows):
            self.target.leave(keep)
            self.rows = [self.rows[j] for j in keep]
