"""MLX engine: a real model verifies retrieved drafts, losslessly.

Each step feeds a request's pending token plus its k draft tokens in one forward pass,
accepts the longest draft prefix equal to the target's own choice at each position, adds
the target's next token, and rolls the rejected positions back out of the KV cache. The
output is the output of plain decoding, token for token.

Cache kinds decide whether rollback is possible (`plan_cache`):
- trim: every layer keeps a trimmable KV cache (`trim_prompt_cache`, count checked);
- full: sliding-window layers get a full `KVCache` instead of their `RotatingKVCache`,
  once a probe showed the model masks the window itself (else only while a request
  fits in the window);
- none: linear-attention / SSM state (`ArraysCache`, ...) cannot roll back: plain
  decoding, with one warning.

On Linux, MLX runs on the CPU and its float32 matmuls call whatever `cblas_sgemm` is
loaded first; importing this module loads OpenBLAS (Debian's libopenblas0-pthread)
globally before MLX, which makes those matmuls ~15x faster.
"""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys
import warnings
import weakref
from dataclasses import dataclass, field
from time import perf_counter, perf_counter_ns
from typing import Callable, Sequence

# ---------------------------------------------------------------- BLAS (before mlx)

OPENBLAS_ENV = "AGENTSPEC_OPENBLAS"  # a libopenblas.so.0 to use instead of the search
NO_BLAS_ENV = "AGENTSPEC_NO_BLAS"  # set to 1 to keep MLX's reference BLAS
_OPENBLAS_GLOBS = (
    "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


def find_openblas() -> str | None:
    """Debian's libopenblas0-pthread library, or None when not installed (or not Linux)."""
    if sys.platform != "linux":
        return None
    if os.environ.get(OPENBLAS_ENV):
        return os.environ[OPENBLAS_ENV] if os.path.isfile(os.environ[OPENBLAS_ENV]) else None
    try:
        listed = subprocess.run(["dpkg", "-L", "libopenblas0-pthread"], capture_output=True,
                                text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    for path in [p for p in listed if p.endswith("openblas-pthread/libopenblas.so.0")] + [
            p for g in _OPENBLAS_GLOBS for p in sorted(glob.glob(g))]:
        if os.path.isfile(path):
            return path
    return None


def blas_in_use() -> str | None:
    """The OpenBLAS library mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libopenblas" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def preload_blas() -> str | None:
    """Load OpenBLAS globally so MLX (imported after) resolves cblas_sgemm to it.

    Same effect as LD_PRELOAD, without restarting the process; it must run before the
    first `import mlx.core`. Returns the library in use, or None.
    """
    if sys.platform != "linux" or os.environ.get(NO_BLAS_ENV) == "1":
        return None
    if blas_in_use():
        return blas_in_use()
    if "mlx.core" in sys.modules:
        return None  # too late: MLX already bound its BLAS
    path = find_openblas()
    if path is None:
        return None
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return path


def ensure_blas_or_reexec() -> None:
    """For CLI commands: if MLX is already imported without OpenBLAS, restart with LD_PRELOAD.

    Normally importing this module first is enough; this covers processes that imported
    MLX earlier. Guarded by an environment flag so it re-executes at most once.
    """
    if sys.platform != "linux" or blas_in_use() or os.environ.get(NO_BLAS_ENV) == "1":
        return
    if os.path.basename(sys.argv[0] if sys.argv else "") != "agentspec":
        return  # only the console script restarts itself (never a test runner or a library user)
    path = find_openblas()
    if path is None or os.environ.get("AGENTSPEC_BLAS_REEXEC") == "1":
        return
    env = dict(os.environ, AGENTSPEC_BLAS_REEXEC="1",
               LD_PRELOAD=":".join(p for p in (path, os.environ.get("LD_PRELOAD")) if p))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


BLAS = preload_blas()

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models.cache import (ArraysCache, BatchKVCache, KVCache,  # noqa: E402
                                 RotatingKVCache, make_prompt_cache, trim_prompt_cache)

from agentspec.drafter import Drafter, Request  # noqa: E402


class MLXError(Exception):
    """The MLX engine cannot do what was asked; the message says why."""


# ---------------------------------------------------------------- loading

DTYPES = {"keep": None, "float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass
class Engine:
    """A loaded model with what generation needs to know about it."""

    model: nn.Module
    tokenizer: object  # mlx-lm's TokenizerWrapper
    path: str
    name: str
    dtype: str
    plan: "CachePlan"
    context: int | None  # max_position_embeddings, when the config says
    stop_ids: tuple[int, ...]


def load(model: str | None = None, dtype: str = "float32") -> Engine:
    """Load an embedded model name, a local folder or a (locally cached) hub id."""
    from agentspec.backends.models import EMBEDDED, ModelError, resolve

    if dtype not in DTYPES:
        raise MLXError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    try:
        path = resolve(model)
    except ModelError as e:
        raise MLXError(str(e)) from None
    try:
        import mlx_lm

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m, tok, config = mlx_lm.load(str(path), return_config=True)
    except Exception as e:  # mlx-lm raises many types for a folder it cannot load
        first = str(e).splitlines()[0] if str(e) else ""
        raise MLXError(f"could not load the model in {path} with mlx-lm "
                       f"({type(e).__name__}: {first})") from None
    if DTYPES[dtype] is not None:
        m.set_dtype(DTYPES[dtype])
        mx.eval(m.parameters())
    name = EMBEDDED[model or "smollm2-135m"].id if (model or "smollm2-135m") in EMBEDDED \
        else path.name
    context = config.get("max_position_embeddings") if isinstance(config, dict) else None
    stop = tuple(sorted(int(i) for i in (getattr(tok, "eos_token_ids", None) or ())))
    return Engine(m, tok, str(path), name, dtype, plan_for(m), context, stop)


# ---------------------------------------------------------------- cache kinds


@dataclass
class CachePlan:
    """How this model's cache rolls back rejected draft tokens."""

    mode: str  # trim | full | none
    reason: str = ""
    swap: tuple[int, ...] = ()  # layers whose RotatingKVCache becomes a KVCache
    window: int | None = None  # full mode: speculate only while a request fits (probe failed)
    warned: bool = False

    def speculates(self, total_tokens: int = 0) -> bool:
        if self.mode == "trim":
            return True
        if self.mode == "full":
            return self.window is None or total_tokens <= self.window
        return False

    def make(self, model: nn.Module, total_tokens: int = 0) -> list:
        cache = make_prompt_cache(model)
        if self.mode == "full" and self.speculates(total_tokens):
            for i in self.swap:
                cache[i] = KVCache()
        return cache

    def disable(self, reason: str) -> None:
        self.mode, self.reason, self.warned = "none", reason, False

    def warn_once(self) -> None:
        if self.mode == "none" and not self.warned:
            self.warned = True
            warnings.warn(f"speculation disabled, decoding plainly: {self.reason}", stacklevel=3)


_PLANS: dict[int, tuple[weakref.ref, CachePlan]] = {}


def plan_for(model: nn.Module) -> CachePlan:
    """The model's cache plan, detected once per model object."""
    hit = _PLANS.get(id(model))
    if hit is not None and hit[0]() is model:
        return hit[1]
    plan = plan_cache(model)
    _PLANS[id(model)] = (weakref.ref(model), plan)
    return plan


def _vocab(model: nn.Module) -> int:
    args = getattr(model, "args", None)
    return int(getattr(args, "vocab_size", 0) or 0) or (1 << 31)  # unknown: no clipping


def _logits(model: nn.Module, tokens: Sequence[int] | mx.array, cache: list) -> mx.array:
    x = tokens if isinstance(tokens, mx.array) else mx.array([list(tokens)], dtype=mx.int32)
    return model(x, cache=cache)


def _trim_works(model: nn.Module, cache: list) -> bool:
    """Feed 3 tokens, trim 1: the count and every layer's size must say 2."""
    mx.eval(_logits(model, [1, 2, 3], cache))
    if trim_prompt_cache(cache, 1) != 1:
        return False
    sizes = [c.size() for c in cache if hasattr(c, "size")]
    return all(s == 2 for s in sizes if s)


def _window_probe(model: nn.Module, swap: tuple[int, ...], window: int,
                  limit: int = 4096) -> bool:
    """Does a full KVCache give the sliding-window layers the same logits past the window?"""
    if window + 8 > limit:
        return False
    n = window + 8
    ids = [(7 * i + 3) % min(_vocab(model), 1000) for i in range(n)]
    outs = []
    for full in (False, True):
        cache = make_prompt_cache(model)
        if full:
            for i in swap:
                cache[i] = KVCache()
        mx.eval(_logits(model, ids[: window - 2], cache))
        steps = [_logits(model, [t], cache)[0, -1] for t in ids[window - 2:]]
        outs.append(mx.stack(steps).astype(mx.float32))
    a, b = outs
    tol = 1e-2 * (1.0 + mx.max(mx.abs(a)).item())
    return bool(mx.max(mx.abs(a - b)).item() <= tol and
                (mx.argmax(a, -1) == mx.argmax(b, -1)).all().item())


def plan_cache(model: nn.Module) -> CachePlan:
    """Detect whether (and how) this model's cache can roll back."""
    cache = make_prompt_cache(model)
    if not cache:
        return CachePlan("none", "the model makes no cache")
    swap, windows = [], []
    for i, c in enumerate(cache):
        if isinstance(c, RotatingKVCache):
            swap.append(i)
            windows.append(c.max_size)
        elif isinstance(c, ArraysCache) or not c.is_trimmable():
            return CachePlan("none", f"layer {i} keeps a {type(c).__name__} (recurrent or "
                             "linear-attention state), which cannot roll back")
    plan = CachePlan("full", swap=tuple(swap)) if swap else CachePlan("trim")
    try:
        ok = _trim_works(model, plan.make(model))
    except Exception as e:  # the model rejects the replacement cache
        return CachePlan("none", f"the model does not run with a full KV cache in its sliding-"
                         f"window layers ({type(e).__name__}: {e})")
    if not ok:
        return CachePlan("none", "trimming its cache did not remove the trimmed tokens")
    if swap:
        window = min(windows)
        if not _window_probe(model, plan.swap, window):
            plan.window = window
            plan.reason = (f"sliding-window layers are not masked by the model itself: "
                           f"speculating only while a request fits in {window} tokens")
    return plan


def cache_len(cache: list) -> int:
    """Tokens held by a KV cache (first layer that counts them)."""
    for c in cache:
        off = getattr(c, "offset", None)
        if isinstance(off, int):
            return off
    return -1


def prefill(model: nn.Module, tokens: Sequence[int], cache: list | None = None,
            plan: CachePlan | None = None, total_tokens: int = 0, step: int = 2048) -> list:
    """Feed `tokens` into `cache` (a new one when None) in chunks; returns the cache."""
    plan = plan or plan_for(model)
    if cache is None:
        cache = plan.make(model, total_tokens)
    for i in range(0, len(tokens), step):
        model(mx.array([list(tokens[i:i + step])], dtype=mx.int32), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def rollback(cache: list, n: int, plan: CachePlan) -> None:
    """Trim n tokens off every layer; anything less disables speculation and raises."""
    if n <= 0:
        return
    done = trim_prompt_cache(cache, n)
    if done != n:
        plan.disable(f"trim_prompt_cache removed {done} of {n} tokens")
        raise _TrimFailed(plan.reason)


class _TrimFailed(MLXError):
    pass


# ---------------------------------------------------------------- choosing tokens


def _key(seed: int, position: int) -> mx.array:
    return mx.random.key((seed * 1_000_003 + position) % (1 << 62))


def choose(logits: mx.array, temperature: float, seed: int, first: int) -> list[int]:
    """Target's token at each position of `logits` (L, V); position j is output index first+j.

    Greedy at temperature 0; otherwise a Gumbel-max sample whose noise depends only on
    (seed, output index), so any schedule of verification steps samples the same tokens.
    """
    if temperature <= 0:
        return mx.argmax(logits, axis=-1).tolist()
    scaled = logits.astype(mx.float32) / temperature
    noise = mx.stack([mx.random.gumbel((logits.shape[-1],), key=_key(seed, first + j))
                      for j in range(logits.shape[0])])
    return mx.argmax(scaled + noise, axis=-1).tolist()


# ---------------------------------------------------------------- one request


@dataclass
class Generation:
    """What one request generated, and how."""

    tokens: list[int]  # output, without the stop token
    finish: str  # stop | length
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (emitted, drafted, accepted)
    seconds: float = 0.0  # generation wall time, prefill excluded
    drafter_ns: int = 0  # time in propose + observe
    speculated: bool = True

    @property
    def drafted(self) -> int:
        return sum(s[1] for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s[2] for s in self.steps)


def _clip(draft: Sequence[int], k: int, vocab: int) -> list[int]:
    """At most k draft tokens, cut before the first id the model has no embedding for."""
    out = []
    for t in list(draft)[:max(k, 0)]:
        if not 0 <= t < vocab:
            break
        out.append(int(t))
    return out


def _emit(new: list[int], out: list[int], stop: set, max_tokens: int) -> tuple[list[int], str]:
    """Tokens of `new` that join the output, and why generation ends ('' = it goes on)."""
    taken = []
    for t in new:
        if t in stop:
            return taken, "stop"
        taken.append(t)
        if len(out) + len(taken) >= max_tokens:
            return taken, "length"
    return taken, ""


def _check_context(n_prompt: int, max_tokens: int, context: int | None) -> int:
    if n_prompt < 1:
        raise MLXError("the prompt is empty")
    if context and n_prompt >= context:
        raise MLXError(f"the prompt has {n_prompt} tokens but the model's context is {context}; "
                       "shorten it (bench: --max-prompt-tokens)")
    return min(max_tokens, context - n_prompt) if context else max_tokens


def _context_of(model: nn.Module) -> int | None:
    return getattr(getattr(model, "args", None), "max_position_embeddings", None)


def generate(model: nn.Module, prompt_ids: Sequence[int], drafter: Drafter | None = None,
             request: Request | None = None, max_tokens: int = 256,
             stop_ids: Sequence[int] = (), temperature: float = 0.0, seed: int = 0,
             cache: list | None = None, plan: CachePlan | None = None,
             max_draft: int = 64) -> Generation:
    """Generate from `prompt_ids`, verifying `drafter`'s drafts; equals plain decoding.

    `cache`, when given, must already hold `prompt_ids[:-1]` (it is extended in place:
    trim it back to reuse it). `request.tokens` is kept as prompt + output so far and the
    drafter is called exactly as the replay engine calls it; the caller calls
    `drafter.start(request)` before and `drafter.finish(request)` after.
    """
    plan = plan or plan_for(model)
    prompt = list(prompt_ids)
    max_tokens = _check_context(len(prompt), max_tokens, _context_of(model))
    total = len(prompt) + max_tokens + max_draft
    speculate = drafter is not None and plan.speculates(total)
    if drafter is not None and not speculate:
        plan.warn_once()
    if cache is None:
        cache = prefill(model, prompt[:-1], plan=plan, total_tokens=total)
    elif cache_len(cache) not in (-1, len(prompt) - 1):
        raise MLXError(f"the cache holds {cache_len(cache)} tokens, not the prompt's "
                       f"{len(prompt) - 1} first ones")
    if request is None:
        request = Request(id="mlx", session="mlx", tokens=list(prompt), num_prompt=len(prompt))
    stop = set(stop_ids)
    gen = Generation([], "length", speculated=speculate)
    if max_tokens <= 0:
        return gen
    pending = prompt[-1]
    vocab = _vocab(model)
    t_start = perf_counter()
    while True:
        draft: list[int] = []
        if speculate:
            t0 = perf_counter_ns()
            draft = list(drafter.propose([request])[0])
            gen.drafter_ns += perf_counter_ns() - t0
            draft = _clip(draft, min(max_draft, max_tokens - len(gen.tokens) - 1), vocab)
        logits = _logits(model, [pending] + draft, cache)[0]
        choices = choose(logits, temperature, seed, len(gen.tokens))
        a = 0
        while a < len(draft) and draft[a] == choices[a]:
            a += 1
        try:
            rollback(cache, len(draft) - a, plan)
        except _TrimFailed:
            warnings.warn(f"speculation disabled mid-request, re-filling the cache: "
                          f"{plan.reason}", stacklevel=2)
            speculate = False
            cache = prefill(model, request.tokens + draft[:a], plan=plan)
        new, done = _emit(draft[:a] + [choices[a]], gen.tokens, stop, max_tokens)
        gen.tokens.extend(new)
        request.tokens.extend(new)
        gen.steps.append((len(new), len(draft), a))
        if speculate:
            t0 = perf_counter_ns()
            drafter.observe(request, len(draft), a)
            gen.drafter_ns += perf_counter_ns() - t0
        if done:
            gen.finish = done
            break
        pending = choices[a]
    gen.seconds = perf_counter() - t_start
    return gen


def plain_tokens(model: nn.Module, prompt_ids: Sequence[int], max_tokens: int,
                 stop_ids: Sequence[int] = (), cache: list | None = None) -> Generation:
    """mlx-lm's own greedy generation (generate_step), cut at the first stop token.

    With `cache` holding `prompt_ids[:-1]`, only the last prompt token is fed first.
    """
    from mlx_lm.generate import generate_step

    prompt = list(prompt_ids)
    max_tokens = _check_context(len(prompt), max_tokens, _context_of(model))
    gen = Generation([], "length", speculated=False)
    if max_tokens <= 0:
        return gen
    feed = prompt[-1:] if cache is not None else prompt
    if cache is None:
        cache = make_prompt_cache(model)
    stop = set(stop_ids)
    t0 = perf_counter()
    for token, _ in generate_step(mx.array(feed, dtype=mx.int32), model, max_tokens=max_tokens,
                                  prompt_cache=cache):
        if token in stop:
            gen.finish = "stop"
            break
        gen.tokens.append(int(token))
        gen.steps.append((1, 0, 0))
    gen.seconds = perf_counter() - t0
    return gen


# ---------------------------------------------------------------- several requests


@dataclass
class _Row:
    index: int
    prompt: list[int]
    request: Request
    pending: int
    gen: Generation
    max_tokens: int


def _merge_rows(caches: list[list]) -> list:
    """Per layer, one left-padded BatchKVCache holding each single-row cache."""
    return [BatchKVCache.merge([c[layer] for c in caches]) for layer in range(len(caches[0]))]


def generate_batch(model: nn.Module, prompts: Sequence[Sequence[int]],
                   drafter: Drafter | None = None, requests: Sequence[Request] | None = None,
                   batch: int = 4, max_tokens: int = 256, stop_ids: Sequence[int] = (),
                   temperature: float = 0.0, seed: int = 0, plan: CachePlan | None = None,
                   max_draft: int = 64, on_start: Callable[[Request], None] | None = None,
                   on_finish: Callable[[Request, Generation], None] | None = None
                   ) -> list[Generation]:
    """Generate for every prompt, up to `batch` rows per forward pass; rows join and leave.

    Each row feeds its pending token and its own draft; shorter rows are right-padded.
    After verification every row keeps only its accepted tokens: the cache is trimmed by
    the smallest rejection and each row's remaining rejected tail is rolled to the left
    padding (`prepare(right_padding)` + `finalize()`), so rows never see each other's
    rejected tokens. `on_start` runs when a row joins (call drafter.start there),
    `on_finish` when it ends. Sampling seeds are per row: `seed + index`.
    """
    plan = plan or plan_for(model)
    n = len(prompts)
    requests = list(requests) if requests is not None else [
        Request(id=f"mlx#{i}", session=f"mlx#{i}", tokens=list(p), num_prompt=len(p))
        for i, p in enumerate(prompts)]
    context = _context_of(model)
    limits = [_check_context(len(p), max_tokens, context) for p in prompts]
    results: list[Generation | None] = [None] * n
    batchable = all(type(c) is KVCache for c in plan.make(model, 0))
    if (batch == 1 or not batchable
            or not plan.speculates(max(len(p) for p in prompts) + max_tokens + max_draft)):
        # one row at a time: no batched cache for recurrent state or sliding windows
        for i, p in enumerate(prompts):
            if on_start:
                on_start(requests[i])
            results[i] = generate(model, p, drafter, requests[i], max_tokens, stop_ids,
                                  temperature, seed + i, plan=plan, max_draft=max_draft)
            if on_finish:
                on_finish(requests[i], results[i])
        return results
    stop = set(stop_ids)
    vocab = _vocab(model)
    waiting = list(range(n))
    rows: list[_Row] = []
    cache: list | None = None
    t_start = perf_counter()
    while waiting or rows:
        joining = []
        while waiting and len(rows) + len(joining) < batch:
            i = waiting.pop(0)
            if on_start:
                on_start(requests[i])
            row = _Row(i, list(prompts[i]), requests[i], prompts[i][-1],
                       Generation([], "length"), limits[i])
            if row.max_tokens <= 0:
                results[i] = row.gen
                if on_finish:
                    on_finish(row.request, row.gen)
                continue
            joining.append(row)
        if joining:
            single = [prefill(model, r.prompt[:-1], plan=plan) for r in joining]
            merged = _merge_rows(single)
            if cache is None:
                cache = merged
            else:
                for c, m in zip(cache, merged):
                    c.extend(m)
            rows.extend(joining)
        if not rows:
            break
        drafts: list[list[int]] = [[] for _ in rows]
        if drafter is not None:
            t0 = perf_counter_ns()
            proposed = drafter.propose([r.request for r in rows])
            spent = (perf_counter_ns() - t0) // len(rows)
            for j, (r, d) in enumerate(zip(rows, proposed)):
                drafts[j] = _clip(d, min(max_draft, r.max_tokens - len(r.gen.tokens) - 1), vocab)
                r.gen.drafter_ns += spent
        width = 1 + max(len(d) for d in drafts)
        x = mx.array([[r.pending] + d + [0] * (width - 1 - len(d)) for r, d in zip(rows, drafts)],
                     dtype=mx.int32)
        logits = model(x, cache=cache)
        if temperature <= 0:
            table = mx.argmax(logits, axis=-1).tolist()
        else:
            table = [choose(logits[j], temperature, seed + r.index, len(r.gen.tokens))
                     for j, r in enumerate(rows)]
        accepted = []
        for d, choices in zip(drafts, table):
            a = 0
            while a < len(d) and d[a] == choices[a]:
                a += 1
            accepted.append(a)
        reject = [width - 1 - a for a in accepted]  # fed width, keep pending + a drafts
        common = min(reject)
        rollback(cache, common, plan)
        extra = [r - common for r in reject]
        if any(extra):
            for c in cache:
                c.prepare(right_padding=extra)
                c.finalize()
        keep = []
        for j, (r, d, choices, a) in enumerate(zip(rows, drafts, table, accepted)):
            new, done = _emit(d[:a] + [choices[a]], r.gen.tokens, stop, r.max_tokens)
            r.gen.tokens.extend(new)
            r.request.tokens.extend(new)
            r.gen.steps.append((len(new), len(d), a))
            if drafter is not None:
                t0 = perf_counter_ns()
                drafter.observe(r.request, len(d), a)
                r.gen.drafter_ns += perf_counter_ns() - t0
            if done:
                r.gen.finish = done
                r.gen.seconds = perf_counter() - t_start
                results[r.index] = r.gen
                if on_finish:
                    on_finish(r.request, r.gen)
            else:
                r.pending = choices[a]
                keep.append(j)
        if len(keep) < len(rows):
            rows = [rows[j] for j in keep]
            if rows:
                idx = mx.array(keep, dtype=mx.int32)
                for c in cache:
                    c.filter(idx)
            else:
                cache = None
    return results
