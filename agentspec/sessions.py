"""Which session a served request belongs to, and what its drafter has already seen.

Both servers (`agentspec serve` on MLX, the vLLM drafter) read the same optional
`agentspec_*` metadata, and a chat request without `agentspec_session` belongs to the
session whose calls began with the same leading messages (system prompt and first user
message), the way a prefix cache recognises a conversation. `SessionBook` keeps, per
session, what was registered (so a call that re-sends its history registers only what is
new) and drops the least recently used idle sessions past its bound.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Callable, Sequence

from agentspec.drafter import FILE, PROMPT, Drafter, Request
from agentspec.speculation import accepted_prefix as common_prefix
from agentspec.structure import StructureError, parse_structure

PREFIX = "agentspec_"
TEXT_KEYS = ("session", "agent", "query", "role")


def request_meta(req_id: str, extra_args: dict | None) -> tuple[dict, list[str]]:
    """Request fields from `extra_args`: (fields, warnings). Bad values are left out."""
    args = extra_args or {}
    fields: dict[str, Any] = {"session": f"request:{req_id}", "role": "agent", "agent": "",
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


def leading_messages(messages: Sequence[dict]) -> list[dict]:
    """The system messages that open a chat, and its first user message."""
    lead = []
    for m in messages:
        lead.append({"role": m.get("role"), "content": m.get("content")})
        if m.get("role") not in ("system", "developer"):
            break
    return lead


def infer_session(messages: Sequence[dict]) -> str:
    """A session key for a chat: equal for chats that begin with the same messages."""
    text = json.dumps(leading_messages(messages), sort_keys=True, ensure_ascii=False)
    return "chat:" + hashlib.sha1(text.encode()).hexdigest()[:16]


class SessionBook:
    """The sessions a drafter knows, least recently used first, with what each registered.

    `begin` registers a request's new prompt text and files; `end` remembers its prompt
    plus output, so the next call of the session, which re-sends both, adds only its new
    messages. Past `max_sessions`, idle sessions are dropped (`drafter.drop_session`).
    """

    def __init__(self, drafter: Drafter, max_sessions: int = 64,
                 encode: Callable[[str], list[int]] | None = None):
        self.drafter, self.max_sessions, self.encode = drafter, max_sessions, encode
        self.seen: OrderedDict[str, list[int]] = OrderedDict()  # session -> tokens registered
        self.files: dict[str, set[tuple[str, int]]] = {}
        self.running: dict[str, int] = {}  # session -> requests in flight

    def begin(self, request: Request, files: dict[str, str] | None = None) -> None:
        s = request.session
        prompt = request.tokens[:request.num_prompt]
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
            self.seen.pop(old, None)
            self.files.pop(old, None)
