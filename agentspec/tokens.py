"""Tokenizing recorded sessions once, so a replay costs O(total text), not O(calls x prompt).

Each message is rendered on its own (ChatML when the model's chat template is ChatML,
else a fixed `role: content` form) and tokenized once; a call's prompt is the
concatenation of its thread's earlier messages plus the assistant header, and its output
is the recorded assistant text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from agentspec.drafter import FILE, PROMPT, TOOL, Drafter, Request
from agentspec.trace import Call, Session


@dataclass(frozen=True)
class ChatFormat:
    """How one chat message is laid out around its content."""

    prefix: str  # with "{role}" in it
    suffix: str
    header: str  # what precedes the assistant's output in a prompt

    def render(self, role: str, content: str) -> str:
        return self.prefix.format(role=role) + content + self.suffix


CHATML = ChatFormat("<|im_start|>{role}\n", "<|im_end|>\n", "<|im_start|>assistant\n")
PLAIN = ChatFormat("{role}: ", "\n\n", "assistant: ")


def chat_format(template: str | None) -> ChatFormat:
    return CHATML if template and "<|im_start|>" in template else PLAIN


class ChatTokenizer:
    """A `tokenizers.Tokenizer` plus the chat layout of its model."""

    def __init__(self, tokenizer: Tokenizer, fmt: ChatFormat, name: str = ""):
        self.tokenizer = tokenizer
        self.format = fmt
        self.name = name
        self.header = self.encode(fmt.header)

    @classmethod
    def from_model(cls, path: Path, name: str = "") -> "ChatTokenizer":
        from agentspec.models import chat_template, load_tokenizer

        return cls(load_tokenizer(path), chat_format(chat_template(path)), name or path.name)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@dataclass
class TokenizedCall:
    call: Call
    prompt: np.ndarray  # int32 token ids the model saw
    output: list[int]  # the recorded output, the oracle target
    # (role, tokens) of prompt messages first shown by this call; outputs of earlier
    # calls are not repeated here, the engine registers them when those calls finish
    new_messages: list[tuple[str, list[int]]]
    # (path, tokens) of workspace files first opened by this call (the first call also
    # carries the files that no call names)
    new_files: list[tuple[str, list[int]]] = field(default_factory=list)
    # the token budget the output was generated under, where a real backend generated it
    # (its --max-tokens; None: a recorded output, which ended on its own): the engine cut
    # every draft to what the budget left, so a replay does too
    max_tokens: int | None = None

    def register(self, drafter: Drafter, session: str) -> None:
        """Hand the drafter the text this call shows for the first time."""
        for path, tokens in self.new_files:
            drafter.register(session, FILE, tokens, path)
        for role, tokens in self.new_messages:
            drafter.register(session, TOOL if role == "tool" else PROMPT, tokens)


@dataclass
class TokenizedSession:
    session: Session
    calls: list[TokenizedCall]
    files: dict[str, list[int]]  # the workspace files, tokenized

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def output_tokens(self) -> int:
        return sum(len(c.output) for c in self.calls)

    def request(self, index: int, prompt: list[int] | None = None, suffix: str = "") -> Request:
        """The Request of call `index`, by default with its whole recorded prompt."""
        c = self.calls[index].call
        tokens = self.calls[index].prompt.tolist() if prompt is None else list(prompt)
        return Request(id=f"{self.id}#{index}{suffix}", session=self.id, tokens=tokens,
                       num_prompt=len(tokens), role=c.role,
                       agent=c.agent_id or self.session.meta.get("agent", ""),
                       query=c.query_id or self.id, turn=c.turn,
                       structure=self.session.structure)


def tokenize_sessions(sessions: list[Session], tok: ChatTokenizer) -> list[TokenizedSession]:
    """Tokenize every message of every session in one batched pass."""
    texts: list[str] = []
    for s in sessions:
        for thread in s.threads:
            for msg in thread:
                texts.append(tok.format.render(msg["role"], msg["content"]))
                if msg["role"] == "assistant":
                    texts.append(msg["content"])
        texts.extend(s.files.values())
    ids = iter(tok.encode_many(texts))
    header = np.asarray(tok.header, dtype=np.int32)
    out = []
    for s in sessions:
        rendered: list[list[np.ndarray]] = []
        bare: dict[tuple[int, int], list[int]] = {}
        for t, thread in enumerate(s.threads):
            rendered.append([])
            for m, msg in enumerate(thread):
                rendered[t].append(np.asarray(next(ids), dtype=np.int32))
                if msg["role"] == "assistant":
                    bare[(t, m)] = next(ids)
        seen: list[int] = [0] * len(s.threads)  # messages of each thread already shown
        generated = {(c.thread, c.message) for c in s.calls}
        calls = []
        for c in s.calls:
            parts = rendered[c.thread][: c.message]
            prompt = np.concatenate(parts + [header]) if parts else header.copy()
            first = seen[c.thread]
            new = [(s.threads[c.thread][m]["role"], rendered[c.thread][m].tolist())
                   for m in range(first, c.message)
                   if (c.thread, m) not in generated]
            seen[c.thread] = max(first, c.message + 1)
            calls.append(TokenizedCall(c, prompt, bare[(c.thread, c.message)], new))
        files = {path: next(ids) for path in s.files}
        opened: set[str] = set()
        for i, tc in enumerate(calls):
            paths = list(tc.call.files)
            if i == 0:
                named = {p for c in s.calls for p in c.files}
                paths += [p for p in s.files if p not in named]
            for path in paths:
                if path in files and path not in opened:
                    opened.add(path)
                    tc.new_files.append((path, files[path]))
        out.append(TokenizedSession(s, calls, files))
    return out
