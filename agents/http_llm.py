"""The agent's model over HTTP: each call sent to an OpenAI-compatible server.

Any server works (`agentspec serve`, `vllm serve` with the drafter, `mlx_lm.server`): the
call's messages go to /v1/chat/completions, greedy, with the session's `agentspec_*`
metadata in `vllm_xargs` (ignored by servers that do not know it). With a plain server
beside it, every call is sent there too, to measure the speedup and compare the text.
"""

from __future__ import annotations

import json
from typing import Callable

from agentspec.agents.llm import CallStats, role_limits
from agentspec.backends.http_bench import Server, ServerRun, acceptance_length, method_entry
from agentspec.trace import Session


class HttpLLM:
    def __init__(self, url: str, plain_url: str | None, count: Callable[[str], int], *,
                 max_tokens: int | None = None,
                 on_call: Callable[[CallStats], None] | None = None):
        self.servers = {"server": Server(url)}
        if plain_url:
            self.servers["plain"] = Server(plain_url)
        self.runs = {name: ServerRun() for name in self.servers}
        self.first = {name: s.counters() for name, s in self.servers.items()}
        self.roles: dict[str, str] = {}
        self.count, self.on_call = count, on_call
        self.max_tokens = role_limits(max_tokens)

    @property
    def model(self) -> str:
        return self.servers["server"].model

    def complete(self, session: Session, index: int) -> str:
        call = session.calls[index]
        messages = [{"role": m["role"], "content": m["content"]}
                    for m in session.threads[call.thread][:call.message]]
        xargs = {"agentspec_session": session.id, "agentspec_role": call.role}
        if session.structure:
            xargs["agentspec_structure"] = json.dumps([list(p) for p in session.structure])
        key = f"{session.id}#{index}"
        self.roles[key] = call.role
        replies, al = {}, None
        for name, server in self.servers.items():
            before = server.counters() if name == "server" else {}
            reply = server.complete(self.max_tokens[call.role], messages=messages, xargs=xargs)
            if reply.tokens < 0:  # no usage in the answer: count with the model's tokenizer
                reply.tokens = self.count(reply.text)
            if name == "server":
                al = acceptance_length(before, server.counters())
            self.runs[name].replies[key] = reply
            self.runs[name].seconds += reply.seconds
            replies[name] = reply
        got, plain = replies["server"], replies.get("plain")
        if self.on_call:
            self.on_call(CallStats(session.id, call.role, call.turn, got.tokens, got.seconds, al,
                                   plain.seconds if plain else None,
                                   plain.text == got.text if plain else None))
        return got.text

    def end_session(self, session_id: str) -> None:
        """Nothing to free here: the server keeps or drops its sessions itself."""

    def report(self) -> dict:
        """Method entries (agentspec.bench/1's measured fields) of each server."""
        for name, server in self.servers.items():
            self.runs[name].al = acceptance_length(self.first[name], server.counters())
        plain = self.runs.get("plain")
        return {name: method_entry(run, plain, self.roles, self.count)
                for name, run in self.runs.items()}
