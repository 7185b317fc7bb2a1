"""`agentspec bench --backend http`: recorded calls replayed against OpenAI-compatible servers.

Any server works: `agentspec serve`, `vllm serve` with the drafter, `mlx_lm.server`. Each
recorded call is sent as a streamed `/v1/completions` request: its prompt is the chat
rendered with the model's template (cut to the last --max-prompt-tokens tokens), greedy,
with the call's `agentspec_*` metadata in `vllm_xargs` (servers that do not know it ignore
it). `--batch B` keeps B sessions in flight, each sending its calls in order. The server
under test and the plain one (`--plain-url`) run the same calls one after the other, so
they never share the machine's cores; every output is compared call by call. Servers
cannot be reset from a client: with several sizes, every size after the first runs on
servers that cached those prompts and whose drafter saw those outputs (the report says
`servers_fresh: false`); measure each size on freshly started servers for figures.

A server's own counters (/metrics) give its acceptance length when it publishes them:
`agentspec serve`'s generated tokens per row-step, or vLLM's spec-decode counters.
"""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from time import perf_counter
from typing import Callable, Sequence

import httpx

from agentspec.tokens import TokenizedSession

TIMEOUT_S = 600.0  # one call on a slow CPU server


class HttpError(RuntimeError):
    """A server is unreachable or answered with an error; the message names it."""


@dataclass
class Reply:
    text: str
    tokens: int
    seconds: float
    ttft: float


class Server:
    """The client of one OpenAI-compatible server."""

    def __init__(self, url: str):
        self.base = url.rstrip("/").removesuffix("/v1")
        self.http = httpx.Client(timeout=TIMEOUT_S)
        try:
            listed = self.http.get(f"{self.base}/v1/models")
            listed.raise_for_status()
            self.model = listed.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            raise HttpError(f"{url} is not an OpenAI-compatible server that lists a model "
                            f"at /v1/models: {e}") from None

    def complete(self, max_tokens: int, prompt: str | None = None,
                 messages: list[dict] | None = None, xargs: dict | None = None) -> Reply:
        """One greedy generation, streamed to time its first token."""
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        if xargs:
            body["vllm_xargs"] = xargs
        path = "/v1/chat/completions" if messages is not None else "/v1/completions"
        body.update({"messages": messages} if messages is not None else {"prompt": prompt})
        pieces, tokens, ttft = [], None, None
        t0 = perf_counter()
        try:
            with self.http.stream("POST", self.base + path, json=body) as r:
                if r.status_code != 200:
                    raise HttpError(f"{self.base}{path}: HTTP {r.status_code}: "
                                    f"{r.read().decode(errors='replace')[:300]}")
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise HttpError(f"{self.base}{path}: {chunk['error']}")
                    for choice in chunk.get("choices") or []:
                        piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                        if piece:
                            ttft = ttft if ttft is not None else perf_counter() - t0
                            pieces.append(piece)
                    if chunk.get("usage"):
                        tokens = chunk["usage"].get("completion_tokens")
        except httpx.HTTPError as e:
            raise HttpError(f"{self.base}{path}: {type(e).__name__}: {e}") from None
        seconds = perf_counter() - t0
        text = "".join(pieces)
        return Reply(text, tokens if tokens is not None else -1, seconds,
                     ttft if ttft is not None else seconds)

    def counters(self) -> dict[str, float]:
        """The server's Prometheus counters ({} when it publishes none)."""
        try:
            r = self.http.get(f"{self.base}/metrics")
        except httpx.HTTPError:
            return {}
        if r.status_code != 200:
            return {}
        found: dict[str, float] = {}
        for line in r.text.splitlines():
            m = re.match(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
            if m:
                try:
                    found[m[1] + (m[2] or "")] = float(m[3])
                except ValueError:
                    pass
        return found


def acceptance_length(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Tokens per verification step of one request, from two reads of a server's counters."""
    def delta(name: str) -> float:
        return sum(v - before.get(k, 0.0) for k, v in after.items()
                   if k == name or k.startswith(name + "{"))

    rows = sum((after[k] - before.get(k, 0.0)) * int(m[1]) for k in after
               if (m := re.fullmatch(r'agentspec_batch_size_steps_total\{size="(\d+)"\}', k)))
    if rows:  # agentspec serve: steps by the number of rows they verified
        return delta("agentspec_generated_tokens_total") / rows
    generated = delta("vllm:generation_tokens_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    if generated > accepted >= 0 and generated:
        return generated / (generated - accepted)
    return None


@dataclass
class ServerRun:
    """What one server generated in one batch run."""

    replies: dict[str, Reply] = field(default_factory=dict)
    seconds: float = 0.0
    al: float | None = None

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.replies.values())

    @property
    def decode_rate(self) -> float:
        """Tokens per second of one stream after its first token (1 / time per output
        token): what drafting speeds up, without the prefill both servers share."""
        seconds = sum(r.seconds - r.ttft for r in self.replies.values())
        return sum(max(r.tokens - 1, 0) for r in self.replies.values()) / seconds \
            if seconds > 0 else 0.0


def replay(server: Server, jobs: list[list[dict]], batch: int, max_tokens: int,
           on_call: Callable[[], None] = lambda: None) -> ServerRun:
    """Every session's calls in order, `batch` sessions in flight."""
    run, lock = ServerRun(), threading.Lock()

    def session(calls: list[dict]) -> None:
        for c in calls:
            reply = server.complete(max_tokens, prompt=c["text"], xargs=c["xargs"])
            with lock:
                run.replies[c["key"]] = reply
            on_call()

    before = server.counters()
    t0 = perf_counter()
    with ThreadPoolExecutor(max_workers=batch) as pool:
        for done in [pool.submit(session, calls) for calls in jobs]:
            done.result()
    run.seconds = perf_counter() - t0
    run.al = acceptance_length(before, server.counters())
    return run


def text_jobs(sessions: Sequence[TokenizedSession], decode: Callable[[list[int]], str],
              max_prompt_tokens: int | None) -> list[list[dict]]:
    """The calls of `bench --backend vllm` (agentspec.bench.job_sessions), as prompt text."""
    from agentspec.bench import job_sessions

    return [[{**c, "text": decode(c["prompt"])} for c in calls]
            for calls in job_sessions(sessions, max_prompt_tokens)]


def method_entry(run: ServerRun, plain: ServerRun | None, roles: dict[str, str],
                 count: Callable[[str], int]) -> dict:
    """A bench-json method entry for a server: measured speed, identity, TTFT, AL. Without a
    plain run, speedup and identity are unknown (None)."""
    for reply in (*run.replies.values(), *(plain.replies.values() if plain else ())):
        if reply.tokens < 0:  # the server sent no usage: count with the model's tokenizer
            reply.tokens = count(reply.text)
    mismatches = [{"call": k, "position": _first_difference(r.text, plain.replies[k].text)}
                  for k, r in run.replies.items() if plain and r.text != plain.replies[k].text]
    rate = run.tokens / run.seconds if run.seconds else 0.0
    plain_rate = plain.tokens / plain.seconds if plain and plain.seconds else 0.0
    decode, plain_decode = run.decode_rate, plain.decode_rate if plain else 0.0
    ttfts = sorted(r.ttft for r in run.replies.values())
    by_role: dict[str, dict] = {}
    for key, r in run.replies.items():
        role = by_role.setdefault(roles[key], {"output_tokens": 0, "seconds": 0.0})
        role["output_tokens"] += r.tokens
        role["seconds"] = round(role["seconds"] + r.seconds, 3)
    return {
        "al": round(run.al, 4) if run.al else None, "output_tokens": run.tokens,
        "tokens_per_s": round(rate, 3),
        "speedup": round(rate / plain_rate, 4) if plain_rate else None,
        "decode_tokens_per_s": round(decode, 3),
        "decode_speedup": round(decode / plain_decode, 4) if plain_decode else None,
        "identical_to_plain": not mismatches if plain else None, "mismatches": mismatches,
        "seconds": round(run.seconds, 3),
        "ttft_s": {"mean": round(sum(ttfts) / len(ttfts), 4) if ttfts else None,
                   "median": round(ttfts[len(ttfts) // 2], 4) if ttfts else None},
        "by_role": by_role,
    }


def _first_difference(a: str, b: str) -> int:
    """The first character at which two texts differ."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def run_http_bench(sessions: Sequence[TokenizedSession], *, url: str, plain_url: str,
                   batches: Sequence[int], max_tokens: int, max_prompt_tokens: int | None,
                   decode: Callable[[list[int]], str], count: Callable[[str], int],
                   traces: Sequence[str] = (),
                   progress: Callable[[str], None] = lambda name: None) -> list[dict]:
    """The server at `url` against the plain one, at each batch size: one report per size."""
    from agentspec.bench import BENCH_FORMAT

    servers = {"plain": Server(plain_url), "server": Server(url)}
    jobs = text_jobs(sessions, decode, max_prompt_tokens)
    if not any(jobs):
        raise HttpError("no call with a recorded output to send")
    roles = {c["key"]: c["role"] for calls in jobs for c in calls}
    reports = []
    for b in batches:
        runs = {name: replay(s, jobs, b, max_tokens, lambda name=name: progress(name))
                for name, s in servers.items()}
        reports.append({
            "format": BENCH_FORMAT, "backend": "http", "model": servers["server"].model,
            "servers": {"server": url, "plain": plain_url},
            "traces": list(traces), "sessions": len(sessions), "calls": len(roles),
            "batch": b, "max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens,
            # a server cannot be reset from here: after the first size it has the calls'
            # prompts cached and its drafter has seen their outputs
            "servers_fresh": b == batches[0],
            "methods": {name: method_entry(run, runs["plain"], roles, count)
                        for name, run in runs.items()},
        })
    return reports


def report_table(report: dict):
    """What the servers measured: tokens/s, speedup, AL, time to first token, identity."""
    from rich.table import Table

    t = Table(title=f"http · {report['model']} · {report['sessions']} sessions · "
              f"{report['calls']} calls · batch {report['batch']} · max "
              f"{report['max_tokens']} tokens")
    for col in ("server", "url", "tokens/s", "speedup", "decode tok/s", "decode speedup", "AL",
                "TTFT s", "out tokens", "seconds", "identical"):
        t.add_column(col, justify="left" if col in ("server", "url") else "right")
    for name, m in report["methods"].items():
        same = "yes" if m["identical_to_plain"] else (
            f"no: {len(m['mismatches'])} call(s), first at {m['mismatches'][0]['call']}")
        t.add_row(name, report["servers"][name], f"{m['tokens_per_s']:.2f}",
                  "-" if m["speedup"] is None else f"{m['speedup']:.3f}",
                  f"{m['decode_tokens_per_s']:.2f}",
                  "-" if m["decode_speedup"] is None else f"{m['decode_speedup']:.3f}",
                  "-" if m["al"] is None else f"{m['al']:.3f}", f"{m['ttft_s']['mean']:.3f}",
                  str(m["output_tokens"]), f"{m['seconds']:.1f}", same)
    return t
