"""`agentspec profile-lambda --backend mlx`: the cost of verifying one more token.

Times forward passes of b rows x (k+1) tokens on a cache already holding `context`
tokens per row, fits lambda(b) (agentspec.costs.fit_lambda) and writes an
`agentspec.cost/1` profile. Profiles are also kept per backend, model, dtype and machine
under $AGENTSPEC_HOME/profiles/, where `bench --backend mlx` finds them by default.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import statistics
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter
from typing import Callable, Sequence

from agentspec.backends import mlx as engine  # loads OpenBLAS before MLX
from agentspec.backends.models import EMBEDDED, DEFAULT_MODEL, home
from agentspec.costs import BatchCost, CostProfile, fit_lambda

import mlx.core as mx  # noqa: E402  (after the BLAS preload above)

TOKENS_PER_ROW = (1, 2, 3, 5, 9, 17, 33, 65, 129, 257)


def tokens_per_row(max_k: int) -> list[int]:
    """1, 2, 3, 5, 9, 17, 33, ... up to max_k + 1 (always ending on it)."""
    points = [n for n in TOKENS_PER_ROW if n <= max_k + 1]
    if points[-1] != max_k + 1:
        points.append(max_k + 1)
    return points


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device() -> str:
    return str(mx.default_device().type).rsplit(".", 1)[-1]


def machine() -> str:
    """A readable description of this machine and its math library."""
    blas = "OpenBLAS" if engine.blas_in_use() else ("Accelerate" if platform.system() ==
                                                     "Darwin" else "reference BLAS")
    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
            f"{_cpu_name()}, MLX {mx.__version__} ({_device()}, {blas})")


def machine_hash() -> str:
    return hashlib.sha1(machine().encode()).hexdigest()[:10]


def model_key(model: str | None) -> str:
    """A file-name-safe key for what the user typed as --model."""
    model = model or DEFAULT_MODEL
    if model in EMBEDDED:
        return model
    path = Path(model).expanduser()
    if path.is_dir():
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        return f"{re.sub(r'[^A-Za-z0-9._-]', '_', path.resolve().name)}-{digest}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", model.replace("/", "--"))


def profile_path(backend: str, model: str | None, dtype: str) -> Path:
    return home() / "profiles" / f"{backend}-{model_key(model)}-{dtype}-{machine_hash()}.json"


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


def plot(prof: CostProfile, path: str | Path) -> None:
    """Step time against tokens per row, one line per batch size, lambda in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b, c in sorted(prof.batches.items()):
        ax.plot(c.tokens_per_row, [s * 1e3 for s in c.seconds], marker="o",
                label=f"b={b}  λ={c.lam:.3f}")
    ax.set_xlabel("tokens per row (k + 1)")
    ax.set_ylabel("forward pass (ms)")
    ax.set_title(f"{prof.model} {prof.dtype}, {prof.context_tokens} cached tokens", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_batches(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise engine.MLXError(f"--batch must be comma-separated integers, not {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise engine.MLXError("--batch needs batch sizes of at least 1")
    return sizes


def table(prof: CostProfile):
    from rich.table import Table

    points = next(iter(prof.batches.values())).tokens_per_row
    t = Table(title=f"λ profile · {prof.model} {prof.dtype} · {prof.context_tokens} cached "
              f"tokens · {prof.machine}")
    t.add_column("batch", justify="right")
    for n in points:
        t.add_column(f"{n} tok (ms)", justify="right")
    t.add_column("λ(b)", justify="right")
    for b, c in sorted(prof.batches.items()):
        t.add_row(str(b), *[f"{s * 1e3:.1f}" for s in c.seconds], f"{c.lam:.4f}")
    return t


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
    stdout.print(table(prof))
    cached = profile_path("mlx", model, dtype)
    prof.save(cached)
    if out:
        prof.save(out)
        console.print(f"wrote {out}")
    console.print(f"cached as {cached} (bench --backend mlx uses it by default)")
    if plot_out:
        plot(prof, plot_out)
        console.print(f"wrote {plot_out}")
