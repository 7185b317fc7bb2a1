"""Oracle replay: recorded sessions stand in for the target model.

The recorded output of each call is taken as the target's greedy output, so a
verification step accepts the longest prefix of the draft that matches it, plus one
token of the target's own. Up to `batch` sessions run in lockstep, so a drafter sees real
batches; each session's calls run one after another, as the agent made them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Callable, Sequence

from agentspec.drafter import Drafter, Request
from agentspec.metrics import Meter
from agentspec.tokens import TokenizedSession


@dataclass
class _Cursor:
    """A session being replayed: which call runs, and how far its output got."""

    session: TokenizedSession
    call: int = -1
    pos: int = 0
    request: Request | None = None

    @property
    def target(self) -> list[int]:
        return self.session.calls[self.call].output


def _next_call(drafter: Drafter, cur: _Cursor) -> bool:
    """Start the session's next call with a non-empty output; False when none is left."""
    s = cur.session
    while cur.call + 1 < len(s.calls):
        cur.call += 1
        tc = s.calls[cur.call]
        tc.register(drafter, s.id)
        cur.request = s.request(cur.call)
        cur.pos = 0
        drafter.start(cur.request)
        if tc.output:
            return True
        drafter.finish(cur.request)
    return False


def replay(sessions: Sequence[TokenizedSession], drafter: Drafter, batch: int = 1,
           on_tokens: Callable[[int], None] | None = None) -> Meter:
    """Replay sessions through `drafter`; returns what was measured.

    `on_tokens` is called with the number of output tokens each step produced.
    """
    meter = Meter()
    waiting = deque(sessions)
    active: list[_Cursor] = []
    while waiting or active:
        while waiting and len(active) < batch:
            cur = _Cursor(waiting.popleft())
            if _next_call(drafter, cur):
                active.append(cur)
            else:
                drafter.drop_session(cur.session.id)
        if not active:
            break
        requests = [cur.request for cur in active]
        t0 = perf_counter_ns()
        drafts = drafter.propose(requests)
        spent = perf_counter_ns() - t0
        emitted_step = 0
        drafted_step = 0
        still = []
        for cur, draft in zip(active, drafts):
            target, pos = cur.target, cur.pos
            n = 0
            limit = min(len(draft), len(target) - pos)
            while n < limit and draft[n] == target[pos + n]:
                n += 1
            emit = min(n + 1, len(target) - pos)
            cur.request.tokens.extend(target[pos:pos + emit])
            cur.pos += emit
            meter.row(cur.request.role, emit, len(draft), n)
            emitted_step += emit
            drafted_step += len(draft)
            t0 = perf_counter_ns()
            drafter.observe(cur.request, len(draft), n)
            if cur.pos == len(target):
                drafter.finish(cur.request)
                more = _next_call(drafter, cur)
            else:
                more = True
            spent += perf_counter_ns() - t0
            if more:
                still.append(cur)
            else:
                drafter.drop_session(cur.session.id)
        meter.step(len(active), drafted_step)
        meter.drafter_ns += spent
        active = still
        if on_tokens:
            on_tokens(emitted_step)
    return meter
