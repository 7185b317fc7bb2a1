"""`agentspec bench`: every method replays the same sessions; one report compares them.

The report follows shared/spec/bench-json.md. Methods are stable names mapped to drafter
factories; all of them run in one process over the same tokenized calls.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from agentspec.controller import KmaxTable
from agentspec.costs import CostProfile, linear_costs
from agentspec.drafter import Drafter, Plain
from agentspec.metrics import DEFAULT_LAMBDAS, Meter
from agentspec.policy import Alpha, CostAware, Policy, PolicyConfig, ladder
from agentspec.tokens import ChatTokenizer, TokenizedSession

DEFAULT_LAMBDA = 0.2  # what methods plan with when neither --lambda nor a cost profile says

BENCH_FORMAT = "agentspec.bench/1"
OUTPUTS_FORMAT = "agentspec.outputs/1"  # what a real backend's plain run wrote, call by call


BASELINES = ("plain", "ngram", "suffix", "suffix-cold")
# methods as a machine that has served nothing runs them (BenchSetup.cold), by the method
# each is the cold one of: suffix's tree starts empty, full's acceptance model from its
# defaults
COLD = {"suffix-cold": "suffix", "full-cold": "full"}


@dataclass
class BenchSetup:
    """What the drafting methods may know beyond the replayed sessions themselves."""

    tokenizer: ChatTokenizer | None = None
    lam: float | None = None  # None: the cost profile's lambda(b) at each batch size, else 0.2
    kmax: KmaxTable | None = None
    global_seed: list[list[int]] = field(default_factory=list)
    # the recorded sessions whose outputs are global_seed, where those outputs are the
    # target's own (a replay of the same trace): the policy methods serve them first (see
    # Policy.serve_recorded), their past outputs and what their acceptances taught alike
    served: list[TokenizedSession] = field(default_factory=list)
    profile: CostProfile | None = None
    token_bytes: list[bytes] | None = None

    def lam_at(self, b: int) -> float:
        """The lambda methods plan with at batch size b."""
        if self.lam is not None:
            return self.lam
        return self.profile.lam(b) if self.profile else DEFAULT_LAMBDA

    def draft_costs(self, b: int, max_k: int):
        """What n draft tokens per row cost at batch size b (see CostProfile.draft_costs)."""
        return self.profile.draft_costs(b, max_k) if self.profile else linear_costs(
            self.lam_at(b), max_k)

    def cold(self) -> BenchSetup:
        """What a machine that has served nothing knows: this setup's tokenizer and prices,
        without what past sessions taught (their outputs, serving them, a Kmax profile)."""
        return BenchSetup(tokenizer=self.tokenizer, lam=self.lam, profile=self.profile,
                          token_bytes=self.token_bytes)


def policy_names() -> list[str]:
    """The methods that are an agentspec policy: the ladder's rungs and the cold ones."""
    return [*ladder(), *(name for name in COLD if name not in BASELINES)]


def method_names() -> list[str]:
    return [*BASELINES, *policy_names()]


def make_drafter(name: str, setup: BenchSetup) -> Drafter:
    method = name
    if name in COLD:
        method, setup = COLD[name], setup.cold()
    if method == "plain":
        return Plain()
    if method == "ngram":
        from agentspec.baselines import NgramDrafter

        return NgramDrafter()
    if method == "suffix":
        from agentspec.baselines import SuffixDrafter

        return SuffixDrafter(global_seed=setup.global_seed, name=name)
    tok, config = setup.tokenizer, replace(ladder(setup.lam_at(1))[method], name=name)
    policy = Policy(config, encode=tok.encode if tok else None,
                    token_bytes=setup.token_bytes,
                    kmax=setup.kmax if takes_kmax(config, setup) else None,
                    draft_costs=setup.draft_costs, lam_at=setup.lam_at,
                    global_seed=() if setup.served else setup.global_seed)
    policy.serve_recorded(setup.served)
    return policy


def takes_kmax(config: PolicyConfig, setup: BenchSetup) -> bool:
    """Whether a policy is given the Kmax profile: AgSpec's controller caps its drafts by it,
    and a cost-aware policy's acceptance model starts from it, except where the policy serves
    the profiling split, whose steps teach it what a profile of those same sessions would
    (and a Kmax profile is the one thing `suffix` has no place for)."""
    return isinstance(config.length, Alpha) or (isinstance(config.length, CostAware)
                                                 and not setup.served)


def needs_kmax(names: Sequence[str], setup: BenchSetup) -> bool:
    """Whether any of these methods is given the Kmax profile (see takes_kmax)."""
    rungs = ladder()
    return any(takes_kmax(rungs[name], setup) for name in names if name in rungs)


def knowledge(drafter: Drafter) -> dict:
    """What a method was given beyond the sessions it serves, for the report: every method
    that can use past outputs gets the same ones."""
    return {"global_seed_outputs": drafter.global_seed_outputs,
            "served_sessions": drafter.served_sessions, "kmax_profile": drafter.kmax_profile}


def job_sessions(sessions: Sequence[TokenizedSession],
                 max_prompt_tokens: int | None) -> list[list[dict]]:
    """Each session's calls with a recorded output, as real backends send them: prompt ids
    (the last `max_prompt_tokens`), role and `agentspec_*` metadata (`vllm_xargs`)."""
    jobs = []
    for s in sessions:
        calls, files = [], {}
        for index, tc in enumerate(s.calls):
            files.update((path, s.session.files[path]) for path, _ in tc.new_files)
            if not tc.output:  # as replay: it generates nothing; its files go to the next
                continue
            prompt = tc.prompt.tolist()
            if max_prompt_tokens:
                prompt = prompt[-max_prompt_tokens:]
            calls.append({"key": call_key(s, index), "role": tc.call.role, "prompt": prompt,
                          "xargs": call_xargs(s, index, files)})
            files = {}
        jobs.append(calls)
    return jobs


def call_key(s: TokenizedSession, index: int) -> str:
    """A call's name in the jobs, reports and outputs files of real backends."""
    return f"{s.id}#{index}"


def write_outputs(outputs: dict[str, list[int]], path: str | Path, model: str,
                  traces: Sequence[str], max_tokens: int) -> None:
    """What a real backend's plain run generated in each call (`--save-outputs`), under a
    budget of `max_tokens` a call: a replay with `--outputs` then measures every method on
    the served model's own text, in seconds and without the wall clock's noise."""
    write_json({"format": OUTPUTS_FORMAT, "model": model, "traces": [str(t) for t in traces],
                "max_tokens": max_tokens, "outputs": outputs},
               path)  # model: the tokenizer's name, as with_outputs checks


def with_outputs(sessions: Sequence[TokenizedSession], path: str | Path,
                 model: str) -> list[TokenizedSession]:
    """`sessions` whose generated calls have the outputs a real backend wrote (a file of
    `write_outputs`) instead of the recorded ones, each under the budget it was generated
    with; prompts and registered text stay as recorded (whole, where the backend may have
    kept only a prompt's last tokens)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"--outputs {path}: cannot read it ({e})") from None
    if not isinstance(data, dict) or data.get("format") != OUTPUTS_FORMAT \
            or not isinstance(data.get("outputs"), dict):
        raise BenchError(f"--outputs {path}: not an {OUTPUTS_FORMAT} file (a real backend's "
                         "bench writes one with --save-outputs)")
    if data.get("model") != model:
        raise BenchError(f"--outputs {path}: its outputs are {data.get('model')!r} tokens, "
                         f"this replay tokenizes with {model!r} (pass its --model)")
    budget = data.get("max_tokens")  # (files written before it was kept: none)
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                               or budget < 1):
        raise BenchError(f"--outputs {path}: max_tokens must be a positive integer, not "
                         f"{budget!r}")
    served, replayed = data["outputs"], []
    for s in sessions:
        calls = []
        for index, tc in enumerate(s.calls):
            if tc.output:  # a call the backend generated (job_sessions)
                key = call_key(s, index)
                output = served.get(key)
                if output is None:
                    raise BenchError(f"--outputs {path} has no output for call {key}: replay "
                                     "the sessions the backend ran (its --traces, --sessions "
                                     "and --seed)")
                if not isinstance(output, list) or not all(
                        isinstance(t, int) and t >= 0 for t in output):
                    raise BenchError(f"--outputs {path}: the output of call {key} is not a "
                                     "list of token ids")
                if budget is not None and len(output) > budget:
                    raise BenchError(f"--outputs {path}: the output of call {key} has "
                                     f"{len(output)} tokens, over the file's max_tokens "
                                     f"{budget}")
                tc = replace(tc, output=output, max_tokens=budget)
            calls.append(tc)
        replayed.append(replace(s, calls=calls))
    return replayed


def call_xargs(s: TokenizedSession, index: int, files: dict[str, str]) -> dict[str, str]:
    """The `vllm_xargs` of a call (vllm_drafter's flat keys); empty values are left out."""
    r = s.request(index, [])
    args = {"session": r.session, "agent": r.agent, "query": r.query, "role": r.role,
            "structure": json.dumps([list(p) for p in r.structure]) if r.structure else "",
            "files": json.dumps(files) if files else ""}
    return {f"agentspec_{k}": v for k, v in args.items() if v}


def split_by_task(sessions: Sequence, seed: int = 0) -> tuple[list, list]:
    """(profile part, evaluation part): every task lands wholly in one part."""
    def part(task: str) -> int:
        return hashlib.sha1(f"{seed}:{task}".encode()).digest()[0] & 1

    profile = [s for s in sessions if part(s.task) == 0]
    evaluation = [s for s in sessions if part(s.task) == 1]
    return profile, evaluation


class BenchError(ValueError):
    """Bad bench input (unknown method, empty selection); the message says what."""


def parse_methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    known = method_names()
    unknown = [m for m in names if m not in known]
    if unknown or not names:
        raise BenchError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def parse_batches(text: str) -> list[int]:
    """Comma-separated batch sizes, sorted and deduplicated."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise BenchError(f"--batch must be comma-separated integers, not {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise BenchError("--batch needs batch sizes of at least 1")
    return sizes


def pick_sessions(sessions: Sequence, n: int | None, seed: int) -> list:
    """A seeded sample of n sessions, kept in file order; all when n is None."""
    if n is None or n >= len(sessions):
        return list(sessions)
    if n < 1:
        raise BenchError("--sessions must be at least 1")
    keep = sorted(random.Random(seed).sample(range(len(sessions)), n))
    return [sessions[i] for i in keep]


@dataclass
class BenchResult:
    report: dict
    meters: dict[str, Meter]
    outputs: dict[str, list[int]] = field(default_factory=dict)  # real backends: plain's, by call


def run_replay_bench(sessions: list[TokenizedSession], methods: list[str], *, batch: int = 1,
                     model: str = "", traces: Sequence[str] = (),
                     setup: BenchSetup | None = None,
                     progress: Callable[[str, int], None] | None = None) -> BenchResult:
    """Replay `sessions` with each method; `progress(method, tokens)` reports advance."""
    from agentspec.replay import replay

    setup = setup or BenchSetup()
    meters: dict[str, Meter] = {}
    given: dict[str, dict] = {}
    # plain is the reference for every modeled speedup; run it even when not asked for
    for name in dict.fromkeys(["plain", *methods]):
        tick = (lambda k, name=name: progress(name, k)) if progress else None
        if tick:  # (shown from here: a policy serving the profiling split first takes a while)
            tick(0)
        drafter = make_drafter(name, setup)
        given[name] = knowledge(drafter)
        meters[name] = replay(sessions, drafter, batch=batch, on_tokens=tick)
    report = {
        "format": BENCH_FORMAT,
        "backend": "replay",
        "model": model,
        "traces": [str(t) for t in traces],
        "sessions": len(sessions),
        "calls": sum(len(s.calls) for s in sessions),
        "batch": batch,
        "methods": {name: {**meters[name].report(meters["plain"], DEFAULT_LAMBDAS, setup.profile),
                           "knowledge": given[name]} for name in methods},
    }
    return BenchResult(report, meters)


@dataclass
class MeasuredRun:
    """What one method generated on a real backend, call by call."""

    name: str
    meter: Meter = field(default_factory=Meter)
    seconds: float = 0.0
    tokens: int = 0
    outputs: dict[str, list[int]] = field(default_factory=dict)
    knowledge: dict = field(default_factory=lambda: knowledge(Plain()))  # (given nothing)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def method_entry(run: MeasuredRun, plain: MeasuredRun | None, setup: BenchSetup) -> dict:
    """The bench-json entry of a run, with what only a real backend measures.

    Without a plain run to compare with, speedup and identity are null and modeled
    speedups count one plain step per output token.
    """
    reference = plain.meter if plain else Meter.plain(run.meter.total.output_tokens)
    entry = run.meter.report(reference, DEFAULT_LAMBDAS, setup.profile)
    entry["tokens_per_s"] = round(run.tokens / run.seconds, 3) if run.seconds else 0.0
    entry["rejected"] = run.meter.total.drafted - run.meter.total.accepted
    entry["seconds"] = round(run.seconds, 3)
    entry["knowledge"] = run.knowledge
    if plain is None:
        return entry
    mismatches = []
    for key, ref in plain.outputs.items():
        pos = first_difference(run.outputs.get(key, []), ref)
        if pos is not None:
            mismatches.append({"call": key, "position": pos})
    plain_tps = plain.tokens / plain.seconds if plain.seconds else 0.0
    entry["speedup"] = round(entry["tokens_per_s"] / plain_tps, 4) if plain_tps else None
    entry["identical_to_plain"] = not mismatches
    entry["mismatches"] = mismatches
    return entry


def measured_table(report: dict):
    """What a real backend measured: tokens/s, speedup, identical outputs."""
    return methods_table(report["methods"],
                         f"measured · {report['model']} {report.get('dtype', '')} · "
                         f"{report['calls']} calls · batch {report['batch']} · "
                         f"max {report.get('max_tokens')} tokens")


def methods_table(methods: dict, title: str):
    """A table of bench-json method entries measured on a real model."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("method", "tokens/s", "speedup", "AL", "rejected/tok", "out tokens",
                "seconds", "identical"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for name, m in methods.items():
        if m["identical_to_plain"] is None:
            same = "-"
        elif m["identical_to_plain"]:
            same = "yes"
        else:
            first = m["mismatches"][0]
            same = (f"no: {len(m['mismatches'])} call(s), first at "
                    f"{first['call']}:{first['position']}")
        t.add_row(name, f"{m['tokens_per_s']:.2f}", _number(m.get("speedup")),
                  _number(m.get("al")), _number(m.get("rejected_per_token")),
                  str(m["output_tokens"]), f"{m['seconds']:.1f}", same)
    return t


def _number(value: float | None) -> str:
    """A table cell: "-" where a backend could not measure it (e.g. a server's AL)."""
    return "-" if value is None else f"{value:.3f}"


def write_json(report: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def plot(report: dict, path: str | Path) -> None:
    """Bar charts of AL and modeled speedup per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["methods"])
    entries = [report["methods"][n] for n in names]
    lambdas = [k for k in entries[0]["modeled_speedup"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(min(18, 5 + 0.9 * len(names)), 4.5))
    ax1.bar(names, [e["al"] for e in entries], color="#4C72B0")
    ax1.set_title("Accepted length (tokens per step)")
    ax1.tick_params(axis="x", rotation=30)
    width = 0.8 / len(lambdas)
    for j, lam in enumerate(lambdas):
        xs = [i + (j - (len(lambdas) - 1) / 2) * width for i in range(len(names))]
        label = "measured profile" if lam == "profile" else f"λ={lam}"
        ax2.bar(xs, [e["modeled_speedup"][lam] for e in entries], width, label=label)
    ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax2.set_xticks(range(len(names)), names, rotation=30)
    ax2.set_title("Modeled speedup vs plain")
    ax2.legend(fontsize=8)
    traces = ", ".join(Path(t).name for t in report["traces"])
    fig.suptitle(f"{report['backend']} · {traces} · {report['sessions']} sessions · "
                 f"batch {report['batch']}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
