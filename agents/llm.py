"""What the agent's models share: per-role output limits and the per-call record.

Two models generate the agent's calls: `mlx_llm.EngineLLM` (in process, the laptop default)
and `http_llm.HttpLLM` (any OpenAI-compatible server). Both have `complete(session, index)`,
`end_session(id)` and `report()`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

# Most tokens each role may generate: a patch needs room, a file list does not.
MAX_TOKENS = {"localize": 48, "code": 256, "run": 128, "review": 96}


@dataclass
class CallStats:
    """One finished call, for the live view."""

    session: str
    role: str
    turn: int
    tokens: int
    seconds: float
    al: float | None  # None: the server publishes no counters to tell
    plain_seconds: float | None  # with compare
    identical: bool | None  # with compare


def role_limits(max_tokens: int | None) -> dict[str, int]:
    """Each role's output limit, capped at `max_tokens`; an unknown role gets the largest."""
    limits = defaultdict(lambda: min(max(MAX_TOKENS.values()), max_tokens or 1 << 30))
    limits.update({role: min(n, max_tokens or n) for role, n in MAX_TOKENS.items()})
    return limits
