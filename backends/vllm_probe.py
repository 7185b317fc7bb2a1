"""`agentspec profile-lambda --backend vllm`: lambda(b) from real vLLM engine steps.

One engine, in a subprocess with vLLM's Python as the bench runs it, drafts with
`RandomDrafts`: k random tokens per row, almost all rejected; what a step costs is the
verification of b x (k+1) tokens, whatever is accepted. For each batch size b, b requests
of `context` random prompt tokens are prefilled; then for each k the median wall time of
one `LLMEngine.step` (schedule, forward, rejection sampling, drafting, outputs) is taken
after warm-up steps (the first step after a switch still verifies drafts of the old k), in a
second pass over the points (the first pass only warms every shape up).
The engine runs in the worker's own process, so k is set on the proposer directly, through
`LLM.collective_rpc`. The fit and the file are those of the MLX probe (agentspec.costs).

    python -m agentspec.backends.vllm_probe JOB.json OUT.json   # the worker (vLLM's Python)
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter
from typing import Callable, Sequence

import numpy as np

from agentspec import costs
from agentspec.backends.vllm_bench import (emit_event, engine_description, make_llm,
                                           run_worker, spec_counters)
from agentspec.costs import BatchCost, CostProfile, fit_lambda, tokens_per_row

PROPOSER = "agentspec.backends.vllm_probe.RandomDrafts"
WARMUP = 2  # steps at each point before timing, in each of the two passes
# a profile measured on first use: profile-lambda's defaults, fewer repeats
FIRST_USE_MAX_K, FIRST_USE_CONTEXT, FIRST_USE_REPEATS = 32, 1024, 3


class RandomDrafts:
    """custom_class proposer: `k` random tokens for every row that has new tokens."""

    def __init__(self, vllm_config):
        self.k = 0
        self.vocab = min(vllm_config.model_config.get_vocab_size(), 32000)
        self.rng = np.random.default_rng(0)

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids: list[list[int]], *args, **kwargs) -> list[list[int]]:
        return [self.rng.integers(0, self.vocab, self.k).tolist() if sampled else []
                for sampled in sampled_token_ids]


def set_draft_length(worker, k: int) -> None:
    worker.model_runner.drafter.k = k


# --- the CLI's side ----------------------------------------------------------------------
def run_cli(model: str | None, dtype: str | None, batches: str, max_k: int, context: int,
            repeats: int, out: Path | None, plot_out: Path | None, console, stdout) -> None:
    """The whole `profile-lambda --backend vllm` command; raises VLLMError, BenchError."""
    from agentspec.models import resolve
    from agentspec.bench import parse_batches  # not at the top: it loads numba (vllm_bench)

    sizes = parse_batches(batches)
    path = resolve(model)
    points = tokens_per_row(max_k)
    job = {"model": str(path), "name": path.name, "dtype": dtype, "batches": sizes,
           "points": points, "context": context, "repeats": repeats}
    done = [0]
    with console.status("starting vLLM") as status:
        def tick(event: dict) -> None:
            done[0] += 1
            status.update(f"profiling: batch {event['batch']}, {event['tokens']} tokens per "
                          f"row ({done[0]}/{len(sizes) * len(points)})")

        result = run_worker("agentspec.backends.vllm_probe", job, {}, tick)
    for warning in result["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    given = result["profile"]
    cached = costs.host_profile_path("vllm", model, dtype)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(given))
    costs.publish(costs.load_profile(cached), cached, out, plot_out, console, stdout,
                  "bench --backend vllm and the drafter in vllm serve plan with it by default")


def ensure_profile(model: str | None, dtype: str | None, sizes: Sequence[int], console) -> Path:
    """This host's cached vLLM cost profile of `model`; measured first, with a message, when
    there is none (what `bench --backend vllm` plans with unless given --cost-profile)."""
    cached = costs.host_profile_path("vllm", model, dtype)
    if cached.is_file():
        console.print(f"planning with this machine's vLLM cost profile {cached}", highlight=False)
        return cached
    sizes = sorted(set(sizes) | {1})
    console.print(f"no vLLM cost profile for this machine and model yet: measuring one at "
                  f"batch {','.join(map(str, sizes))} (once, minutes on a CPU; `agentspec "
                  f"profile-lambda --backend vllm` does it too)", highlight=False)
    run_cli(model, dtype, ",".join(map(str, sizes)), FIRST_USE_MAX_K, FIRST_USE_CONTEXT,
            FIRST_USE_REPEATS, None, None, console, console)
    return cached


# --- the worker's side (vLLM's Python) ---------------------------------------------------
def measure(llm, batch: int, context: int, points: Sequence[int], repeats: int,
            warmup: int = WARMUP, seed: int = 0,
            progress: Callable[[int, int], None] = lambda b, n: None
            ) -> tuple[list[float], list[str]]:
    """Median step seconds of `batch` rows at each tokens-per-row point; and warnings."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    eng = llm.llm_engine
    rng = np.random.default_rng(seed)
    vocab = min(eng.model_config.get_vocab_size(), 32000)
    steps = len(points) * (2 * warmup + repeats)
    params = SamplingParams(temperature=0.0, max_tokens=2 * steps + 16, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    ids = [f"probe-b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        eng.add_request(rid, {"prompt_token_ids": rng.integers(0, vocab, context).tolist()},
                        params)
    decoding: set[str] = set()
    while len(decoding) < batch:  # prefill, in chunks, until every row decodes
        decoding |= {o.request_id for o in eng.step() if o.outputs[0].token_ids}
    # one pass over every shape first: the first steps at a new shape pay one-off costs
    # (compilation, allocation) that once made a 1-token step look slower than a 2-token one
    for n in points:
        llm.collective_rpc(set_draft_length, args=(n - 1,))
        for _ in range(warmup):
            eng.step()
    seconds, warnings = [], []
    for n in points:
        llm.collective_rpc(set_draft_length, args=(n - 1,))
        times = []
        for i in range(warmup + repeats):
            if i == warmup:
                before = spec_counters(llm).get("vllm:spec_decode_num_draft_tokens", 0)
            t0 = perf_counter()
            eng.step()
            times.append(perf_counter() - t0)
        verified = spec_counters(llm).get("vllm:spec_decode_num_draft_tokens", 0) - before
        if verified < 0.9 * batch * (n - 1) * repeats:
            warnings.append(f"batch {batch}, {n} tokens per row: vLLM verified {verified} "
                            f"draft tokens, not {batch * (n - 1) * repeats}")
        seconds.append(statistics.median(times[warmup:]))
        progress(batch, n)
    eng.abort_request(ids)
    llm.collective_rpc(set_draft_length, args=(0,))
    return seconds, warnings


def worker_main(job_path: str, out_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    points, context = job["points"], job["context"]
    steps = len(points) * (2 * WARMUP + job["repeats"])
    spec = {"method": "custom_class", "model": PROPOSER,
            "num_speculative_tokens": points[-1] - 1}
    llm = make_llm(job["model"], job["dtype"], context + 2 * steps + 16 + points[-1], spec,
                   max_num_seqs=max(job["batches"]), enable_prefix_caching=False)
    batches, warnings = {}, []
    for b in job["batches"]:
        seconds, problems = measure(
            llm, b, context, points, job["repeats"],
            progress=lambda b, n: emit_event({"batch": b, "tokens": n}))
        batches[b] = BatchCost(points, seconds, fit_lambda(b, points, seconds))
        warnings += problems
    prof = CostProfile(backend="vllm", model=job["name"], batches=batches,
                       dtype=str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
                       machine=costs.machine(engine_description()),
                       created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       context_tokens=context)
    Path(out_path).write_text(json.dumps({"profile": prof.to_json(), "warnings": warnings}))


if __name__ == "__main__":
    worker_main(*sys.argv[1:])
