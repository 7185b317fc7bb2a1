#!/usr/bin/env python
"""Measure a cost profile (`agentspec.cost/1`, shared/spec/cost-profile.md) with torch + transformers.

For a GPU box without vLLM and without a model hub: the model is a transformers Llama built
from a config with RANDOM weights (timing does not depend on the values), by default the shape
of Llama-3-8B (hidden 4096, 32 layers, 32 heads, 8 kv heads, intermediate 14336, vocab 128256,
rope theta 500000) in bf16 on cuda, SDPA attention, torch.inference_mode.

For each batch size b and each tokens-per-row t (1 = plain decode, k+1 = verifying k drafts):
  1. a KV cache for b rows is prefilled (through the model, random token ids, in chunks) with
     `--context` tokens per row;
  2. the point (b, t) gets `--warmup` untimed passes, then up to `--repeats` timed passes of
     b rows x t tokens (positions context .. context+t-1), logits for every position, with
     torch.cuda.synchronize() before and after each (plain wall clock on CPU); the median is kept;
  3. after every pass the cache is cropped back to exactly `context` tokens per row (and this is
     checked), so every timed pass sees the same cache.
lambda(b) comes from agentspec.costs.fit_lambda and the profile is written with CostProfile.save.

Cache kinds (--cache): `static` (transformers StaticCache: preallocated, new keys written in
place, as in a serving engine) or `dynamic` (DynamicCache: every pass concatenates, i.e. copies,
the whole cache, which adds a b*context memory cost to every step).  `auto` (default) uses
static and falls back to dynamic when this transformers version cannot crop a static cache or
the restore self-check fails.  Attention (--attention): `packed` (default) runs SDPA on the KV
heads with each group's query heads folded into the query axis, instead of transformers'
repeat_kv copy of K/V whenever a mask is present (see install_packed_gqa_sdpa).  Both choices
are recorded in the profile under "probe".

Caveat: this is eager PyTorch (no CUDA graphs, no fused kernels).  At small b an 8B step is
bound by Python/kernel-launch overhead more than by the GPU, so t(b,1) is higher and flatter in
t than in a serving engine; read small-b lambdas from this probe as lower bounds.

Runtime of the default run on one H200 (estimate; 8B bf16 = 16 GB of weights, ~16 GFLOP per
token, 128 KiB of KV per token):
  * start-up (imports, CUDA context, 8B random init on the GPU): ~10-20 s;
  * prefill: sum(b) x 1024 = 523k tokens, ~8.4 PFLOP, in 32k-token chunks: ~15-25 s;
  * timed passes: 9 x 7 points x (1 warm-up + 5 repeats) = 378 passes (+3 for the self-check);
    they hold sum(b) x 70 x 6 = 215k tokens, ~3.4 PFLOP (~6-10 s), and each pass costs at least
    ~10-30 ms of eager launch overhead / weight reads (~4-11 s);
  so ~1 minute, and under 2 minutes at a third of the assumed throughput.  Hard bounds: a point
  whose warm-up pass says its repeats would take over --point-seconds (2 s) gets fewer repeats
  (at least 3), and a batch size whose predicted time (the previous one's, scaled by b) would
  take the run past --max-seconds (210 s, counted from start) is skipped with a note.
  Memory at b=256: 16 GB weights + 35 GB static cache + ~3 GB activations/logits: no OOM is
  expected at the defaults; an OOM (longer --context) skips that b, or keeps its points so far.

Usage:
  python scripts/gpu_cost_probe.py --out lambda-h200.json --plot lambda-h200.png
  python scripts/gpu_cost_probe.py --config tiny --device cpu --batches 1,2,4 --context 128 --out /tmp/p.json
  PYTHONPATH=. python scripts/gpu_cost_probe.py --layers 8 --batches 1,16 --out quick.json
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

try:
    from agentspec.costs import BatchCost, CostProfile, fit_lambda, load_profile
except ImportError:  # the repo copied without installing it: run from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from agentspec.costs import BatchCost, CostProfile, fit_lambda, load_profile

import torch

DEFAULT_BATCHES = "1,2,4,8,16,32,64,128,256"
DEFAULT_TOKENS = "1,2,3,5,9,17,33"

CONFIGS = {
    # Llama-3-8B shapes.
    "llama-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                     rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5,
                     tie_word_embeddings=False),
    # Small enough for a CPU test in seconds, same structure (GQA, SwiGLU, RMSNorm, rope).
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=768, vocab_size=8192,
                 rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5,
                 tie_word_embeddings=False),
}

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}


class ProbeError(RuntimeError):
    """A setup problem that ends the run with a message."""


class CacheRestoreError(RuntimeError):
    """The KV cache could not be brought back to exactly `context` tokens."""


def is_oom(e: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    if oom and isinstance(e, oom):
        return True
    msg = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        s in msg for s in ("out of memory", "can't allocate memory", "alloc_failed"))


def parse_ints(text: str, what: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ProbeError(f"--{what}: expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise ProbeError(f"--{what}: needs positive integers, got {text!r}")
    return values


def build_config(name: str, layers: int | None, context: int, max_t: int):
    from transformers import LlamaConfig

    kw = dict(CONFIGS[name])
    if layers is not None:
        kw["num_hidden_layers"] = layers
    kw["max_position_embeddings"] = max(kw["max_position_embeddings"], context + max_t)
    return LlamaConfig(**kw, attn_implementation="sdpa", use_cache=True)


def build_model(config, device: torch.device, dtype: torch.dtype):
    """A LlamaForCausalLM with random (initializer_range) weights, created directly on device."""
    from transformers import LlamaForCausalLM

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    return model


def install_packed_gqa_sdpa() -> Callable[[], None] | None:
    """Make transformers' "sdpa" attention run GQA without repeat_kv when there is a mask.

    Stock transformers SDPA copies K and V to every query head (repeat_kv) whenever a mask is
    present (any t > 1 on a cache, and every step on a static cache) because torch's
    enable_gqa + mask falls back to the math kernel.  That copy costs 4x the KV cache per layer
    and would show up as a fake jump from t=1 to t=2 at large b.  Instead, the query heads of
    each KV group are folded into the query-length axis, (b, H, t, d) -> (b, KV, rep*t, d),
    the mask is tiled to match, and SDPA runs on the KV heads as they are (the efficient kernel
    takes the mask).  The result is the same attention, like a serving engine's GQA kernels.
    Returns a function that puts the previous "sdpa" back, or None (stock SDPA stays) when
    this transformers has no AttentionInterface.
    """
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward as stock
        previous = AttentionInterface._global_mapping["sdpa"]
    except (ImportError, AttributeError, KeyError):
        return None

    def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                    is_causal=None, **kwargs):
        b, heads, t, d = query.shape
        kv = key.shape[1]
        rep = heads // kv if kv else 1
        if (rep == 1 or t == 1 or attention_mask is None or heads != kv * rep
                or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
                or attention_mask.shape[2] != t or kwargs.get("position_bias") is not None
                or kwargs.get("softcap") is not None or value.shape[1] != kv):
            return stock(module, query, key, value, attention_mask, dropout=dropout,
                         scaling=scaling, is_causal=is_causal, **kwargs)
        # head h = g*rep + r (repeat_kv's layout) -> group g, row r*t + i
        q = query.reshape(b, kv, rep * t, d)
        mask = attention_mask.repeat(1, 1, rep, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
        return out.reshape(b, heads, t, value.shape[-1]).transpose(1, 2).contiguous(), None

    AttentionInterface.register("sdpa", packed_sdpa)
    return lambda: AttentionInterface.register("sdpa", previous)


def machine_string(device: torch.device) -> str:
    import transformers

    host = f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores"
    libs = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (f"{torch.cuda.get_device_name(device)} ({props.total_memory / 2**30:.0f} GiB); "
                f"{host}; {libs}")
    return f"{host} (CPU); {libs}"


class Runner:
    """The model plus the version-dependent bits of calling it with a cache."""

    def __init__(self, model, config, device: torch.device, dtype: torch.dtype, cache_kind: str,
                 prefill_tokens: int, seed: int = 0):
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        self.cache_kind = cache_kind
        self.prefill_tokens = prefill_tokens
        self.gen = torch.Generator(device=device).manual_seed(seed)
        sig = inspect.signature(model.forward).parameters
        # transformers 5.x calls it `cache`; 4.x `past_key_values`.
        self.cache_kw = "cache" if "cache" in sig else "past_key_values"
        self.pass_cache_position = "cache_position" in sig  # 4.x / early 5.x only

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def ids(self, b: int, t: int) -> torch.Tensor:
        return torch.randint(0, self.config.vocab_size, (b, t), generator=self.gen,
                             device=self.device)

    def new_cache(self, b: int, max_len: int):
        from transformers import DynamicCache, StaticCache

        if self.cache_kind == "dynamic":
            try:
                return DynamicCache(config=self.config)
            except TypeError:
                return DynamicCache()
        try:
            return StaticCache(config=self.config, max_cache_len=max_len)
        except TypeError:  # older signature
            return StaticCache(config=self.config, max_batch_size=b, max_cache_len=max_len,
                               device=self.device, dtype=self.dtype)

    def _kwargs(self, cache, start: int, b: int, t: int) -> dict:
        pos = torch.arange(start, start + t, device=self.device)
        kw = {self.cache_kw: cache, "position_ids": pos.unsqueeze(0).expand(b, t),
              "use_cache": True}
        if self.pass_cache_position:
            kw["cache_position"] = pos
        return kw

    def prefill(self, cache, b: int, context: int) -> None:
        """Fill `context` tokens per row through the base model (no logits), in chunks."""
        chunk = max(1, self.prefill_tokens // b)
        done = 0
        while done < context:
            n = min(chunk, context - done)
            self.model.model(input_ids=self.ids(b, n), **self._kwargs(cache, done, b, n))
            done += n
        self.sync()
        self.check_length(cache, context)

    def forward(self, cache, ids: torch.Tensor, context: int) -> torch.Tensor:
        b, t = ids.shape
        return self.model(input_ids=ids, **self._kwargs(cache, context, b, t)).logits

    @staticmethod
    def seq_length(cache) -> int:
        return int(cache.get_seq_length())

    def check_length(self, cache, context: int) -> None:
        n = self.seq_length(cache)
        if n != context:
            raise CacheRestoreError(f"{self.cache_kind} cache holds {n} tokens, expected {context}")

    def restore(self, cache, t: int, context: int) -> None:
        """Remove the t tokens the last pass appended (negative crop: 4.x and 5.x alike)."""
        try:
            cache.crop(-t)
        except (AttributeError, NotImplementedError, TypeError, ValueError) as e:
            raise CacheRestoreError(f"{self.cache_kind} cache cannot be cropped here ({e})") from None
        self.check_length(cache, context)


def self_check(runner: Runner, cache, b: int, context: int, max_t: int) -> str | None:
    """Logits of a 1-token pass must not change after a max_t pass and a restore.

    The cache length is checked after every restore (that raises); a logits difference is
    returned as a message: with random weights one stray key among `context` moves the logits
    only a little, so this is a check on gross errors (context overwritten, wrong slots).
    """
    ids = runner.ids(b, 1)
    before = runner.forward(cache, ids, context).float()
    runner.restore(cache, 1, context)
    runner.forward(cache, runner.ids(b, max_t), context)
    runner.restore(cache, max_t, context)
    after = runner.forward(cache, ids, context).float()
    runner.restore(cache, 1, context)
    scale = before.abs().max().item() or 1.0
    diff = (after - before).abs().max().item()
    if not diff <= 1e-3 * scale:
        return (f"{runner.cache_kind} cache: logits changed after a restore "
                f"(max diff {diff:.3g}, scale {scale:.3g})")
    return None


def time_point(runner: Runner, cache, b: int, t: int, context: int, repeats: int, warmup: int,
               point_seconds: float) -> tuple[float, int]:
    """Median seconds of one b x t pass and the number of timed passes used."""
    ids = runner.ids(b, t)
    first = None
    for _ in range(warmup):
        runner.sync()
        t0 = time.perf_counter()
        out = runner.forward(cache, ids, context)
        runner.sync()
        first = time.perf_counter() - t0
        del out
        runner.restore(cache, t, context)
    n = repeats
    if first is not None and first * repeats > point_seconds:
        n = max(min(3, repeats), int(point_seconds / first))
    times = []
    for _ in range(n):
        runner.sync()
        t0 = time.perf_counter()
        out = runner.forward(cache, ids, context)
        runner.sync()
        times.append(time.perf_counter() - t0)
        del out
        runner.restore(cache, t, context)
    return statistics.median(times), n


def free_memory(runner: Runner) -> None:
    gc.collect()
    if runner.device.type == "cuda":
        torch.cuda.empty_cache()


def measure_batch(runner: Runner, b: int, tokens: list[int], args, check: bool) -> dict:
    """Measure one batch size: {"tokens", "seconds", "repeats", "note"}; OOM keeps what it has."""
    res = {"tokens": [], "seconds": [], "repeats": [], "note": ""}
    oom_at = None
    cache = None
    try:
        cache = runner.new_cache(b, args.context + max(tokens))
        runner.prefill(cache, b, args.context)
        if check:
            problem = self_check(runner, cache, b, args.context, max(tokens))
            if problem and runner.cache_kind == "static" and args.cache == "auto":
                raise CacheRestoreError(problem)
            if problem:
                print(f"warning: {problem}", flush=True)
                res["note"] = "restore check: logits changed"
        for t in tokens:
            oom_at = t
            sec, n = time_point(runner, cache, b, t, args.context, args.repeats, args.warmup,
                                args.point_seconds)
            res["tokens"].append(t)
            res["seconds"].append(sec)
            res["repeats"].append(n)
        oom_at = None
    except Exception as e:  # noqa: BLE001 - only OOM is handled here
        if not is_oom(e):
            raise
        oom_at = oom_at or "prefill"
    finally:
        cache = None
        free_memory(runner)
    if oom_at is not None:
        where = "prefill" if oom_at == "prefill" else f"t={oom_at}"
        res["note"] = f"out of memory at {where}"
        if len(res["tokens"]) < 2:
            res["tokens"], res["seconds"], res["repeats"] = [], [], []
    return res


def measure_all(runner: Runner, batches: list[int], tokens: list[int], args,
                start: float) -> tuple[dict[int, dict], dict[int, str]]:
    """Every batch size, within the time budget; a static cache falls back to dynamic (auto)."""
    measured: dict[int, dict] = {}
    notes: dict[int, str] = {}
    checked = False
    last = None  # (b, seconds) of the last batch size measured, for the time budget
    for b in batches:
        elapsed = time.perf_counter() - start
        if last is not None:
            predicted = last[1] * b / last[0]
            if elapsed + predicted > args.max_seconds:
                notes[b] = (f"skipped: time budget ({elapsed:.0f}s + ~{predicted:.0f}s > "
                            f"{args.max_seconds:.0f}s)")
                print(f"b={b}: {notes[b]}", flush=True)
                continue
        t0 = time.perf_counter()
        while True:
            try:
                res = measure_batch(runner, b, tokens, args, check=not checked)
                break
            except Exception as e:  # noqa: BLE001 - OOM was handled in measure_batch
                # auto: a static cache this transformers version cannot crop (or that fails the
                # restore check) falls back to a dynamic one; later failures are real.
                if (args.cache != "auto" or runner.cache_kind == "dynamic"
                        or (checked and not isinstance(e, CacheRestoreError))):
                    raise
                print(f"note: static cache failed ({type(e).__name__}: {e}); "
                      "using a dynamic cache", flush=True)
                runner.cache_kind = "dynamic"
        checked = checked or bool(res["tokens"])
        if res["note"]:
            notes[b] = res["note"]
        if len(res["tokens"]) >= 2 or (res["tokens"] and len(tokens) == 1):
            measured[b] = res
            last = (b, time.perf_counter() - t0)
        ms = ", ".join(f"{t}:{s * 1e3:.2f}" for t, s in zip(res["tokens"], res["seconds"]))
        print(f"b={b}: ms by tokens/row {{{ms}}}" + (f"  ({res['note']})" if res["note"] else ""),
              flush=True)
    return measured, notes


def plot_profile(profile: CostProfile, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for b, c in sorted(profile.batches.items()):
        total = [b * t for t in c.tokens_per_row]
        ax.plot(total, [s * 1e3 for s in c.seconds], "o-", ms=3,
                label=f"b={b}  λ={c.lam:.3f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("total tokens in the step (b × tokens per row)")
    ax.set_ylabel("forward pass (ms)")
    ax.set_title(f"{profile.model} · {profile.dtype} · ctx {profile.context_tokens}\n"
                 f"{profile.machine.split(';')[0]}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="llama-8b",
                   help="model shape (default llama-8b: Llama-3-8B)")
    p.add_argument("--layers", type=int, default=None, help="override the layer count")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--batches", default=DEFAULT_BATCHES, help=f"default {DEFAULT_BATCHES}")
    p.add_argument("--tokens", default=DEFAULT_TOKENS,
                   help=f"tokens per row, must include 1 (default {DEFAULT_TOKENS})")
    p.add_argument("--context", type=int, default=1024, help="tokens cached per row (default 1024)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per point (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes per point (default 1)")
    p.add_argument("--point-seconds", type=float, default=2.0,
                   help="cut the repeats of a point (to no fewer than 3) when they would take "
                        "longer than this (default 2)")
    p.add_argument("--max-seconds", type=float, default=210.0,
                   help="skip the remaining batch sizes when the run would pass this many "
                        "seconds (default 210)")
    p.add_argument("--prefill-tokens", type=int, default=32768,
                   help="tokens per prefill forward pass (b x chunk), bounds prefill memory")
    p.add_argument("--cache", choices=("auto", "static", "dynamic"), default="auto",
                   help="KV cache kind (default auto: static, else dynamic)")
    p.add_argument("--attention", choices=("packed", "stock"), default="packed",
                   help="packed (default): SDPA on the KV heads with the query heads of each "
                        "group folded into the query axis; stock: transformers' SDPA, which "
                        "copies K/V to every head (repeat_kv) whenever there is a mask")
    p.add_argument("--model-name", default=None, help="name written to the profile")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for --device cpu (default 1: the CPU run is a "
                        "functional test, and OpenMP spinning on a busy machine makes "
                        "multi-threaded timings erratic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="write the agentspec.cost/1 profile here")
    p.add_argument("--plot", default=None, help="also save a PNG of step time vs total tokens")
    args = p.parse_args(argv)
    if args.context < 1 or args.repeats < 1 or args.warmup < 0 or args.prefill_tokens < 1:
        p.error("--context, --repeats, --prefill-tokens must be >= 1 and --warmup >= 0")
    if args.layers is not None and args.layers < 1:
        p.error("--layers must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    try:
        batches = parse_ints(args.batches, "batches")
        tokens = parse_ints(args.tokens, "tokens")
        if 1 not in tokens:
            raise ProbeError("--tokens must include 1 (the plain decode step)")
        if args.device is None:
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
            if args.device == "cpu" and args.config != "tiny":
                raise ProbeError("no CUDA device: pass --device cpu to time an 8B model on the "
                                 "CPU anyway, or --config tiny")
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ProbeError("--device cuda but torch sees no CUDA device")
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if device.type == "cpu" or args.threads:
        torch.set_num_threads(args.threads or 1)
    try:
        return run(args, device, batches, tokens, start)
    finally:
        torch.set_num_threads(threads)  # main() may run inside a test process


def run(args, device: torch.device, batches: list[int], tokens: list[int], start: float) -> int:
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda"
                                                   else torch.float32)
    dtype_name = str(dtype).removeprefix("torch.")
    config = build_config(args.config, args.layers, args.context, max(tokens))
    name = args.model_name or (f"llama-{args.config.removeprefix('llama-')}-random"
                               + (f"-{args.layers}layers" if args.layers else ""))

    with torch.inference_mode(), torch.no_grad():
        model = build_model(config, device, dtype)
        nparams = sum(p.numel() for p in model.parameters())
        print(f"{name}: {nparams / 1e9:.2f}B parameters, {config.num_hidden_layers} layers, "
              f"{dtype_name} on {device} ({machine_string(device).split(';')[0]}), "
              f"context {args.context}, tokens/row {tokens}; built in "
              f"{time.perf_counter() - start:.1f}s", flush=True)
        undo = install_packed_gqa_sdpa() if args.attention == "packed" else None
        attention = ("sdpa, GQA packed into the query (no repeat_kv)" if undo
                     else "sdpa (transformers)")
        if args.attention == "packed" and not undo:
            print("note: this transformers has no AttentionInterface; stock SDPA", flush=True)
        runner = Runner(model, config, device, dtype, "dynamic" if args.cache == "dynamic"
                        else "static", args.prefill_tokens, args.seed)
        try:
            measured, notes = measure_all(runner, batches, tokens, args, start)
        finally:
            if undo:
                undo()
        del model, runner.model
        free_memory(runner)

    if not measured:
        print("error: no batch size could be measured", file=sys.stderr)
        return 1
    batch_costs = {b: BatchCost(r["tokens"], r["seconds"],
                                fit_lambda(b, r["tokens"], r["seconds"]))
                   for b, r in measured.items()}
    profile = CostProfile(
        backend="torch", model=name, batches=batch_costs, dtype=dtype_name,
        machine=machine_string(device),
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        context_tokens=args.context,
        extra={"probe": {
            "script": "scripts/gpu_cost_probe.py", "weights": "random", "config": args.config,
            "layers": config.num_hidden_layers, "parameters": nparams,
            "attention": attention, "cache": runner.cache_kind,
            "repeats": {str(b): r["repeats"] for b, r in measured.items()},
            "warmup": args.warmup, "notes": {str(b): n for b, n in notes.items()},
            "seconds_total": round(time.perf_counter() - start, 1)}})
    profile.save(args.out)
    load_profile(args.out)  # what the readers will see

    print()
    tmax = max(tokens)
    print(f"{'b':>5} {'t(b,1) ms':>10} {f't(b,{tmax}) ms':>11} {'lambda':>8}  note")
    for b in batches:
        if b in batch_costs:
            c = batch_costs[b]
            t_max = (f"{c.seconds[c.tokens_per_row.index(tmax)] * 1e3:.2f}"
                     if tmax in c.tokens_per_row else "-")
            print(f"{b:>5} {c.seconds[c.tokens_per_row.index(1)] * 1e3:>10.2f} {t_max:>11} "
                  f"{c.lam:>8.4f}  {notes.get(b, '')}")
        else:
            print(f"{b:>5} {'-':>10} {'-':>11} {'-':>8}  {notes.get(b, '')}")
    print(f"\nwrote {args.out} ({runner.cache_kind} cache, "
          f"{time.perf_counter() - start:.1f}s in all)")
    if args.plot:
        try:
            plot_profile(profile, args.plot)
            print(f"wrote {args.plot}")
        except ImportError:
            print("note: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
