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
globally before MLX, which makes those matmuls ~15x faster. An OpenBLAS older than the CPU
falls back to SSE3 kernels (Debian's 0.3.21 on a Sapphire Rapids Xeon: "Prescott", 33
GFLOPS against 186 with its AVX-512 kernels), so the kernels are chosen from the CPU's
flags unless OPENBLAS_CORETYPE says otherwise.
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
from time import perf_counter
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


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


AVX512_FLAGS = {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512cd"}


def openblas_core(flags: set[str]) -> str | None:
    """The OpenBLAS kernel family for a CPU with these flags (OPENBLAS_CORETYPE's names),
    or None to leave the choice to OpenBLAS's own detection."""
    if AVX512_FLAGS <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def blas_env() -> dict[str, str]:
    """The environment that makes a process (this one before loading, or a child) load
    OpenBLAS with this CPU's kernels; empty where there is no OpenBLAS to load."""
    path = find_openblas()
    if path is None:
        return {}
    core = os.environ.get("OPENBLAS_CORETYPE") or openblas_core(_cpu_flags())
    return {"LD_PRELOAD": path} | ({"OPENBLAS_CORETYPE": core} if core else {})


def blas_core() -> str | None:
    """The kernel family the loaded OpenBLAS uses (e.g. "SkylakeX"), if OpenBLAS is loaded."""
    path = blas_in_use()
    if path is None:
        return None
    try:
        corename = ctypes.CDLL(path).openblas_get_corename
    except (OSError, AttributeError):
        return None
    corename.restype = ctypes.c_char_p
    return corename().decode()


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
    env = blas_env()
    if not env:
        return None
    if "OPENBLAS_CORETYPE" in env:  # read by OpenBLAS when it loads
        os.environ.setdefault("OPENBLAS_CORETYPE", env["OPENBLAS_CORETYPE"])
    path = env["LD_PRELOAD"]
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
    blas = blas_env()
    if not blas or os.environ.get("AGENTSPEC_BLAS_REEXEC") == "1":
        return
    preload = ":".join(p for p in (blas.pop("LD_PRELOAD"), os.environ.get("LD_PRELOAD")) if p)
    env = dict(os.environ, **blas, AGENTSPEC_BLAS_REEXEC="1", LD_PRELOAD=preload)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


BLAS = preload_blas()

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models.cache import (ArraysCache, BatchKVCache, KVCache,  # noqa: E402
                                 RotatingKVCache, make_prompt_cache, trim_prompt_cache)

from agentspec.drafter import Drafter, Request  # noqa: E402
from agentspec.speculation import Loop, Row, draft_room  # noqa: E402


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
    from agentspec.models import EMBEDDED, ModelError, resolve

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


def _nucleus(logits: mx.array, top_p: float) -> mx.array:
    """Logits outside the smallest set of tokens whose probability reaches top_p set to -inf."""
    probs = mx.softmax(logits, axis=-1)
    order = mx.argsort(-probs, axis=-1)
    sorted_probs = mx.take_along_axis(probs, order, axis=-1)
    before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of the better tokens
    keep_sorted = before < top_p
    keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
    return mx.where(keep, logits, -mx.inf)


def choose(logits: mx.array, temperature: float, seed: int, first: int,
           top_p: float = 1.0) -> list[int]:
    """Target's token at each position of `logits` (L, V); position j is output index first+j.

    Greedy at temperature 0; otherwise a Gumbel-max sample (of the top_p nucleus) whose
    noise depends only on (seed, output index), so any schedule of verification steps
    samples the same tokens.
    """
    if temperature <= 0:
        return mx.argmax(logits, axis=-1).tolist()
    scaled = logits.astype(mx.float32) / temperature
    if top_p < 1.0:
        scaled = _nucleus(scaled, top_p)
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


def _clip_rows(rows, drafts, max_draft: int, vocab: int) -> list[list[int]]:
    """Each row's draft cut to what it may still emit (and to max_draft and the vocabulary)."""
    return [_clip(d, min(max_draft, draft_room(r.max_tokens, len(r.tokens))), vocab)
            for r, d in zip(rows, drafts)]


def check_context(n_prompt: int, max_tokens: int, context: int | None) -> int:
    if n_prompt < 1:
        raise MLXError("the prompt is empty")
    if context and n_prompt >= context:
        raise MLXError(f"the prompt has {n_prompt} tokens but the model's context is {context}; "
                       "shorten it (bench: --max-prompt-tokens)")
    return min(max_tokens, context - n_prompt) if context else max_tokens


def _context_of(model: nn.Module) -> int | None:
    return getattr(getattr(model, "args", None), "max_position_embeddings", None)


class OneRow:
    """The speculation loop's target for one request on a plain KV cache.

    A rollback the cache does not honour disables speculation for the model and re-fills
    the cache, so the output stays exact (`speculate` tells the caller to stop drafting).
    """

    padded = False

    def __init__(self, model: nn.Module, cache: list, plan: CachePlan, max_draft: int,
                 speculate: bool):
        self.model, self.cache, self.plan = model, cache, plan
        self.max_draft, self.speculate = max_draft, speculate
        self.vocab = _vocab(model)

    def join(self, rows):
        pass

    def clip(self, rows, drafts):
        return _clip_rows(rows, drafts, self.max_draft, self.vocab)

    def verify(self, rows, drafts):
        (row,), (draft,) = rows, drafts
        logits = _logits(self.model, [row.pending] + draft, self.cache)[0]
        return [choose(logits, row.temperature, row.seed, len(row.tokens), row.top_p)]

    def verified_drafts(self, drafts):
        return [len(drafts[0])]

    def rollback(self, rows, drafts, accepted):
        (row,), (draft,), (a,) = rows, drafts, accepted
        try:
            rollback(self.cache, len(draft) - a, self.plan)
        except _TrimFailed:
            warnings.warn(f"speculation disabled mid-request, re-filling the cache: "
                          f"{self.plan.reason}", stacklevel=2)
            self.speculate = False
            self.cache = prefill(self.model, row.request.tokens + draft[:a], plan=self.plan)

    def leave(self, keep):
        pass


def _generation(row: Row, speculated: bool, seconds: float) -> Generation:
    return Generation(row.tokens, row.finish or "length", row.steps, seconds, row.drafter_ns,
                      speculated)


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
    max_tokens = check_context(len(prompt), max_tokens, _context_of(model))
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
    row = Row(request, max_tokens, frozenset(stop_ids), pending=prompt[-1],
              temperature=temperature, seed=seed)
    if max_tokens <= 0:
        return _generation(row, speculate, 0.0)
    target = OneRow(model, cache, plan, max_draft, speculate)
    loop = Loop(target, drafter if speculate else None, rows=[row])
    t_start = perf_counter()
    while loop.rows:
        loop.drafter = drafter if target.speculate else None
        loop.step()
    return _generation(row, speculate, perf_counter() - t_start)


def plain_tokens(model: nn.Module, prompt_ids: Sequence[int], max_tokens: int,
                 stop_ids: Sequence[int] = (), cache: list | None = None) -> Generation:
    """mlx-lm's own greedy generation (generate_step), cut at the first stop token.

    With `cache` holding `prompt_ids[:-1]`, only the last prompt token is fed first.
    """
    from mlx_lm.generate import generate_step

    prompt = list(prompt_ids)
    max_tokens = check_context(len(prompt), max_tokens, _context_of(model))
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


def _merge_rows(caches: list[list]) -> list:
    """Per layer, one left-padded BatchKVCache holding each single-row cache."""
    return [BatchKVCache.merge([c[layer] for c in caches]) for layer in range(len(caches[0]))]


class Rows:
    """The speculation loop's target for a batch of rows on one left-padded BatchKVCache.

    Each row feeds its pending token and its own draft; shorter rows are right-padded.
    After verification every row keeps only its accepted tokens: the cache is trimmed by
    the smallest rejection and each row's remaining rejected tail is rolled to the left
    padding (`prepare(right_padding)` + `finalize()`), so rows never see each other's
    rejected tokens. A joining row brings its prefilled single-row cache in `row.state`
    (prefilled here when None).

    Every row is padded to the longest draft, so one long draft makes every row pay for
    it (`padded`): the drafter plans one width for the batch.
    """

    padded = True

    def __init__(self, model: nn.Module, plan: CachePlan, max_draft: int = 64):
        self.model, self.plan, self.max_draft = model, plan, max_draft
        self.vocab = _vocab(model)
        self.cache: list | None = None
        self.width = 1

    def join(self, rows):
        single = [r.state if r.state is not None else
                  prefill(self.model, r.request.tokens[:-1], plan=self.plan) for r in rows]
        for r in rows:
            r.state = None
        merged = _merge_rows(single)
        if self.cache is None:
            self.cache = merged
        else:
            for c, m in zip(self.cache, merged):
                c.extend(m)

    def clip(self, rows, drafts):
        return _clip_rows(rows, drafts, self.max_draft, self.vocab)

    def verify(self, rows, drafts):
        self.width = 1 + max(len(d) for d in drafts)
        x = mx.array([[r.pending] + d + [0] * (self.width - 1 - len(d))
                      for r, d in zip(rows, drafts)], dtype=mx.int32)
        logits = self.model(x, cache=self.cache)
        if all(r.temperature <= 0 for r in rows):
            return mx.argmax(logits, axis=-1).tolist()
        return [choose(logits[j], r.temperature, r.seed, len(r.tokens), r.top_p)
                for j, r in enumerate(rows)]

    def verified_drafts(self, drafts):
        return [self.width - 1] * len(drafts)  # every row is computed at the widest draft

    def rollback(self, rows, drafts, accepted):
        reject = [self.width - 1 - a for a in accepted]  # fed width, keep pending + a drafts
        common = min(reject)
        rollback(self.cache, common, self.plan)
        extra = [r - common for r in reject]
        if any(extra):
            for c in self.cache:
                c.prepare(right_padding=extra)
                c.finalize()

    def extract(self, j: int) -> list:
        """Row j's cache as a single-row KVCache list (for a prompt cache)."""
        return [c.extract(j) for c in self.cache]

    def leave(self, keep):
        if not keep:
            self.cache = None
            return
        idx = mx.array(list(keep), dtype=mx.int32)
        for c in self.cache:
            c.filter(idx)


def batchable(model: nn.Module, plan: CachePlan, longest: int) -> bool:
    """Whether rows of this model can share one BatchKVCache while speculating."""
    return all(type(c) is KVCache for c in plan.make(model, 0)) and plan.speculates(longest)


def generate_batch(model: nn.Module, prompts: Sequence[Sequence[int]],
                   drafter: Drafter | None = None, requests: Sequence[Request] | None = None,
                   batch: int = 4, max_tokens: int = 256, stop_ids: Sequence[int] = (),
                   temperature: float = 0.0, seed: int = 0, plan: CachePlan | None = None,
                   max_draft: int = 64, on_start: Callable[[Request], None] | None = None,
                   on_finish: Callable[[Request, Generation], None] | None = None
                   ) -> list[Generation]:
    """Generate for every prompt, up to `batch` rows per forward pass; rows join and leave.

    `on_start` runs when a row joins (call drafter.start there), `on_finish` when it ends.
    Sampling seeds are per row: `seed + index`.
    """
    plan = plan or plan_for(model)
    n = len(prompts)
    requests = list(requests) if requests is not None else [
        Request(id=f"mlx#{i}", session=f"mlx#{i}", tokens=list(p), num_prompt=len(p))
        for i, p in enumerate(prompts)]
    context = _context_of(model)
    limits = [check_context(len(p), max_tokens, context) for p in prompts]
    results: list[Generation | None] = [None] * n
    if batch == 1 or not batchable(model, plan, max(len(p) for p in prompts) + max_tokens
                                   + max_draft):
        # one row at a time: no batched cache for recurrent state or sliding windows
        for i, p in enumerate(prompts):
            if on_start:
                on_start(requests[i])
            results[i] = generate(model, p, drafter, requests[i], max_tokens, stop_ids,
                                  temperature, seed + i, plan=plan, max_draft=max_draft)
            if on_finish:
                on_finish(requests[i], results[i])
        return results
    t_start = perf_counter()
    index = {}

    def finished(row: Row) -> None:
        gen = _generation(row, True, perf_counter() - t_start)
        results[index[id(row)]] = gen
        if on_finish:
            on_finish(row.request, gen)

    loop = Loop(Rows(model, plan, max_draft), drafter, on_finish=finished)
    waiting = list(range(n))
    while waiting or loop.rows:
        joining = []
        while waiting and len(loop.rows) + len(joining) < batch:
            i = waiting.pop(0)
            if on_start:
                on_start(requests[i])
            row = Row(requests[i], limits[i], frozenset(stop_ids), pending=prompts[i][-1],
                      temperature=temperature, seed=seed + i)
            index[id(row)] = i
            if row.max_tokens <= 0:
                finished(row)
                continue
            joining.append(row)
        loop.join(joining)
        if loop.rows:
            loop.step()
    return results


def generate_each(eng: Engine, drafters: dict[str, Drafter | None], prompt: list[int],
                  make_request: Callable[[], Request], max_tokens: int
                  ) -> tuple[float, dict[str, Generation]]:
    """Generate one prompt with each drafter in turn (None: mlx-lm's plain generation), all
    from one prefill that is trimmed back after each; returns (prefill seconds, generations).

    Each drafter's request (from `make_request`) is started before and finished after.
    """
    limit = check_context(len(prompt), max_tokens, eng.context)
    t0 = perf_counter()
    cache = prefill(eng.model, prompt[:-1], plan=eng.plan, total_tokens=len(prompt) + limit + 64)
    prefill_s = perf_counter() - t0
    base = len(prompt) - 1
    gens = {}
    for name, drafter in drafters.items():
        if drafter is None:
            gen = plain_tokens(eng.model, prompt, limit, eng.stop_ids, cache=cache)
        else:
            req = make_request()
            drafter.start(req)
            gen = generate(eng.model, prompt, drafter, req, limit, eng.stop_ids, cache=cache,
                           plan=eng.plan)
            drafter.finish(req)
        grown = cache_len(cache) - base
        if grown > 0 and trim_prompt_cache(cache, grown) != grown:
            cache = prefill(eng.model, prompt[:-1], plan=eng.plan)
        gens[name] = gen
    return prefill_s, gens
