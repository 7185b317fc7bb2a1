"""Cost profiles in the `agentspec.cost/1` format (shared/spec/cost-profile.md).

lambda(b) is the cost of verifying one more token, in units of the per-token cost of
plain decoding at batch size b; a draft token accepted with probability below lambda(b)
costs more than it saves.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "agentspec.cost/1"
TOKENS_PER_ROW = (1, 2, 3, 5, 9, 17, 33, 65, 129, 257)


class CostProfileError(ValueError):
    """A cost profile file that cannot be used; the message names the file and the problem."""


def fit_lambda(batch: int, tokens_per_row: list[int], seconds: list[float]) -> float:
    """lambda(b) = slope / (t(b,1) / b), slope = d t / d (total tokens in the step)."""
    total = np.asarray(tokens_per_row, dtype=np.float64) * batch
    t = np.asarray(seconds, dtype=np.float64)
    slope = float(np.polyfit(total, t, 1)[0]) if len(t) > 1 else 0.0
    t1 = float(t[list(tokens_per_row).index(1)])
    return max(slope, 0.0) / (t1 / batch)


@dataclass
class BatchCost:
    tokens_per_row: list[int]
    seconds: list[float]
    lam: float


def _relative_costs(c: "BatchCost", max_k: int) -> np.ndarray:
    """(t(n + 1) - t(1)) / t(1) for n = 0..max_k from one batch size's measured points."""
    x = np.asarray(c.tokens_per_row, dtype=np.float64)
    t = np.maximum.accumulate(np.asarray(c.seconds, dtype=np.float64))
    n = np.arange(1, max_k + 2, dtype=np.float64)
    at = np.interp(n, x, t)
    if len(x) > 1 and n[-1] > x[-1]:
        slope = (t[-1] - t[-2]) / (x[-1] - x[-2])
        past = n > x[-1]
        at[past] = t[-1] + slope * (n[past] - x[-1])
    t1 = float(np.interp(1.0, x, t))
    return (at - t1) / t1


def linear_costs(lam: float, max_k: int) -> np.ndarray:
    """C[n] = lambda * n: the cost model of a fixed lambda."""
    return lam * np.arange(max_k + 1, dtype=np.float64)


@dataclass
class CostProfile:
    backend: str
    model: str
    batches: dict[int, BatchCost]
    dtype: str = ""
    machine: str = ""
    created: str = ""
    context_tokens: int = 0
    extra: dict = field(default_factory=dict)

    def _interp(self, b: int, values: list[float]) -> float:
        sizes = sorted(self.batches)
        return float(np.interp(b, sizes, values))

    def step_time(self, b: int) -> float:
        """Seconds of one plain decode step for b rows."""
        sizes = sorted(self.batches)
        return self._interp(b, [self.batches[s].seconds[self.batches[s].tokens_per_row.index(1)]
                                for s in sizes])

    def lam(self, b: int) -> float:
        sizes = sorted(self.batches)
        return self._interp(b, [self.batches[s].lam for s in sizes])

    def draft_costs(self, b: int, max_k: int) -> np.ndarray:
        """C[n], n = 0..max_k: what verifying n draft tokens per row costs at batch size b,
        in plain decode steps, read off the measured curve (made non-decreasing, extended
        past its last point by its last slope) rather than the fitted lambda: on a CPU the
        first draft tokens often cost more than the slope says."""
        sizes = sorted(self.batches)
        curves = [_relative_costs(self.batches[s], max_k) for s in sizes]
        return np.array([np.interp(b, sizes, [c[n] for c in curves])
                         for n in range(max_k + 1)])

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "backend": self.backend, "model": self.model, "dtype": self.dtype,
            "machine": self.machine, "created": self.created,
            "context_tokens": self.context_tokens,
            "batches": {str(b): {"tokens_per_row": c.tokens_per_row, "seconds": c.seconds,
                                 "lambda": c.lam}
                        for b, c in sorted(self.batches.items())},
            **self.extra,
        }

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def read_format(path: str | Path, fmt: str, what: str, error: type[ValueError]) -> dict:
    """Read a JSON object of format `fmt`; any problem raises `error` naming the file."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path}: not a readable JSON {what} ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        raise error(f"{path}: format is not {fmt!r}")
    return obj


def load_profile(path: str | Path) -> CostProfile:
    obj = read_format(path, FORMAT, "cost profile", CostProfileError)
    batches = {}
    try:
        for key, entry in obj["batches"].items():
            b = int(key)
            tokens = [int(x) for x in entry["tokens_per_row"]]
            secs = [float(x) for x in entry["seconds"]]
            lam = float(entry["lambda"])
            if b < 1 or len(tokens) != len(secs) or 1 not in tokens:
                raise ValueError(f"batch {key}: needs b >= 1, matching lists and a 1-token point")
            if not all(s > 0 and math.isfinite(s) for s in secs) or not math.isfinite(lam) or lam < 0:
                raise ValueError(f"batch {key}: seconds must be positive and lambda >= 0")
            batches[b] = BatchCost(tokens, secs, lam)
    except KeyError as e:
        raise CostProfileError(f"{path}: bad 'batches' entry: no {e}") from None
    except ValueError as e:
        raise CostProfileError(f"{path}: bad 'batches' entry ({e})") from None
    except (TypeError, AttributeError):
        raise CostProfileError(f"{path}: 'batches' must be an object of batch size: "
                               '{"tokens_per_row": [...], "seconds": [...], "lambda": x}') from None
    if not batches:
        raise CostProfileError(f"{path}: no batch sizes measured")
    known = {"format", "backend", "model", "dtype", "machine", "created", "context_tokens",
             "batches"}
    return CostProfile(backend=str(obj.get("backend", "")), model=str(obj.get("model", "")),
                       batches=batches, dtype=str(obj.get("dtype", "")),
                       machine=str(obj.get("machine", "")), created=str(obj.get("created", "")),
                       context_tokens=int(obj.get("context_tokens", 0) or 0),
                       extra={k: v for k, v in obj.items() if k not in known})


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


def machine(engine: str) -> str:
    """A readable description of this machine and of the engine doing the math."""
    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
            f"{_cpu_name()}, {engine}")


def model_key(model: str | None) -> str:
    """A file-name-safe key for what the user typed as --model; an embedded model's folder
    has its name as key, as the name itself does."""
    from agentspec.models import DEFAULT_MODEL, EMBEDDED, models_dir

    model = model or DEFAULT_MODEL
    if model in EMBEDDED:
        return model
    path = Path(model).expanduser()
    if path.is_dir() and path.resolve().parent == models_dir().resolve() \
            and path.name in EMBEDDED:
        return path.name
    if path.is_dir():
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        return f"{re.sub(r'[^A-Za-z0-9._-]', '_', path.resolve().name)}-{digest}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", model.replace("/", "--"))


def host_profile_path(backend: str, model: str | None, dtype: str | None) -> Path:
    """Where the profile of an engine that runs in another Python (vLLM) is cached for this
    host: keyed by what the user asked for, since the engine describes itself only once
    started."""
    return profile_path(backend, model, dtype or "auto", machine(backend))


def profile_path(backend: str, model: str | None, dtype: str, machine: str) -> Path:
    """Where profiles are kept per backend, model, dtype and machine description."""
    from agentspec.models import home

    digest = hashlib.sha1(machine.encode()).hexdigest()[:10]
    return home() / "profiles" / f"{backend}-{model_key(model)}-{dtype}-{digest}.json"


def plot_profile(prof: CostProfile, path: str | Path) -> None:
    """Step time against tokens per row, one line per batch size, lambda in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b, c in sorted(prof.batches.items()):
        ax.plot(c.tokens_per_row, [s * 1e3 for s in c.seconds], marker="o",
                label=f"b={b}  λ={c.lam:.3f}")
    ax.set_xlabel("tokens per row (k + 1)")
    ax.set_ylabel("step (ms)")
    ax.set_title(f"{prof.backend} · {prof.model} {prof.dtype}, {prof.context_tokens} cached "
                 f"tokens", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def profile_table(prof: CostProfile):
    """The profile as a rich table: milliseconds per point, lambda per batch size."""
    from rich.table import Table

    points = next(iter(prof.batches.values())).tokens_per_row
    t = Table(title=f"λ profile · {prof.backend} · {prof.model} {prof.dtype} · "
              f"{prof.context_tokens} cached tokens · {prof.machine}")
    t.add_column("batch", justify="right")
    for n in points:
        t.add_column(f"{n} tok (ms)", justify="right")
    t.add_column("λ(b)", justify="right")
    for b, c in sorted(prof.batches.items()):
        t.add_row(str(b), *[f"{s * 1e3:.1f}" for s in c.seconds], f"{c.lam:.4f}")
    return t


def publish(prof: CostProfile, cached: Path, out: Path | None, plot_out: Path | None,
            console, stdout, note: str = "") -> None:
    """Show a just-measured profile, keep it in the cache, and write --out and --plot."""
    stdout.print(profile_table(prof))
    prof.save(cached)
    if out:
        prof.save(out)
        console.print(f"wrote {out}")
    console.print(f"cached as {cached}" + (f" ({note})" if note else ""))
    if plot_out:
        plot_profile(prof, plot_out)
        console.print(f"wrote {plot_out}")
