#!/usr/bin/env python
"""Would `full`'s acceptance model predict better from what it does not read?

On the sessions `agentspec bench --backend replay` measures, it replays `full` and records, for
every candidate of every step (sent or not), the probability the acceptance model gave its
first token and whether that token was the one the target wrote, beside features of the step
that no row or offset reads:
- matched: the candidate's matched context length (rows read it as a copy length; the offsets,
  learned over every length, do not);
- line: how far into its line the output is (whether a match reaches back to the line start);
- position: how far into its output the step is;
- last_step: the request's last step, drafted and accepted tokens, and whether all were taken;
- silent_steps: how many steps in a row the request has sent nothing;
- local_rate: the share of the request's last 16 tokens that came from accepted drafts;
- role: the request's role;
- rival: how many candidates the step had, and whether their first tokens agree;
- before: the token before the draft;
- shorter: whether the most frequent next token after a shorter context (up to one token under
  the candidate's matched length, or match.MAX_CONTEXT), in the session's text and over every
  output, is the candidate's first, and how sure it is: evidence from levels the candidate's
  own context does not read, as an interpolated n-gram model would pool it;
- one_token: the same after the last token alone;
- line_head: the token that opens the output's current line (what kind of line it writes: a
  command, a diff line, prose), or none where the line began before the output;
- fenced: whether the output is inside a ``` block it opened.
Each is keyed with the candidate's source (copy or frequency path) and fitted online, in the
order the policy learns, as a logit shift on top of the prediction (logistic regression, AdaGrad
steps): the log loss of a recalibration per source alone, then with each feature, then with all.
A feature that lowers it much carries what the model misses; one that does not, nothing.
Beside each log loss, the net tokens the plan would gain from first tokens predicted above a
draft token's price (PRICE, about what λ0.2 costs at `full`'s speedup): each such token counts
1 if right, less the price.

    .venv/bin/python scripts/feature_screen.py --traces ../shared/traces/sweagent-gpt4-run-1.jsonl.gz \\
        --sessions 32 --seed 7
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentspec.allocator import logit  # noqa: E402
from agentspec.bench import make_drafter  # noqa: E402
from agentspec.match import MAX_CONTEXT, frequent_drafts  # noqa: E402
from agentspec.replay import replay  # noqa: E402
from scripts.replay_options import (Watcher, add_replay_options, first_token,  # noqa: E402
                                    load_replay, saved)

FEATURES = ("matched", "line", "position", "last_step", "silent_steps", "local_rate", "role",
            "rival", "before", "shorter", "one_token", "line_head", "fenced")
RATE = 0.1  # AdaGrad's step: RATE * error / sqrt(its squared errors so far)
PRICE = 0.28  # λ0.2 times `full`'s λ0.2 speedup on the traces (~1.4)


def bucket(x: float, edges: tuple) -> int:
    """How many of the ascending edges x reaches."""
    return sum(x >= e for e in edges)


@dataclass
class History:
    """What a request's past steps say: its last step, its silent streak, and for each token
    written, whether it was an accepted draft token."""

    drafted: int = 0
    accepted: int = 0
    silent_steps: int = 0
    from_drafts: list[bool] = field(default_factory=list)

    def add(self, drafted: int, accepted: int) -> None:
        self.from_drafts += [True] * accepted + [False]  # the target's own token closes a step
        self.silent_steps = 0 if drafted else self.silent_steps + 1
        self.drafted, self.accepted = drafted, accepted


class Screen(Watcher):
    """A `full` drafter as the engine sees it, recording each candidate's first token:
    (predicted probability, whether it was right, its features)."""

    def __init__(self, inner, token_bytes: list[bytes]):
        super().__init__(inner)
        # per token id: whether it holds a newline, a code fence
        self.newline = np.array([b"\n" in t for t in token_bytes])
        self.fence = np.array([b"```" in t for t in token_bytes])
        self.rows: list[tuple[float, bool, dict]] = []
        self._history: dict[str, History] = {}
        self._tops: dict[int, tuple] = {}  # the step's frequency drafts, by max_context

    def observe(self, request, drafted, accepted):
        at = self.at[request.id]
        history = self._history.setdefault(request.id, History())
        if at < len(request.output):
            candidates, _, _ = self.inner.running[request.id].step()
            written = request.output[at]
            self._tops.clear()
            for c in candidates:
                self.rows.append((*first_token(self.inner, request, c, written),
                                  self._features(request, at, history, c, candidates)))
        history.add(drafted, accepted)
        self.inner.observe(request, drafted, accepted)

    def _features(self, request, at, history, candidate, candidates) -> dict:
        end = request.num_prompt + at  # the step's context ends here
        line = 0
        while line < min(end, 64) and not self.newline[request.tokens[end - 1 - line]]:
            line += 1
        head = end - line  # where the line starts, if it starts within the last 64 tokens
        written = request.tokens[request.num_prompt:end]
        recent = history.from_drafts[-16:]
        rival = len(candidates) == 2 and candidates[0].tokens[0] == candidates[1].tokens[0]
        return {
            "source": "path" if candidate.frequency else "copy",
            "matched": bucket(candidate.m, (2, 3, 4, 6, 9, 17)),
            "line": bucket(line, (1, 3, 6, 11, 21, 41)),
            "position": bucket(at, (1, 4, 16, 64, 256)),
            "last_step": (min(history.drafted, 3), min(history.accepted, 3),
                          history.drafted > 0 and history.accepted == history.drafted),
            "silent_steps": bucket(history.silent_steps, (1, 2, 3, 5, 9)),
            "local_rate": bucket(sum(recent) / max(1, len(recent)), (0.01, 0.2, 0.4, 0.6, 0.8)),
            "role": request.role,
            "rival": (len(candidates), rival),
            "before": request.tokens[end - 1] if end else -1,
            "shorter": self._top_token(request, candidate,
                                       max(1, min(candidate.m, MAX_CONTEXT) - 1)),
            "one_token": self._top_token(request, candidate, 1),
            "line_head": request.tokens[head] if request.num_prompt <= head < end else -1,
            "fenced": int(self.fence[written].sum()) % 2 if len(written) else 0,
        }

    def _top_token(self, request, candidate, max_context: int) -> tuple:
        """Whether the most frequent next token after the step's last max_context (or fewer)
        tokens, in the session's text and over every output, is the candidate's first, with
        the share of occurrences behind it (banded)."""
        if max_context not in self._tops:  # (the step's candidates ask alike)
            policy = self.inner
            self._tops[max_context] = frequent_drafts(
                policy.sessions[request.session].s, policy.g,
                policy.running[request.id].context, 1, max_context=max_context)
        first = candidate.tokens[0]
        return tuple((bool(d.tokens) and d.tokens[0] == first,
                      bucket(d.probs[0], (0.2, 0.4, 0.6, 0.8)) if d.tokens else -1)
                     for d in self._tops[max_context])


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def recalibrated(rows: list[tuple[float, bool, dict]], features: tuple[str, ...]) -> np.ndarray:
    """Each row's prediction after an online logistic regression, learned in order, on its
    logit (a slope) and a shift per source and per value of each feature with the source."""
    shift: dict[tuple, float] = {}
    squared: dict[tuple, float] = {}
    slope, slope_squared = 0.0, 0.0
    out = np.empty(len(rows))
    for i, (p, right, values) in enumerate(rows):
        source = values["source"]
        keys = [(source,)] + [(name, source, values[name]) for name in features]
        z = logit(p)
        out[i] = q = 1.0 / (1.0 + math.exp(-((1.0 + slope) * z
                                             + sum(shift.get(k, 0.0) for k in keys))))
        error = q - right
        for k in keys:
            squared[k] = squared.get(k, 0.0) + error * error
            if squared[k]:
                shift[k] = shift.get(k, 0.0) - RATE * error / math.sqrt(squared[k])
        slope_squared += (error * z) ** 2
        if slope_squared:
            slope -= RATE * error * z / math.sqrt(slope_squared)
    return out


def net_over_price(p: np.ndarray, right: np.ndarray) -> float:
    """What the first tokens predicted above PRICE would net: 1 each if right, less PRICE."""
    return float((right[p > PRICE] - PRICE).sum())


def screen(rows: list[tuple[float, bool, dict]]) -> dict:
    """The log loss of the predictions, recalibrated per source, with each feature, with all;
    and the net tokens over the price of each."""
    predicted = np.array([p for p, _, _ in rows])
    right = np.array([r for _, r, _ in rows], dtype=float)
    fits = {"recalibrated_per_source": recalibrated(rows, ()),
            **{name: recalibrated(rows, (name,)) for name in FEATURES},
            "all": recalibrated(rows, FEATURES)}
    return {
        "first_tokens": len(rows),
        "acceptance_model": log_loss(predicted, right),
        "recalibrated_per_source": log_loss(fits["recalibrated_per_source"], right),
        "with_feature": {name: log_loss(fits[name], right) for name in FEATURES},
        "with_all": log_loss(fits["all"], right),
        "net_over_price": {"acceptance_model": net_over_price(predicted, right),
                           **{name: net_over_price(p, right) for name, p in fits.items()}},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_replay_options(ap, sessions=32)
    args = ap.parse_args(argv)
    run = load_replay(args, "full")
    recorder = Screen(make_drafter("full", run.setup), run.setup.token_bytes)
    replay(run.tokenized, recorder, batch=args.batch)
    report = screen(recorder.rows)
    net = report["net_over_price"]
    print(f"{report['first_tokens']} candidate first tokens; log loss, and net tokens over "
          f"a price of {PRICE}:")
    print(f"  acceptance model          {report['acceptance_model']:.4f}  "
          f"{net['acceptance_model']:9.1f}")
    base = report["recalibrated_per_source"]
    print(f"  recalibrated per source   {base:.4f}  {net['recalibrated_per_source']:9.1f}")
    for name, loss in (*report["with_feature"].items(), ("all", report["with_all"])):
        print(f"  + {name:23s} {loss:.4f} ({(loss - base) / base:+.1%})  {net[name]:9.1f}")
    return saved(args, report)


if __name__ == "__main__":
    main()
