#!/usr/bin/env python
"""A method's drafter overhead at two revisions, paired: both drafters get every call of one replay.

On this host the same code measures 150-270 us a step from one hour to the next (the other
tenants' load), so two bench runs cannot tell a 5% change from noise. Here the working tree
and a base revision (default HEAD, read from git as a package `agentspec_base`, kept per
commit in the temp folder with its compiled kernels) each build the method's drafter on the
sessions `agentspec bench --backend replay` measures, and each drafter call of one replay
goes to both, in random order, each timed by the bench's clock (`speculation.drafter_clock`).
Both see the same host at the same moment; each runs after the other half the time, with
what that evicted. Made for refactors: the two must draft alike, and the script stops,
naming the call, where they do not.

    .venv/bin/python scripts/overhead_ab.py --traces ../shared/traces/sweagent-gpt4-run-1.jsonl.gz \\
        --sessions 32 --seed 7

The absolute figures move with the host as a bench run's do; their ratio is what it
measures. HEAD against itself read 0.9990 and 1.0014 (SWE-agent, 32 sessions, seed 7).
"""

from __future__ import annotations

import argparse
import importlib
import random
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentspec.bench import make_drafter  # noqa: E402
from agentspec.replay import replay  # noqa: E402
from agentspec.speculation import drafter_clock, drafter_ns  # noqa: E402
from scripts.replay_options import add_replay_options, load_replay, saved  # noqa: E402

BASE = "agentspec_base"
CACHE = Path(tempfile.gettempdir()) / "agentspec-overhead-ab"
_IMPORT = re.compile(r"\b(from|import) agentspec\b")


def base_package(rev: str) -> str:
    """The agentspec package of git revision `rev` as BASE (its imports of itself renamed),
    kept per commit under CACHE so that its kernels compile once; returns the directory to
    put on sys.path."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify",
                                 f"{rev}^{{commit}}"], check=True, capture_output=True,
                                text=True).stdout.strip()
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"--base {rev}: not a revision git knows ({e.stderr.strip()})")
    into = CACHE / commit
    if not (into / BASE).is_dir():
        tmp = Path(tempfile.mkdtemp())  # (renamed into place whole: no half-written copy)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "agentspec"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        for path in (tmp / "agentspec").glob("*.py"):
            path.write_text(_IMPORT.sub(rf"\1 {BASE}", path.read_text()))
        (tmp / "agentspec").rename(tmp / BASE)
        # its kernels compile in a process of their own, as the working tree's did: kernels
        # compiled in the measuring process ran ~1.4% slower than the same loaded from disk
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp)!r}); "
                        f"from {BASE}.policy import warm_up; warm_up()"], check=True)
        into.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(into)
    return str(into)


class Tee:
    """One drafter as the engine sees it, two behind it: every call goes to both, in random
    order, and each one's time is added up per method (ns); the answers must be equal."""

    def __init__(self, drafters: dict[str, object], seed: int = 0):
        self.drafters = drafters
        self.name = next(iter(drafters.values())).name
        self.ns: dict[str, dict[str, int]] = {side: defaultdict(int) for side in drafters}
        self._rng = random.Random(seed)

    def __getattr__(self, method):
        def call(*args, **kwargs):
            sides = list(self.drafters)
            self._rng.shuffle(sides)
            answers = {}
            for side in sides:
                start = drafter_clock()
                answers[side] = getattr(self.drafters[side], method)(*args, **kwargs)
                self.ns[side][method] += drafter_ns(start)
            first, *others = answers.values()
            if any(a != first for a in others):
                raise SystemExit(f"the drafters differ in {method}: "
                                 + "; ".join(f"{s} {a!r}"[:300] for s, a in answers.items()))
            return first
        return call


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_replay_options(ap)
    ap.add_argument("--method", default="full")
    ap.add_argument("--base", default="HEAD", help="git revision to set the working tree against")
    args = ap.parse_args(argv)
    run = load_replay(args, args.method)
    for name in [m for m in sys.modules if m.split(".")[0] == BASE]:
        del sys.modules[name]  # (a revision read by an earlier call)
    path = base_package(args.base)
    sys.path.insert(0, path)
    try:
        base_make = importlib.import_module(f"{BASE}.bench").make_drafter
        tree = make_drafter(args.method, run.setup)
        tee = Tee({"base": base_make(args.method, run.setup), "tree": tree})
        steps = replay(run.tokenized, tee, batch=args.batch).total.steps
    finally:
        sys.path.remove(path)
    us = {side: {m: ns / 1e3 / steps for m, ns in calls.items()} for side, calls in tee.ns.items()}
    total = {side: sum(calls.values()) for side, calls in us.items()}
    report = {"traces": [str(t) for t in args.traces], "sessions": len(run.tokenized),
              "seed": args.seed, "batch": args.batch, "method": args.method,
              "base": args.base, "request_steps": steps, "us_per_request_step": total,
              "by_call": us, "tree_over_base": total["tree"] / total["base"]}
    for side in ("base", "tree"):
        calls = ", ".join(f"{m} {v:.1f}" for m, v in sorted(us[side].items(), key=lambda x: -x[1]))
        print(f"{side:4s} {total[side]:7.1f} us a request-step ({calls})")
    print(f"working tree / {args.base}: {report['tree_over_base']:.4f} over {steps} request-steps")
    return saved(args, report)


if __name__ == "__main__":
    main()
