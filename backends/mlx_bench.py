"""`agentspec bench --backend mlx`: every method generates every recorded call with a real model.

Sessions run one after another, their calls in recorded order. For each call the prompt is
prefilled once (not timed) and every method generates from that shared cache, which is
trimmed back to the prompt afterwards; methods take turns first, call by call, so machine
noise spreads over all of them. `plain` is mlx-lm's own greedy generation.

The drafters' histories follow the recording, as in replay: the recorded prompt messages
are registered before a call, and at its end the RECORDED output is fed to each drafter
(a request started and finished with it), since the recorded agent's next prompts continue
from it. What the model generated is a finished output too: each drafter remembers it as
it would in a deployment (G for ours; vLLM's suffix method adds generated tokens to its
past-response tree while they stream, so it always did).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from agentspec.backends import mlx as engine  # loads OpenBLAS before MLX
from agentspec.bench import (BENCH_FORMAT, BenchResult, BenchSetup, MeasuredRun, knowledge,
                             make_drafter, method_entry)
from agentspec.drafter import Drafter, Request
from agentspec.tokens import TokenizedSession


@dataclass
class MethodRun(MeasuredRun):
    """One method's drafter and what it generated, call by call."""

    drafter: Drafter | None = None  # None: mlx-lm's plain generation

    def add(self, key: str, role: str, gen: "engine.Generation") -> None:
        self.outputs[key] = gen.tokens
        self.seconds += gen.seconds
        self.tokens += len(gen.tokens)
        self.meter.drafter_ns += gen.drafter_ns
        for emitted, drafted, accepted in gen.steps:
            self.meter.row(role, emitted, drafted, accepted)
            self.meter.step(1, drafted)


def method_runs(names: Sequence[str], setup: BenchSetup) -> list[MethodRun]:
    """`plain` first (mlx-lm's generation), then each other method with its drafter."""
    runs = [MethodRun(name, drafter=None if name == "plain" else make_drafter(name, setup))
            for name in dict.fromkeys(["plain", *names])]
    for run in runs:
        if run.drafter is not None:
            run.knowledge = knowledge(run.drafter)
    return runs


def _finish_recorded(d: Drafter, s: TokenizedSession, index: int, prompt: list[int]) -> None:
    """Feed the recorded output as this call's finished output."""
    rec = s.request(index, prompt)
    d.start(rec)
    rec.tokens.extend(s.calls[index].output)
    d.finish(rec)


def run_mlx_bench(sessions: Sequence[TokenizedSession], methods: Sequence[str], *,
                  setup: BenchSetup, model: str | None = None, dtype: str = "float32",
                  max_tokens: int = 128, max_prompt_tokens: int | None = None,
                  traces: Sequence[str] = (), eng: "engine.Engine | None" = None,
                  progress: Callable[[str, int], None] | None = None) -> BenchResult:
    """Generate every call of `sessions` with each method; a bench report (bench-json.md)."""
    eng = eng or engine.load(model, dtype)
    runs = method_runs(methods, setup)
    drafters = [r.drafter for r in runs if r.drafter is not None]
    calls = 0
    prefill_s = 0.0
    for s in sessions:
        for index, tc in enumerate(s.calls):
            for d in drafters:
                tc.register(d, s.id)
            prompt = tc.prompt.tolist()
            if max_prompt_tokens and len(prompt) > max_prompt_tokens:
                prompt = prompt[-max_prompt_tokens:]
            if tc.output:  # as replay: a call with no recorded output generates nothing
                order = runs[calls % len(runs):] + runs[:calls % len(runs)]
                calls += 1
                prefill_s += generate_call(eng, order, prompt,
                                           lambda: s.request(index, prompt, "/generated"),
                                           max_tokens, tc.call.role, f"{s.id}#{index}",
                                           progress=progress)
            for d in drafters:  # the recorded output joins the history, as in replay
                _finish_recorded(d, s, index, prompt)
        for d in drafters:
            d.drop_session(s.id)
    plain = runs[0]
    report = {
        "format": BENCH_FORMAT,
        "backend": "mlx",
        "model": eng.name,
        "traces": [str(t) for t in traces],
        "sessions": len(sessions),
        "calls": calls,
        "batch": 1,
        "dtype": eng.dtype,
        "max_tokens": max_tokens,
        "max_prompt_tokens": max_prompt_tokens,
        "prefill_s": round(prefill_s, 3),
        "blas": engine.blas_in_use(),
        "cache_plan": eng.plan.mode,
        "methods": {r.name: method_entry(r, plain, setup) for r in runs if r.name in methods},
    }
    return BenchResult(report, {r.name: r.meter for r in runs}, plain.outputs)


def generate_call(eng: "engine.Engine", runs: Sequence[MethodRun], prompt: list[int],
                  make_request: Callable[[], Request], max_tokens: int, role: str, key: str, *,
                  progress: Callable[[str, int], None] | None = None) -> float:
    """Generate one call with every method in `runs`, in that order, from one prefill
    (engine.generate_each); each run's meter, time and `outputs[key]` are updated.
    Returns the prefill seconds."""
    prefill_s, gens = engine.generate_each(eng, {r.name: r.drafter for r in runs}, prompt,
                                           make_request, max_tokens)
    for run in runs:
        run.add(key, role, gens[run.name])
        if progress:
            progress(run.name, len(gens[run.name].tokens))
    return prefill_s


def load_engine(model: str | None, dtype: str, console) -> "engine.Engine":
    """The engine `agentspec bench --backend mlx` generates with, loaded while `console`
    says so, with a line on what slows this machine's run (no OpenBLAS, no cache plan)."""
    if engine.BLAS is None and sys.platform == "linux":
        console.print("[yellow]note:[/] OpenBLAS not loaded: float32 matmuls use MLX's "
                      "reference BLAS (install libopenblas0-pthread: scripts/setup.sh)")
    with console.status("loading the model"):
        eng = engine.load(model, dtype)
    if eng.plan.mode == "none" or eng.plan.reason:
        console.print(f"[yellow]warning:[/] {eng.plan.reason}", highlight=False)
    return eng
