#!/usr/bin/env python
"""Benchmark the match engine (agentspec.match.Corpus) on real agent text.

Text: every message of every thread of the recorded sessions (default ../shared/traces/*.jsonl.gz),
in file order; each thread is one document (end_document after it).  No model tokenizer is
needed: a regex cuts text into newlines, runs of spaces/tabs, letter runs of up to 8, digit
pairs and single other characters, and a dict gives each distinct piece an id.  That keeps the
repetition that matters (newline + indent, identifiers, prompts repeated across calls) and is
somewhat more repetitive than a BPE (its most common 2-gram is ~2% of positions).  The two
development trace files give about 10.7M such tokens; a size beyond what the text gives (plus
the held-out part) is filled with copies of the stream in which 2% of the tokens are replaced
by random ids, and the table says so.

For each size N: build a Corpus from the first N tokens, extending message by message (the
update figure is that wall time, plus the final flush, per token), then time `match(context,
k=32)` on contexts of 200 tokens of three kinds:
  real     -- ending at a random position inside the corpus (the text itself is there, so
              matches are long: the "copy from the prompt" case);
  held-out -- ending at a random position of the stream after the corpus (the next sessions:
              the "continue a new text" case, matches of all lengths);
  random   -- uniformly random ids (almost never a match).
bytes/token is Corpus.nbytes / len(Corpus).  Timings are wall clock on whatever else runs.
The engine is agentspec.match's numba path when numba is installed; --no-numba (or
AGENTSPEC_NO_NUMBA=1) times the pure-numpy one.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# agentspec.match picks its numba or numpy path once, at import
if "--no-numba" in sys.argv:
    os.environ["AGENTSPEC_NO_NUMBA"] = "1"
from agentspec import match as match_mod  # noqa: E402
from agentspec.match import Corpus  # noqa: E402
from agentspec.trace import read_sessions  # noqa: E402

PIECE = re.compile(r"\n|[ \t]+|[A-Za-z]{1,8}|\d{1,2}|[^\sA-Za-z\d]")
CONTEXT = 200
K = 32


def default_traces() -> list[str]:
    for d in (ROOT / "shared" / "traces", ROOT.parent / "shared" / "traces"):
        found = sorted(glob.glob(str(d / "*.jsonl.gz")))
        if found:
            return found
    return []


def load_messages(paths: list[str]) -> tuple[list[np.ndarray], list[bool], int]:
    """Token arrays, one per message; ends[i]: message i closes its thread; vocab size."""
    sessions, errors = read_sessions(paths)
    if errors:
        print(f"(skipped {len(errors)} malformed sessions)", file=sys.stderr)
    vocab: dict[str, int] = {}
    msgs, ends = [], []
    for s in sessions:
        for thread in s.threads:
            for j, m in enumerate(thread):
                ids = [vocab.setdefault(w, len(vocab)) for w in PIECE.findall(m["content"])]
                if ids:
                    msgs.append(np.array(ids, dtype=np.int32))
                    ends.append(j == len(thread) - 1)
            if ends:
                ends[-1] = True
    return msgs, ends, len(vocab)


def stream_of(msgs, ends, need: int, vocab: int, rng) -> tuple[list, list, int]:
    """At least `need` tokens: the messages, then perturbed copies of them if short."""
    total = sum(len(m) for m in msgs)
    out_m, out_e, copies = list(msgs), list(ends), 0
    while total < need:
        copies += 1
        for m, e in zip(msgs, ends):
            m = m.copy()
            hit = rng.random(len(m)) < 0.02
            m[hit] = rng.integers(0, vocab, int(hit.sum()))
            out_m.append(m)
            out_e.append(e)
            total += len(m)
    return out_m, out_e, copies


def pct(a, p) -> float:
    return float(np.percentile(a, p))


def bench_size(n: int, msgs, ends, flat: np.ndarray, base: int, vocab: int, lookups: int,
               rng) -> dict:
    corpus = Corpus()
    gc.collect()
    t0 = time.perf_counter()
    held = 0
    for m, e in zip(msgs, ends):
        if held + len(m) > n:
            m = m[: n - held]
        corpus.extend(m)
        held += len(m)
        if e:
            corpus.end_document()
        if held >= n:
            break
    corpus.flush()
    update = (time.perf_counter() - t0) / held * 1e6
    row = {"n": held, "update": update, "bytes": corpus.nbytes / len(corpus)}
    # held-out contexts from the real text after the corpus; from the copies only if too little
    stop = base if base - held >= 100_000 else len(flat)
    row["held-out from copies"] = stop != base
    kinds = {
        "real": lambda: flat[(p := int(rng.integers(CONTEXT, held))) - CONTEXT : p],
        "held-out": lambda: flat[(p := int(rng.integers(held + CONTEXT, stop))) - CONTEXT : p],
        "random": lambda: rng.integers(0, vocab, CONTEXT).astype(np.int32),
    }
    for name, make in kinds.items():
        contexts = [make().tolist() for _ in range(lookups)]  # as an engine holds them
        lat, lengths = [], []
        for ctx in contexts:
            t = time.perf_counter()
            m = corpus.match(ctx, K)
            lat.append(time.perf_counter() - t)
            lengths.append(m.length)
        lat = np.array(lat) * 1e6
        row[name] = (pct(lat, 50), pct(lat, 99), float(np.median(lengths)),
                     float(np.mean(np.array(lengths) > 0)))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7",
                    help="corpus sizes in tokens, comma-separated (default 1e6,1e7)")
    ap.add_argument("--traces", nargs="*", default=None,
                    help="trace files (default ../shared/traces/*.jsonl.gz)")
    ap.add_argument("--lookups", type=int, default=2000, help="lookups per kind and size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-numba", action="store_true",
                    help="time the pure-numpy path (as AGENTSPEC_NO_NUMBA=1 does)")
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",") if s.strip()]
    paths = args.traces or default_traces()
    if not paths:
        sys.exit("no trace files: pass --traces")
    rng = np.random.default_rng(args.seed)
    warm = Corpus()  # load (or compile) the numba kernels outside the timings
    warm.extend(list(range(40)) * 2)
    warm.match(list(range(10)), K)

    t = time.perf_counter()
    msgs, ends, vocab = load_messages(paths)
    base = sum(len(m) for m in msgs)
    heldout = 200_000
    msgs, ends, copies = stream_of(msgs, ends, max(sizes) + heldout, vocab, rng)
    flat = np.concatenate(msgs)
    print(f"text: {len(paths)} trace files -> {base:,} tokens (regex pieces, vocab {vocab:,}); "
          f"{'no copies needed' if not copies else f'{copies} perturbed copies added'}; "
          f"loaded in {time.perf_counter() - t:.1f}s")

    rows = [bench_size(n, msgs, ends, flat, base, vocab, args.lookups, rng) for n in sizes]
    kinds = ("real", "held-out", "random")
    print(f"engine: {'numba' if match_mod._nb is not None else 'numpy'}")
    print()
    print(f"lookup = match(context of {CONTEXT} tokens, k={K}); {args.lookups} per kind; "
          "us = microseconds; m = median match length, hit = share with a match")
    head = f"{'corpus':>11} {'update us/tok':>13} {'bytes/tok':>9}"
    for k in kinds:
        head += f" | {k + ' med/p99 us':>19} {'m':>3} {'hit':>4}"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = f"{r['n']:>11,} {r['update']:>13.2f} {r['bytes']:>9.1f}"
        for k in kinds:
            med, p99, m, hit = r[k]
            line += f" | {med:>9.1f} / {p99:>7.1f} {m:>3.0f} {hit:>4.2f}"
        print(line + ("  (held-out contexts from perturbed copies)" if r["held-out from copies"]
                      else ""))


if __name__ == "__main__":
    main()
