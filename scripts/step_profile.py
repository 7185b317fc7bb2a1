#!/usr/bin/env python
"""Where a drafter's step goes: its compiled kernels' calls, and the interpreter's rest.

The bench's figure (`overhead_us_per_step`) is the drafter's time in propose and observe a
request-step. Here every call the drafter makes into a numba kernel (agentspec._policy_nb,
_accept_nb, _match_nb, as the policy, the acceptance model and the corpora call them; the
dispatch included, timed where the step makes it) is added up per kernel, apart from the
calls made between steps (registering text, starting and finishing calls). The rest of
propose and observe is the interpreter's. A step compiled end to end would keep the
kernels' share (less their dispatch) and drop the rest:

    .venv/bin/python scripts/step_profile.py --traces ../shared/traces/sweagent-gpt4-run-1.jsonl.gz \\
        --sessions 8 --seed 7

Timing a kernel call adds ~0.3 us to it (counted in the kernels' share), and marking the
step ~0.5 us a call to propose and observe (in the interpreter's); the figures move with the
host's load as the bench's do, the share much less.

Of each kernel's time, numba's dispatch (checking and unboxing its arguments, before any of
its work) is measured apart: an empty kernel is given the arguments of some of its calls in
steps (every SAMPLE_EVERY-th, kept as they were passed) and timed, in this process after
the replay. A step compiled end to end would pay it once, for fewer arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentspec import allocator, match, policy  # noqa: E402
from agentspec.bench import make_drafter  # noqa: E402
from agentspec.replay import replay  # noqa: E402
from scripts.replay_options import add_replay_options, load_replay, saved  # noqa: E402

# the modules whose kernels the drafter calls, each by its own name for them
CALLERS = (policy, allocator, match)
STEP_CALLS = ("propose", "observe")
SAMPLE_EVERY, SAMPLES = 97, 50  # the calls in steps whose arguments time the dispatch


class Kernels:
    """The kernels' time, per kernel, inside propose and observe (`inside`) and between steps."""

    def __init__(self):
        self.inside = False
        self.ns = {True: defaultdict(int), False: defaultdict(int)}
        self.calls = {True: defaultdict(int), False: defaultdict(int)}
        self.samples = defaultdict(list)  # some calls' arguments in steps, per kernel

    def timed(self, name: str, kernel):
        def call(*args):
            start = time.perf_counter_ns()
            try:
                return kernel(*args)
            finally:
                self.ns[self.inside][name] += time.perf_counter_ns() - start
                self.calls[self.inside][name] += 1
                if self.inside and len(self.samples[name]) < SAMPLES \
                        and self.calls[True][name] % SAMPLE_EVERY == 1:
                    self.samples[name].append(args)
        return call


def dispatch_us(samples: list[tuple], repeats: int = 200) -> float:
    """What numba's dispatch alone costs a call given these arguments: an empty kernel,
    compiled for their types first, called with each in turn."""
    from numba import njit

    @njit
    def empty(*args):
        return 0

    for args in samples:
        empty(*args)
    start = time.perf_counter_ns()
    for _ in range(repeats):
        for args in samples:
            empty(*args)
    return (time.perf_counter_ns() - start) / 1e3 / (repeats * len(samples))


class TimedModule:
    """A kernel module as its callers see it: each jitted function timed by `kernels`,
    everything else (constants) as it is."""

    def __init__(self, module, kernels: Kernels):
        self._module, self._kernels, self._timed = module, kernels, {}

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not hasattr(value, "py_func"):  # (a numba dispatcher keeps its Python function)
            return value
        if name not in self._timed:
            self._timed[name] = self._kernels.timed(name, value)
        return self._timed[name]


class Stepping:
    """The drafter as the replay calls it, `kernels.inside` set during propose and observe."""

    def __init__(self, drafter, kernels: Kernels):
        self._drafter, self._kernels = drafter, kernels

    def __getattr__(self, name):
        value = getattr(self._drafter, name)
        if name not in STEP_CALLS:
            return value

        def call(*args, **kwargs):
            self._kernels.inside = True
            try:
                return value(*args, **kwargs)
            finally:
                self._kernels.inside = False
        return call


def profile(run, method: str, batch: int) -> dict:
    """Replay `run`'s sessions with `method`, its kernels timed (the callers' modules are
    restored after, whatever happens)."""
    kernels = Kernels()
    originals = [(module, module._nb) for module in CALLERS]
    for module, kernel_module in originals:
        if kernel_module is not None:
            module._nb = TimedModule(kernel_module, kernels)
    try:
        drafter = make_drafter(method, run.setup)  # (its corpora keep the timed module)
        kernels.ns[False].clear()
        kernels.calls[False].clear()
        meter = replay(run.tokenized, Stepping(drafter, kernels), batch=batch)
    finally:
        for module, kernel_module in originals:
            module._nb = kernel_module
    steps = meter.total.steps
    per_step = {inside: {name: {"us": ns / 1e3 / steps,
                                "calls": kernels.calls[inside][name] / steps}
                         for name, ns in sorted(kernels.ns[inside].items(), key=lambda x: -x[1])}
                for inside in (True, False)}
    for name, samples in kernels.samples.items():  # (us a call, as `us` is a step)
        per_step[True][name]["dispatch_us"] = dispatch_us(samples)
    overhead = meter.drafter_ns / 1e3 / steps
    in_kernels = sum(k["us"] for k in per_step[True].values())
    return {"method": method, "batch": batch, "request_steps": steps,
            "compiled": any(kernel_module is not None for _, kernel_module in originals),
            "overhead_us_per_step": overhead,
            "call_overhead_us_per_step": meter.call_ns / 1e3 / steps,
            "kernels_us_per_step": in_kernels, "interpreter_us_per_step": overhead - in_kernels,
            "kernel_share": in_kernels / overhead if overhead else 0.0,
            "kernels": per_step[True], "kernels_between_steps": per_step[False]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_replay_options(ap)
    ap.add_argument("--method", default="full")
    args = ap.parse_args(argv)
    run = load_replay(args, args.method)
    report = {"traces": [str(t) for t in args.traces], "sessions": len(run.tokenized),
              "seed": args.seed, **profile(run, args.method, args.batch)}
    if not report["compiled"]:
        print("no kernels: numba is off here (AGENTSPEC_NO_NUMBA=1 or not installed)")
    print(f"{args.method}, batch {args.batch}, {report['request_steps']} request-steps: "
          f"propose and observe {report['overhead_us_per_step']:.1f} us a request-step "
          f"(calls between steps {report['call_overhead_us_per_step']:.1f})")
    print(f"  kernels {report['kernels_us_per_step']:.1f} us "
          f"({report['kernel_share']:.0%}), the interpreter's rest "
          f"{report['interpreter_us_per_step']:.1f}")
    for name, k in report["kernels"].items():
        print(f"    {name:20s} {k['us']:7.1f} us  {k['calls']:5.2f} calls  "
              f"(dispatch {k['dispatch_us']:.1f} us a call)")
    return saved(args, report)


if __name__ == "__main__":
    main()
