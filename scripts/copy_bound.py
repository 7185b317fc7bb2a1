#!/usr/bin/env python
"""How far can copying go on a trace? An upper bound on any retrieval drafter's AL.

On the same evaluation sessions as `agentspec bench --backend replay` (task split, seed,
sample, G from the profiling part), at every output position it looks at every occurrence of
the last L context tokens in what a copy drafter may read: this call's prompt, the text the
session showed before (S: every thread's messages and outputs; W: opened files, raw and in
diff emission forms), the output written so far (an overlapping copy, as a loop repeats) and
the profiling part's outputs (G); every past output, in S and G, after its prompt's last
tokens, as `full` keeps them (its lead). The bound drafts, at each step, the continuation of whichever
occurrence the real output follows furthest, and exactly as many tokens as it will accept
(so nothing is rejected). AL is output tokens per step; the speedup is modeled as in the
ladder: a step drafting n tokens costs 1 + lambda*n plain steps.

A drafter that needs a match of at least L tokens cannot beat the row for L; one that drafts
from shorter matches must pick, among every occurrence of a one- or two-token context, the one
the model will follow.

`--frequency` adds what the frequency source of `full` (agentspec.frequency: the most frequent
continuation over the session's text or over every output, as SuffixDecoding drafts it, from
the same corpora `full` keeps) could have drafted, with a perfect choice and length: alone,
and with the L >= 2 copies at every step (whichever goes further), so a note can say which
mechanism contributes what.

    .venv/bin/python scripts/copy_bound.py --traces ../shared/traces/sweagent-gpt4-run-1.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentspec.models import resolve  # noqa: E402
from agentspec.bench import pick_sessions, split_by_task  # noqa: E402
from agentspec.match import Corpus, frequent_drafts  # noqa: E402
from agentspec.policy import emission_forms, output_lead  # noqa: E402
from agentspec.tokens import (ChatTokenizer, TokenizedCall, TokenizedSession,  # noqa: E402
                              tokenize_sessions)
from agentspec.trace import read_sessions  # noqa: E402

_BASE = np.int64(1_000_003)


def window_keys(tokens: np.ndarray, length: int) -> np.ndarray:
    """A hash of every `length`-token window, indexed by the window's first position."""
    keys = np.zeros(max(0, len(tokens) - length + 1), np.int64)
    for i in range(length):
        keys = keys * _BASE + tokens[i:len(tokens) - length + 1 + i]
    return keys


class Occurrences:
    """Where each L-token window of a fixed text ends: sorted keys, positions after them."""

    def __init__(self, text: np.ndarray, length: int):
        keys = window_keys(text, length)
        order = np.argsort(keys, kind="stable")
        self.text, self.keys, self.after = text, keys[order], order + length

    def following(self, key: np.int64) -> np.ndarray:
        lo, hi = np.searchsorted(self.keys, key), np.searchsorted(self.keys, key, "right")
        return self.after[lo:hi]


def document(prompt, output) -> np.ndarray:
    """An output as `full` keeps it in S and G: after its lead (`policy.output_lead`)."""
    return np.concatenate([output_lead(prompt, len(prompt)), output]).astype(np.int64)


def longest_copy(text: np.ndarray, starts: np.ndarray, future: np.ndarray, max_k: int) -> int:
    """How many of `future`'s tokens the best of the copies starting at `starts` reproduces."""
    best, alive = 0, starts[starts < len(text)]
    for i in range(min(max_k, len(future))):
        alive = alive[text[alive] == future[i]] + 1
        if not len(alive):
            break
        best = i + 1
        alive = alive[alive < len(text)]
    return best


class FrequencySource:
    """The corpora `full`'s frequency drafts read: the session's text (S, with the output
    being written) and every finished output (G, from the profiling part's on)."""

    def __init__(self, outputs: Corpus, session: Corpus | None = None):
        self.outputs, self.session = outputs, session

    def draft(self, context: np.ndarray, max_k: int) -> list[list[int]]:
        return [d.tokens for d in frequent_drafts(self.session, self.outputs, context, max_k)]


def call_bound(prompt: np.ndarray, output: np.ndarray, earlier: Occurrences | None,
               g: Occurrences | None, length: int | None, max_k: int,
               frequency: FrequencySource | None = None) -> list[int]:
    """Accepted draft tokens of each step of one call under the bound: copies of contexts
    of `length` tokens (none when None), and the frequency drafts when a source is given
    (they see the output as it is written, as `full`'s do)."""
    context = np.concatenate([prompt, output])
    keys = window_keys(context, length) if length else None
    if frequency is not None:
        # (the output's document, as it is written)
        frequency.session.extend(output_lead(prompt, len(prompt)))
    steps, p = [], 0
    while p < len(output):
        q = len(prompt) + p
        accepted = 0
        if keys is not None and q >= length:
            key, future = keys[q - length], output[p:]
            for occ in (earlier, g):
                if occ is not None:
                    accepted = max(accepted, longest_copy(occ.text, occ.following(key),
                                                          future, max_k))
            # the prompt and the output so far: a copy may run on past q (a loop repeating)
            mine = np.flatnonzero(keys[:q - length] == key) + length
            accepted = max(accepted, longest_copy(context, mine, future, max_k))
        if frequency is not None:
            for draft in frequency.draft(context[:q], max_k):
                accepted = max(accepted, longest_copy(np.asarray(draft, np.int64),
                                                      np.zeros(1, int), output[p:], max_k))
            frequency.session.extend(output[p:p + accepted + 1])
        steps.append(accepted)
        p += accepted + 1
    if frequency is not None:
        frequency.session.end_document()
        frequency.outputs.extend(document(prompt, output))
        frequency.outputs.end_document()
    return steps


def shown(call: TokenizedCall, tok: ChatTokenizer) -> list[list[int]]:
    """The text a call shows the session for the first time: its new messages (of every
    thread: S is shared by the session's agents) and the files it opens, raw and in their
    diff emission forms (W)."""
    files = [t for _, t in call.new_files]
    forms = [tok.encode(f) for t in files for f in emission_forms(tok.decode(t))]
    return [t for _, t in call.new_messages] + files + forms


def session_bound(session: TokenizedSession, tok: ChatTokenizer, g: Occurrences | None,
                  length: int | None, max_k: int,
                  frequency: FrequencySource | None = None) -> list[int]:
    """Accepted draft tokens of each step of a session's calls, in order."""
    accepted: list[int] = []
    seen: list[np.ndarray] = []
    if frequency is not None:
        frequency.session = Corpus(min_context=1)
    for c in session.calls:
        seen += [np.append(np.asarray(t, np.int64), -1) for t in shown(c, tok)]
        for _, text in c.new_messages if frequency is not None else ():  # S's text
            frequency.session.extend(text)
            frequency.session.end_document()
        earlier = Occurrences(np.concatenate(seen), length) if seen and length else None
        prompt, output = np.asarray(c.prompt, np.int64), np.asarray(c.output, np.int64)
        accepted += call_bound(prompt, output, earlier, g, length, max_k, frequency)
        seen.append(np.append(document(prompt, output), -1))
    return accepted


def bound(chosen: list[TokenizedSession], seed: list[np.ndarray], tok: ChatTokenizer,
          length: int | None, frequency: bool, max_k: int) -> list[int]:
    """Accepted draft tokens of every step of the chosen sessions, replayed in order, G
    starting with the `seed` documents."""
    accepted: list[int] = []
    source = None
    if frequency:
        source = FrequencySource(Corpus(min_context=1))
        for o in seed:
            source.outputs.extend(o)
            source.outputs.end_document()
    # G as the drafters have it: the profiling part's outputs, then each finished
    # session's (the replay runs the chosen sessions in this order)
    g_parts = [np.append(o, -1) for o in seed]
    for s in chosen:
        g = Occurrences(np.concatenate(g_parts or [np.zeros(0, np.int64)]), length) \
            if length else None
        accepted += session_bound(s, tok, g, length, max_k, source)
        g_parts += [np.append(document(c.prompt, c.output), -1) for c in s.calls]
    return accepted


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, nargs="+", required=True)
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-split", dest="split", action="store_false",
                    help="measure on every session, G starts empty (as bench --no-split)")
    ap.add_argument("--profile-sessions", type=int, default=60)
    ap.add_argument("--context", default="1,2,3,4", help="context lengths L to bound at")
    ap.add_argument("--lambda", dest="lam", type=float, default=0.2)
    ap.add_argument("--max-k", type=int, default=64)
    ap.add_argument("--frequency", action="store_true",
                    help="also bound the frequency source, alone and with L >= 2 copies")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    loaded, bad = read_sessions(args.traces)
    if bad:
        print(f"warning: skipped {len(bad)} malformed session(s); first: {bad[0]}")
    held, measured = split_by_task(loaded, args.seed) if args.split else ([], loaded)
    tok = ChatTokenizer.from_model(resolve(args.model))
    chosen = tokenize_sessions(pick_sessions(measured, args.sessions, args.seed), tok)
    held_tok = tokenize_sessions(held[:args.profile_sessions], tok)
    # (the bench's `full` serves the profiling part first: its outputs enter G with leads)
    seed = [document(c.prompt, c.output) for s in held_tok for c in s.calls]
    tokens = sum(len(c.output) for s in chosen for c in s.calls)
    bounds = [(f"L >= {n}", n, False) for n in (int(x) for x in args.context.split(","))]
    if args.frequency:
        bounds += [("frequency", None, True), ("L >= 2 or frequency", 2, True)]
    rows = []
    for name, length, frequency in bounds:
        accepted = bound(chosen, seed, tok, length, frequency, args.max_k)
        steps = len(accepted)
        rows.append({"source": name, "context": length, "frequency": frequency,
                     "output_tokens": tokens, "steps": steps, "al": tokens / steps,
                     "speedup": tokens / (steps + args.lam * sum(accepted))})
        print(f"{name}: AL <= {rows[-1]['al']:.3f}, speedup at lambda {args.lam} <= "
              f"{rows[-1]['speedup']:.3f} ({tokens} tokens, {steps} steps)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"traces": [str(t) for t in args.traces],
                                         "sessions": len(chosen), "seed": args.seed,
                                         "task_split": args.split,
                                         "profile_sessions": len(held_tok), "lambda": args.lam,
                                         "max_k": args.max_k, "bounds": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
