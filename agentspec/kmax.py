"""Offline Kmax profiling (AgSpec): replay traces, measure how far retrieved continuations
match the real output, per role, and cap each role's draft length where Pr(R >= k) < lambda.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Sequence

from agentspec.controller import KmaxTable
from agentspec.policy import Fixed, Policy, PolicyConfig
from agentspec.tokens import TokenizedSession


class _Recorder(Policy):
    """The retrieval policy with fixed long drafts, recording R of every drafted step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def observe(self, request, drafted, accepted):
        if drafted:
            self.runs[request.role].append((self.running[request.id].match.length, accepted))


def profile_kmax(sessions: Sequence[TokenizedSession], lam: float, config: PolicyConfig,
                 max_k: int = 64, source: dict | None = None, **policy_kwargs) -> KmaxTable:
    from agentspec.replay import replay

    rec = _Recorder(replace(config, length=Fixed(max_k), max_k=max_k),
                    **policy_kwargs)
    replay(sessions, rec)
    return KmaxTable.from_runs(lam, rec.runs, max_k, source)
