"""The one seam between engines (replay, MLX, vLLM) and drafting policies.

An engine keeps a `Request` per running generation and calls, per decoding step,
`propose` for the whole batch, verifies, then `observe` per request. Text the agent
produced or saw outside generation (prompts, tool output, opened files) reaches the
drafter through `register`; finished outputs through `finish`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

# Kinds of text registered into a session's corpora.
PROMPT, TOOL, FILE, OUTPUT = "prompt", "tool", "file", "output"


@dataclass
class Request:
    """A running generation. `tokens` is prompt + output so far; the engine appends."""

    id: str
    session: str
    tokens: list[int]
    num_prompt: int
    role: str = "agent"
    agent: str = ""
    query: str = ""
    turn: int = 1
    structure: tuple[tuple[str, str], ...] = ()
    meta: dict = field(default_factory=dict)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.num_prompt :]


class Drafter(Protocol):
    """A drafting policy. Implementations keep all per-session state themselves; one that
    subclasses it inherits a method it has no use for as a no-op (all but `propose`)."""

    name: str
    global_seed_outputs: int  # past outputs it was given to draft from (reports say so)
    served_sessions: int = 0  # recorded sessions it served before the measured ones
    kmax_profile: bool = False  # its acceptance model starts from a Kmax profile of past sessions

    def register(self, session: str, kind: str, tokens: Sequence[int], path: str = "") -> None:
        """Add text a session saw or wrote (kind: PROMPT, TOOL, FILE or OUTPUT)."""

    def start(self, request: Request) -> None:
        """A request begins; its prompt is `request.tokens[:request.num_prompt]`."""

    def propose(self, batch: Sequence[Request], padded: bool = False) -> list[list[int]]:
        """One draft per request (possibly empty), sized for this batch. `padded`: the
        engine verifies the batch as one rectangle, every row as wide as the longest draft
        (MLX), so a drafter that plans lengths plans one width for all rows."""

    def observe(self, request: Request, drafted: int, accepted: int) -> None:
        """After verification: `accepted` of `drafted` draft tokens matched.

        Called after the engine appended the step's new tokens to `request.tokens`.
        """

    def observe_step(self, verified: Sequence[int], seconds: float) -> None:
        """A decode step of a real engine verified `verified[i]` draft tokens in its row i
        in `seconds` of wall time (drafters that learn what drafting costs use it)."""

    def finish(self, request: Request) -> None:
        """The request ended; `request.output` is its real output."""

    def drop_session(self, session: str) -> None:
        """Forget everything about a session."""

    def state(self) -> dict:
        """What it learned that outlives its sessions, as named numpy arrays (kept across a
        server's runs by `agentspec.state`); empty: nothing."""
        return {}

    def restore(self, state: dict) -> None:
        """Take back what `state()` gave, before serving anything."""
        if state:
            raise ValueError(f"{self.name} keeps no state")


class Plain(Drafter):
    """No drafting: plain autoregressive decoding, the reference every method is compared to."""

    name = "plain"
    global_seed_outputs = 0

    def propose(self, batch, padded=False):
        return [[] for _ in batch]
