"""`agentspec profile-lambda --backend mlx`: the cost of verifying one more token.

Times forward passes of b rows x (k+1) tokens on a cache already holding `context`
tokens per row, fits lambda(b) (agentspec.costs.fit_lambda) and writes an
`agentspec.cost/1` profile. Profiles are also kept per backend, model, dtype and machine
under $AGENTSPEC_HOME/profiles/, where `bench --backend mlx` finds them by default.
"""

from __future__ import annotations

import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter
from typing import Callable, Sequence

from agentspec import costs
from agentspec.backends import mlx as engine  # loads OpenBLAS before MLX
from agentspec.bench import parse_batches
from agentspec.costs import BatchCost, CostProfile, fit_lambda, tokens_per_row

import mlx.core as mx  # noqa: E402  (after the BLAS preload above)


def _device() -> str:
    return str(mx.default_device().type).rsplit(".", 1)[-1]


def machine() -> str:
    """A readable description of this machine and its math library."""
    blas = f"OpenBLAS {engine.blas_core()}" if engine.blas_in_use() else (
        "Accelerate" if platform.system() == "Darwin" else "reference BLAS")
    return costs.machine(f"MLX {mx.__version__} ({_device()}, {blas})")


def profile_path(backend: str, model: str | None, dtype: str) -> Path:
    return costs.profile_path(backend, model, dtype, machine())


def default_profile(backend: str, model: str | None, dtype: str = "float32") -> Path | None:
    """The cached profile of this backend, model and dtype on this machine, if measured."""
    path = profile_path(backend, model, dtype)
    return path if path.is_file() else None


def _time_pass(model, x: mx.array, cache: list, repeats: int, warmup: int) -> float:
    """Median seconds of one forward pass of `x` (evaluated through argmax), then rolled back."""
    n = x.shape[1]
    times = []
    for i in range(warmup + repeats):
        t0 = perf_counter()
        mx.eval(mx.argmax(model(x, cache=cache), axis=-1))
        if i >= warmup:
            times.append(perf_counter() - t0)
        if engine.trim_prompt_cache(cache, n) != n:
            raise engine.MLXError("the cache could not roll back a timed pass")
    return statistics.median(times)


def measure(model, batch: int, context: int, points: Sequence[int], repeats: int = 5,
            warmup: int = 2, seed: int = 0,
            progress: Callable[[int, int], None] | None = None) -> BatchCost:
    """Median forward-pass seconds of `batch` rows at each tokens-per-row point."""
    plan = engine.plan_for(model)
    if plan.mode == "none":
        raise engine.MLXError(f"cannot profile verification: {plan.reason}")
    vocab = min(engine._vocab(model), 32000)
    mx.random.seed(seed)
    cache = plan.make(model, context + max(points))
    fill = mx.random.randint(0, vocab, (batch, context))
    for i in range(0, context, 512):
        model(fill[:, i:i + 512], cache=cache)
        mx.eval([c.state for c in cache])
    seconds = []
    for n in points:
        x = mx.random.randint(0, vocab, (batch, n))
        seconds.append(_time_pass(model, x, cache, repeats, warmup))
        if progress:
            progress(batch, n)
    return BatchCost(list(points), seconds, fit_lambda(batch, list(points), seconds))


def profile(eng: "engine.Engine", batches: Sequence[int], max_k: int = 32, context: int = 1024,
            repeats: int = 5, progress: Callable[[int, int], None] | None = None) -> CostProfile:
    points = tokens_per_row(max_k)
    if eng.context and context + points[-1] > eng.context:
        raise engine.MLXError(f"--context {context} plus {points[-1]} verified tokens exceeds "
                              f"the model's context of {eng.context}")
    costs = {b: measure(eng.model, b, context, points, repeats, progress=progress)
             for b in batches}
    return CostProfile(backend="mlx", model=eng.name, batches=costs, dtype=eng.dtype,
                       machine=machine(),
                       created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       context_tokens=context)


def run_cli(model: str | None, dtype: str, batches: str, max_k: int, context: int,
            repeats: int, out: Path | None, plot_out: Path | None, console, stdout) -> None:
    """The whole `profile-lambda --backend mlx` command; raises MLXError for bad input."""
    sizes = parse_batches(batches)
    if engine.BLAS is None and platform.system() == "Linux":
        console.print("[yellow]note:[/] OpenBLAS not loaded: float32 matmuls use MLX's "
                      "reference BLAS (install libopenblas0-pthread: scripts/setup.sh)")
    with console.status("loading the model"):
        eng = engine.load(model, dtype)
    points = tokens_per_row(max_k)
    done = [0]
    with console.status("profiling") as status:
        def tick(b: int, n: int) -> None:
            done[0] += 1
            status.update(f"profiling: batch {b}, {n} tokens per row "
                          f"({done[0]}/{len(sizes) * len(points)})")

        prof = profile(eng, sizes, max_k, context, repeats, progress=tick)
    costs.publish(prof, profile_path("mlx", model, dtype), out, plot_out, console, stdout,
                  "bench --backend mlx uses it by default")
