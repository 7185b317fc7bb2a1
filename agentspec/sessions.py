"""Which session a served request belongs to, and what its drafter has already seen.

Both servers (`agentspec serve` on MLX, the vLLM drafter in `vllm serve`) read the same
optional `agentspec_*` metadata. A request without `agentspec_session` joins the session
whose first prompt it continues, the way a prefix cache recognises a conversation: an agent
re-sends its system prompt and first task message on every call, so the first call's prompt
(up to a few tokens of chat-template trailer) opens every later one. Prompts are token ids,
so this works the same for chat and plain completions, and in vLLM's engine, which never
sees messages. `SessionBook` does it, and keeps per session what was registered (a call
that re-sends its history registers only what is new); past its bound it drops the least
recently used idle sessions.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from agentspec.drafter import FILE, PROMPT, Drafter, Request
from agentspec.structure import StructureError, parse_structure

PREFIX = "agentspec_"
# How many tokens at the end of a session's first prompt a later call may render differently
# (a chat template's generation prompt, e.g. an empty think block that later turns omit).
TRAILER_TOKENS = 8
TEXT_KEYS = ("session", "agent", "query", "role")


def request_meta(req_id: str, extra_args: dict | None) -> tuple[dict, list[str]]:
    """Request fields from `extra_args`: (fields, warnings). Bad values are left out;
    without `agentspec_session` the session is "" (SessionBook.begin infers it)."""
    args = extra_args or {}
    fields: dict[str, Any] = {"session": "", "role": "agent", "agent": "",
                              "query": req_id, "structure": ()}
    problems = []
    for key in TEXT_KEYS:
        value = args.get(PREFIX + key)
        if value is None:
            continue
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            fields[key] = str(value)
        else:
            problems.append(f"{PREFIX}{key}={value!r} ignored: not a non-empty string")
    value = args.get(PREFIX + "structure")
    if value is not None:
        try:
            if not isinstance(value, str):
                raise StructureError("not a JSON string")
            fields["structure"] = parse_structure(value)
        except StructureError as e:
            problems.append(f"{PREFIX}structure ignored: {e}")
    return fields, [f"request {req_id}: {p}" for p in problems]


def request_files(req_id: str, extra_args: dict | None) -> tuple[dict[str, str], list[str]]:
    """`agentspec_files` of `extra_args` as {path: text}: (files, warnings)."""
    value = (extra_args or {}).get(PREFIX + "files")
    if value is None:
        return {}, []
    try:
        files = json.loads(value) if isinstance(value, str) else None
        if not (isinstance(files, dict)
                and all(isinstance(t, str) for t in files.values())):
            raise ValueError("not a JSON object of path: text")
    except ValueError as e:
        return {}, [f"request {req_id}: {PREFIX}files ignored: {e}"]
    return files, []


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. In numpy, unlike the speculation loop's
    `accepted_prefix` (a few draft tokens per step): prompts here run to thousands."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.asarray(a[:n]) != np.asarray(b[:n])
    return int(differ.argmax()) if differ.any() else n


class SessionBook:
    """The sessions a drafter knows, least recently used first, with what each registered.

    `begin` gives a request without a session the one it continues (or a new one), then
    registers its new prompt text and files; `end` remembers its prompt plus output, so the
    next call of the session, which re-sends both, adds only its new messages. Past
    `max_sessions`, idle sessions are dropped (`drafter.drop_session`).
    """

    def __init__(self, drafter: Drafter, max_sessions: int = 64,
                 encode: Callable[[str], list[int]] | None = None):
        self.drafter, self.max_sessions, self.encode = drafter, max_sessions, encode
        self.seen: OrderedDict[str, list[int]] = OrderedDict()  # session -> tokens registered
        self.first: dict[str, list[int]] = {}  # session -> its first prompt
        self.files: dict[str, set[tuple[str, int]]] = {}
        self.running: dict[str, int] = {}  # session -> requests in flight
        self.sessions_started = 0
        self._ids = itertools.count(1)

    def infer(self, prompt: Sequence[int]) -> str:
        """The session whose first prompt `prompt` continues (of several, the one sharing
        most with what it registered last), or a new session's key."""
        best, best_shared = None, -1
        for s, first in self.first.items():
            opened = common_prefix(first, prompt)
            if opened < len(first) - TRAILER_TOKENS or opened <= TRAILER_TOKENS:
                continue
            shared = common_prefix(self.seen.get(s, first), prompt)
            if shared > best_shared:
                best, best_shared = s, shared
        return best if best is not None else f"inferred:{next(self._ids)}"

    def begin(self, request: Request, files: dict[str, str] | None = None) -> None:
        prompt = request.tokens[:request.num_prompt]
        if not request.session:
            request.session = self.infer(prompt)
        s = request.session
        if s not in self.seen:
            self.sessions_started += 1
            self.first[s] = list(prompt)
        if files and self.encode is not None:
            seen = self.files.setdefault(s, set())
            for path, text in files.items():
                if (path, hash(text)) not in seen:
                    seen.add((path, hash(text)))
                    self.drafter.register(s, FILE, self.encode(text), path)
        new = prompt[common_prefix(self.seen.get(s, []), prompt):]
        if new:
            self.drafter.register(s, PROMPT, new)
        self.seen[s] = list(prompt)
        self.seen.move_to_end(s)
        self.running[s] = self.running.get(s, 0) + 1
        self.drafter.start(request)
        self._evict()

    def end(self, request: Request) -> None:
        s = request.session
        self.drafter.finish(request)
        self.running[s] = self.running.get(s, 1) - 1
        if not self.running[s]:
            del self.running[s]
        if s in self.seen:
            self.seen[s] = list(request.tokens)
        self._evict()

    def _evict(self) -> None:
        for old in [s for s in self.seen if s not in self.running]:
            if len(self.seen) <= self.max_sessions:
                break
            self.drafter.drop_session(old)
            for state in (self.seen, self.first, self.files):
                state.pop(old, None)
