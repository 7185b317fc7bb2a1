"""What the scripts that replay the bench's sessions share: the options they take as
`agentspec bench --backend replay` names them, the run those load (the bench's own task
split, tokenizer and structure), and a drafter wrapper that watches `full`'s steps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentspec.cli import BenchRun, load_bench


def add_replay_options(ap: argparse.ArgumentParser, sessions: int | None = None) -> None:
    ap.add_argument("--traces", type=Path, nargs="+", required=True)
    ap.add_argument("--sessions", type=int, default=sessions)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lambda", dest="lam", type=float, default=0.2)
    ap.add_argument("--structure", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", type=Path, default=None)


def load_replay(args: argparse.Namespace, methods: str) -> BenchRun:
    """The sessions and setup `bench --backend replay` would measure `methods` on."""
    return load_bench("replay", args.traces, sessions=args.sessions, seed=args.seed,
                      methods=methods, batch=str(args.batch), model=args.model,
                      cost_profile=None, lam=args.lam, kmax=None, structure=args.structure,
                      profile_sessions=60, split=True, dtype=None, urls=(None, None),
                      outputs=None, save_outputs=None)


class Watcher:
    """A drafter as the engine sees it, every call passed through, that knows the output
    position each request's current step starts at (`self.at[request.id]`)."""

    def __init__(self, inner):
        self.inner = inner
        self.at: dict[str, int] = {}

    def __getattr__(self, name):  # register, start, finish, ...: the drafter's own
        return getattr(self.inner, name)

    def propose(self, batch, padded=False):
        for r in batch:
            self.at[r.id] = len(r.output)
        return self.inner.propose(batch, padded)


def first_token(policy, request, candidate, written: int) -> tuple[float, bool]:
    """A candidate of `policy`'s step: the probability its plan gave its first token (read
    before the policy learns from the step) and whether that token was `written`."""
    p = policy.acceptance.accept_probs(request.role, candidate.m, candidate.rows, 1,
                                       candidate.ids, candidate.agreed)[0]
    return float(p), candidate.tokens[0] == written


def saved(args: argparse.Namespace, report: dict) -> dict:
    """The report, written to --json first where one was given."""
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report
