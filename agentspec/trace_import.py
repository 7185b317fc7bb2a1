"""Other agents' recorded runs as `agentspec.trace/1` sessions (shared/spec/session-trace.md).

mini-swe-agent (the SWE-agent team's bash-only agent) saves each run as a `.traj.json`: its
whole conversation in `messages`, every assistant message one model call whose prompt was
every message before it (the agent re-sends its history). That is one thread, and a call
per assistant message. Formats `mini-swe-agent-1` and text-based `mini-swe-agent-1.1` are
read; a run whose model answered with tool calls is refused, since the tokens it generated
are not in its messages' text.

    agentspec import-trace trajs/ --out mini.jsonl.gz
    agentspec bench --traces mini.jsonl.gz --methods plain,suffix,full
"""

from __future__ import annotations

import json
from pathlib import Path

from agentspec.trace import ROLES, Call, Session, TraceError

MINI_SWE_FORMATS = ("mini-swe-agent-1", "mini-swe-agent-1.1")
# the fences mini-swe-agent's text-based configs ask the model to put its command in
MINI_SWE_FENCES = ("```mswea_bash_command", "```bash")


def mini_swe_session(traj: object, source: str, task: str = "") -> Session:
    """One mini-swe-agent trajectory (its decoded JSON) as a session named `source/<task>`,
    the task its `instance_id` (a SWE-bench run's) or else `task`; a TraceError names what
    is wrong with it."""
    if not isinstance(traj, dict) or not isinstance(traj.get("messages"), list):
        raise TraceError("not a mini-swe-agent trajectory: no 'messages' list")
    fmt = traj.get("trajectory_format")
    if fmt not in MINI_SWE_FORMATS:
        raise TraceError(f"trajectory_format {fmt!r}: only {', '.join(MINI_SWE_FORMATS)} "
                         f"are read")
    info = traj.get("info") if isinstance(traj.get("info"), dict) else {}
    thread = []
    for i, message in enumerate(traj["messages"]):
        if not isinstance(message, dict):
            raise TraceError(f"message {i} is not an object")
        if message.get("tool_calls"):
            raise TraceError(f"message {i} holds tool calls: a tool-calling run's generated "
                             f"tokens are not in its text, so it cannot be replayed")
        role = message.get("role")
        if role not in ROLES:  # (v2 closes a run with an "exit" message: nothing generated)
            if any(m.get("role") == "assistant" for m in traj["messages"][i:]
                   if isinstance(m, dict)):
                raise TraceError(f"message {i} has role {role!r}, not one of {ROLES}")
            break
        thread.append({"role": role, "content": _text(message.get("content"), i)})
    calls = [Call(thread=0, message=i) for i, m in enumerate(thread) if m["role"] == "assistant"]
    if not calls:
        raise TraceError("no assistant message: the run made no model call")
    task = str(traj.get("instance_id") or task)
    if not task:
        raise TraceError("no 'instance_id': the task it ran is unknown")
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    outputs = "".join(thread[c.message]["content"] for c in calls)
    fence = next((f for f in MINI_SWE_FENCES if f in outputs), MINI_SWE_FENCES[-1])
    meta = {"agent": f"mini-swe-agent-{info.get('mini_version', '')}".rstrip("-"),
            "model": str(model.get("model_name") or ""), "task": task, "source": source,
            "structure": [[fence, "```"]]}
    return Session(id=f"{source}/{task}", threads=[thread], calls=calls, meta=meta)


def _text(content: object, i: int) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    raise TraceError(f"message {i}: content is neither text nor a list of parts")


def trajectory_files(paths: list[Path]) -> list[tuple[Path, Path]]:
    """The `.traj.json` files given, and those under the folders given, sorted: each as
    (the folder it was found under, the file); a file given alone is found under its own."""
    found = []
    for path in paths:
        if path.is_dir():
            found.extend((path, f) for f in sorted(path.rglob("*.traj.json")))
        elif path.is_file():
            found.append((path.parent, path))
        else:
            raise TraceError(f"{path}: no such file or folder")
    if not found:
        raise TraceError(f"no .traj.json file in {', '.join(map(str, paths))}")
    return found


def _run_of(root: Path, path: Path, task: str) -> str:
    """Which run a trajectory belongs to: its folder under `root`, less a last folder named
    after its task (mini-swe-agent writes `<run>/<instance_id>/<instance_id>.traj.json`)."""
    parts = path.parent.relative_to(root).parts
    if parts and parts[-1] == task:
        parts = parts[:-1]
    return "/".join(parts)


def import_mini_swe(paths: list[Path], source: str) -> tuple[list[Session], list[TraceError]]:
    """Every trajectory under `paths` as a session; the ones that cannot be read come back
    as errors naming their file (none read at all: raised, that is the wrong input).
    Sessions are named `source/<task>`; where the folders hold several runs of one task
    (a run per folder), every session is named by its run too, `source/<run>/<task>`."""
    sessions, runs, errors = [], [], []
    for root, path in trajectory_files(paths):
        try:
            traj = json.loads(path.read_text(encoding="utf-8"))
            # (a run of no SWE-bench instance: its file names the task)
            session = mini_swe_session(traj, source, path.name.split(".")[0])
        except json.JSONDecodeError as e:
            errors.append(TraceError(f"{path}: not valid JSON ({e.msg})"))
        except (TraceError, UnicodeDecodeError) as e:
            errors.append(TraceError(f"{path}: {e}"))
        else:
            sessions.append(session)
            runs.append(_run_of(root, path, session.meta["task"]))
    if not sessions:
        raise TraceError(f"no trajectory could be read: {errors[0]}")
    if len({s.id for s in sessions}) != len(sessions):
        for session, run in zip(sessions, runs):
            if run:
                session.id = f"{source}/{run}/{session.meta['task']}"
    ids = [s.id for s in sessions]
    if len(set(ids)) != len(ids):
        raise TraceError(f"two trajectories of one task in one run under {source!r}: "
                         f"{next(i for i in ids if ids.count(i) > 1)}")
    return sessions, errors
