"""Recorded agent sessions in the `agentspec.trace/1` format (shared/spec/session-trace.md).

A trace file is JSON Lines, one session per line, optionally gzip-compressed. Reading
validates every session up front so that a bad line fails here, naming the file, the
line and the session, and never deep inside a replay.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

FORMAT = "agentspec.trace/1"
ROLES = ("system", "user", "assistant", "tool")


class TraceError(ValueError):
    """A trace that does not follow the format; the message names file, line and session."""


@dataclass
class Call:
    """One LLM call: it generated `threads[thread][message]` from the messages before it."""

    thread: int
    message: int
    role: str = "agent"
    turn: int = 1
    agent_id: str = ""
    query_id: str = ""
    files: list[str] = field(default_factory=list)


@dataclass
class Session:
    id: str
    threads: list[list[dict]]
    calls: list[Call]
    files: dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return str(self.meta.get("task") or self.id)

    @property
    def structure(self) -> tuple[tuple[str, str], ...]:
        return tuple((a, b) for a, b in self.meta.get("structure") or ())

    def output(self, call: Call) -> str:
        return self.threads[call.thread][call.message]["content"]

    def to_json(self) -> dict:
        calls = []
        for c in self.calls:
            d = {"thread": c.thread, "message": c.message, "role": c.role, "turn": c.turn}
            if c.agent_id:
                d["agent_id"] = c.agent_id
            if c.query_id:
                d["query_id"] = c.query_id
            if c.files:
                d["files"] = list(c.files)
            calls.append(d)
        return {"format": FORMAT, "id": self.id, "meta": self.meta, "threads": self.threads,
                "calls": calls, "files": self.files}


def _open(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def parse_session(obj: object) -> Session:
    """Validate one decoded JSON line; raises TraceError with a message naming the problem."""
    if not isinstance(obj, dict):
        raise TraceError("a session must be a JSON object")
    sid = obj.get("id")
    if not isinstance(sid, str) or not sid:
        raise TraceError("missing session 'id'")
    fmt = obj.get("format", FORMAT)
    if fmt != FORMAT:
        raise TraceError(f"session {sid}: format {fmt!r}, expected {FORMAT!r}")
    for key in ("threads", "calls"):
        if not isinstance(obj.get(key), list):
            raise TraceError(f"session {sid}: missing or non-list {key!r}")
    threads = obj["threads"]
    for t, thread in enumerate(threads):
        if not isinstance(thread, list):
            raise TraceError(f"session {sid}: thread {t} is not a list")
        for m, msg in enumerate(thread):
            if not (isinstance(msg, dict) and msg.get("role") in ROLES
                    and isinstance(msg.get("content"), str)):
                raise TraceError(f"session {sid}: thread {t} message {m} needs a role in "
                                 f"{ROLES} and a string content")
    calls = []
    for i, c in enumerate(obj["calls"]):
        if not isinstance(c, dict) or "thread" not in c or "message" not in c:
            raise TraceError(f"session {sid}: call {i} lacks 'thread' or 'message'")
        t, m = c["thread"], c["message"]
        if not (isinstance(t, int) and 0 <= t < len(threads)):
            raise TraceError(f"session {sid}: call {i} names thread {t!r}, "
                             f"which does not exist")
        if not (isinstance(m, int) and 0 <= m < len(threads[t])):
            raise TraceError(f"session {sid}: call {i} names message {m!r} "
                             f"of thread {t}, which does not exist")
        if threads[t][m]["role"] != "assistant":
            raise TraceError(f"session {sid}: call {i} names message {m} of thread {t}, "
                             f"a {threads[t][m]['role']!r} message, not an assistant one")
        calls.append(Call(thread=t, message=m, role=str(c.get("role") or "agent"),
                          turn=int(c.get("turn") or 1), agent_id=str(c.get("agent_id") or ""),
                          query_id=str(c.get("query_id") or ""),
                          files=list(c.get("files") or [])))
    files = obj.get("files") or {}
    meta = obj.get("meta") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise TraceError(f"session {sid}: 'files' must map paths to file text")
    if not isinstance(meta, dict):
        raise TraceError(f"session {sid}: 'meta' must be an object")
    structure = meta.get("structure")
    if structure is not None and not (
            isinstance(structure, list)
            and all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) and s for s in p)
                    for p in structure)):
        raise TraceError(f"session {sid}: meta.structure must be a list of [open, close] "
                         f"string pairs")
    return Session(id=sid, threads=threads, calls=calls, files=files, meta=meta)


def iter_sessions(path: str | Path) -> Iterator[Session | TraceError]:
    """Yield each session of a file, or a TraceError naming file, line and session."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        with _open(path, "r") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield parse_session(json.loads(line))
                except json.JSONDecodeError as e:
                    yield TraceError(f"{path}:{lineno}: not valid JSON ({e.msg})")
                except TraceError as e:
                    yield TraceError(f"{path}:{lineno}: {e}")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read ({e})") from None


def read_sessions(paths: Iterable[str | Path], strict: bool = False) -> tuple[list[Session], list[TraceError]]:
    """Read all sessions; bad ones are returned as errors (or raised when `strict`).

    A file in which no session is valid always raises: that is a wrong file, not a
    few bad sessions.
    """
    sessions: list[Session] = []
    errors: list[TraceError] = []
    for path in paths:
        good = 0
        file_errors = []
        for item in iter_sessions(path):
            if isinstance(item, TraceError):
                if strict:
                    raise item
                file_errors.append(item)
            else:
                sessions.append(item)
                good += 1
        if good == 0:
            first = f": {file_errors[0]}" if file_errors else ""
            raise TraceError(f"{path}: no valid session{first}")
        errors.extend(file_errors)
    return sessions, errors


def write_sessions(path: str | Path, sessions: Iterable[Session]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "w") as f:
        for s in sessions:
            f.write(json.dumps(s.to_json(), ensure_ascii=False) + "\n")
