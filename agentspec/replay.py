"""Oracle replay: recorded sessions stand in for the target model.

The recorded output of each call is taken as the target's greedy output, so a
verification step accepts the longest prefix of the draft that matches it, plus one
token of the target's own. Up to `batch` sessions run in lockstep, so a drafter sees real
batches; each session's calls run one after another, as the agent made them. The loop is
agentspec.speculation's, with the recording as its target.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from agentspec.drafter import Drafter
from agentspec.metrics import Meter
from agentspec.speculation import Loop, Row, draft_room, drafter_clock, drafter_ns
from agentspec.tokens import TokenizedSession


@dataclass
class _Cursor:
    """A session being replayed: which call runs."""

    session: TokenizedSession
    call: int = -1

    @property
    def target(self) -> list[int]:
        return self.session.calls[self.call].output

    @property
    def max_tokens(self) -> int | None:
        return self.session.calls[self.call].max_tokens


class Recording:
    """A target whose choices are the recorded outputs (rows hold their _Cursor as state)."""

    padded = False  # drafts are priced row by row, as vLLM verifies them

    def join(self, rows):
        pass

    def clip(self, rows, drafts):
        # a backend's output cut at its token budget: no draft ran past it there; a
        # recorded one ends where nothing says in advance
        return [d if (budget := r.state.max_tokens) is None
                else d[:draft_room(budget, len(r.tokens))] for r, d in zip(rows, drafts)]

    def verify(self, rows, drafts):
        out = []
        for row, d in zip(rows, drafts):
            pos = len(row.tokens)
            out.append(row.state.target[pos:pos + len(d) + 1])
        return out

    def verified_drafts(self, drafts):
        return None  # a recording's verification costs nothing: no price to learn from

    def rollback(self, rows, drafts, accepted):
        pass

    def leave(self, keep):
        pass


class _Clock:
    """The drafter's CPU time outside decoding steps, `with clock:` around each drafter call
    (the engine's own work between them is not the drafter's): registering a call's text
    (its prompt indexed), starting and finishing it, dropping a session. The report gives
    it beside the overhead, which is propose and observe as bench-json.md defines it."""

    def __init__(self):
        self.ns = 0

    def __enter__(self):
        self._start = drafter_clock()

    def __exit__(self, *exc):
        self.ns += drafter_ns(self._start)


def _next_call(drafter: Drafter, cur: _Cursor, clock: _Clock, row: Row | None = None
               ) -> Row | None:
    """Start the session's next call with a non-empty output, in `row` when given (re-armed
    in place); None when none is left."""
    s = cur.session
    while cur.call + 1 < len(s.calls):
        cur.call += 1
        tc = s.calls[cur.call]
        request = s.request(cur.call)
        with clock:
            tc.register(drafter, s.id)
            drafter.start(request)
        if not tc.output:
            with clock:
                drafter.finish(request)
            continue
        if row is None:
            return Row(request, max_tokens=len(tc.output), state=cur)
        row.request, row.max_tokens, row.tokens, row.finish = request, len(tc.output), [], ""
        return row
    return None


def replay(sessions: Sequence[TokenizedSession], drafter: Drafter, batch: int = 1,
           on_tokens: Callable[[int], None] | None = None) -> Meter:
    """Replay sessions through `drafter`; returns what was measured.

    `on_tokens` is called with the number of output tokens each step produced.
    """
    meter = Meter()
    waiting = deque(sessions)
    clock = _Clock()

    def finished(row: Row) -> bool:
        """The session's next call re-arms the row, keeping its slot in the batch."""
        with clock:
            drafter.finish(row.request)
        more = _next_call(drafter, row.state, clock, row) is not None
        if not more:
            with clock:
                drafter.drop_session(row.state.session.id)
        return more

    loop = Loop(Recording(), drafter, on_finish=finished)
    while waiting or loop.rows:
        joining = []
        while waiting and len(loop.rows) + len(joining) < batch:
            cur = _Cursor(waiting.popleft())
            row = _next_call(drafter, cur, clock)
            if row is not None:
                joining.append(row)
            else:
                with clock:
                    drafter.drop_session(cur.session.id)
        loop.join(joining)
        if not loop.rows:
            break
        rows = list(loop.rows)
        roles = [r.request.role for r in rows]
        before = [r.drafter_ns for r in rows]
        loop.step()
        for role, r in zip(roles, rows):
            meter.row(role, *r.steps[-1])
        meter.step(len(rows), sum(r.steps[-1][1] for r in rows))
        meter.drafter_ns += sum(r.drafter_ns - b for r, b in zip(rows, before))
        if on_tokens:
            on_tokens(sum(r.steps[-1][0] for r in rows))
    meter.call_ns = clock.ns
    return meter
