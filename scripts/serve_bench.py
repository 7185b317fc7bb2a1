#!/usr/bin/env python
"""Replay recorded sessions against OpenAI-compatible servers; compare text and speed.

Sessions are chosen as `agentspec bench` chooses them (task split, then a seeded sample).
Every call with a recorded output is sent to `/v1/completions` as the text of its prompt
(the model's chat layout, cut to the last --max-prompt-tokens tokens), greedy, streamed,
with the session's `agentspec_*` metadata (session, role, files first opened by the call),
so any server (agentspec serve, mlx_lm.server) gets the same requests. Calls go in rounds
of --clients C, in recorded order, sent at once (C concurrent clients); every server
answers each round in turn, so a busy shared machine slows all of them alike. Each server
reports generated tokens per second (all tokens over its rounds' wall time), mean time to
first token, and whether every text equals the first server's.

    python scripts/serve_bench.py --server full=http://127.0.0.1:8001 \\
        --server plain=http://127.0.0.1:8002 --clients 1 --json out/serve-b1.json
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import openai

from agentspec.bench import pick_sessions, split_by_task
from agentspec.models import resolve
from agentspec.tokens import ChatTokenizer, tokenize_sessions
from agentspec.trace import read_sessions


def calls_of(args) -> list[dict]:
    """The requests to send, in recorded order: prompt text and metadata."""
    loaded, _ = read_sessions([args.traces])
    _, measured = split_by_task(loaded, args.seed)
    chosen = pick_sessions(measured, args.sessions, args.seed)
    tok = ChatTokenizer.from_model(resolve(args.model_dir))
    out = []
    for s in tokenize_sessions(chosen, tok):
        for i, tc in enumerate(s.calls):
            if not tc.output:
                continue
            ids = tc.prompt.tolist()[-args.max_prompt_tokens:]
            meta = {"agentspec_session": s.id, "agentspec_role": tc.call.role}
            if tc.new_files:
                meta["agentspec_files"] = json.dumps(
                    {path: tok.decode(t) for path, t in tc.new_files})
            out.append({"key": f"{s.id}#{i}", "prompt": tok.decode(ids), "meta": meta})
    return out


def ask(client: openai.OpenAI, model: str, call: dict, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    stream = client.completions.create(
        model=model, prompt=call["prompt"], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True},
        extra_body={"metadata": call["meta"]})
    text, first, tokens = [], None, 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].text)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return {"text": "".join(text), "tokens": tokens, "ttft": (first or time.perf_counter()) - t0}


def answer_round(client: openai.OpenAI, model: str, calls: list[dict], max_tokens: int,
                 results: dict) -> float:
    """Send `calls` at once, one client thread each; returns the wall seconds."""
    def one(c: dict) -> None:
        results[c["key"]] = ask(client, model, c, max_tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def run_interleaved(servers: dict[str, tuple[str, str]], calls: list[dict], clients: int,
                    max_tokens: int) -> dict[str, dict]:
    """Rounds of `clients` calls in recorded order; each server answers a round in turn, so
    the load of a shared machine falls on all of them alike."""
    clients_of = {n: openai.OpenAI(base_url=u.rstrip("/") + "/v1", api_key="-", max_retries=0,
                                   timeout=600) for n, (u, _) in servers.items()}
    results = {n: {} for n in servers}
    seconds = dict.fromkeys(servers, 0.0)
    for i in range(0, len(calls), clients):
        for n, (_, model) in servers.items():
            seconds[n] += answer_round(clients_of[n], model, calls[i:i + clients], max_tokens,
                                       results[n])
    out = {}
    for n, (url, _) in servers.items():
        res, tokens = results[n], sum(r["tokens"] for r in results[n].values())
        out[n] = {"url": url, "clients": clients, "calls": len(res), "tokens": tokens,
                  "seconds": round(seconds[n], 3),
                  "tokens_per_s": round(tokens / seconds[n], 3),
                  "mean_ttft_s": round(sum(r["ttft"] for r in res.values()) / len(res), 4),
                  "texts": {k: res[k]["text"] for k in sorted(res)}}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", action="append", required=True, help="NAME=URL or "
                   "NAME=URL#MODEL (repeatable; MODEL: the name to send, default the first of "
                   "/v1/models); the first is the reference for identical text and speedups")
    p.add_argument("--traces", default="../shared/traces/acr-run-1.jsonl.gz")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--model-dir", default=None, help="model folder for the tokenizer "
                   "(default: the embedded model)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    calls = calls_of(args)
    report = {"traces": args.traces, "sessions": args.sessions, "seed": args.seed,
              "max_tokens": args.max_tokens, "max_prompt_tokens": args.max_prompt_tokens,
              "clients": args.clients, "servers": {}}
    servers = {}
    for spec in args.server:
        name, url = spec.split("=", 1)
        url, _, model = url.partition("#")
        servers[name] = (url, model or openai.OpenAI(base_url=url.rstrip("/") + "/v1",
                                                     api_key="-").models.list().data[0].id)
    report["servers"] = run_interleaved(servers, calls, args.clients, args.max_tokens)
    for name, r in report["servers"].items():
        print(f"{name:>10}: {r['tokens']} tokens in {r['seconds']} s = {r['tokens_per_s']} tok/s, "
              f"mean TTFT {r['mean_ttft_s']} s")
    ref_name, ref = next(iter(report["servers"].items()))
    for name, r in report["servers"].items():
        r["identical_to_" + ref_name] = r["texts"] == ref["texts"]
        r["speedup_vs_" + ref_name] = round(r["tokens_per_s"] / ref["tokens_per_s"], 4)
        print(f"{name:>10}: {r['speedup_vs_' + ref_name]}x {ref_name}, identical text: "
              f"{r['identical_to_' + ref_name]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
