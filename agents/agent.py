"""The four-role coding agent: localize, then turns of code, run and review.

    localize  names the files to change (turn 1 only)
    code      writes a unified diff for them
    run       the patch is applied to a fresh copy of the repository and its tests run;
              the run role reports on the result
    review    judges the patch and gives feedback; if the tests failed, the next turn
              starts again at code with the report and the feedback

Every call is recorded as it happens into an `agentspec.trace/1` session (one thread per
call, the opened files whole), and that session is what the model backend tokenizes: the
drafter sees each prompt, tool output, opened file and output exactly as a replay of the
recorded trace would.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agentspec.agents import prompts
from agentspec.agents.tasks import Task
from agentspec.agents.tools import TestRun, try_patch
from agentspec.trace import Call, Session

AGENT = "agentspec-agent"
ROLES = ("localize", "code", "run", "review")


class LLM(Protocol):
    def complete(self, session: Session, index: int) -> str:
        """Generate call `index` of `session` (its assistant message is still empty)."""


@dataclass
class TaskResult:
    task: str
    solved: bool
    turns: int
    error: str | None
    session: Session
    runs: list[TestRun] = field(default_factory=list)  # one per turn
    verdicts: list[str] = field(default_factory=list)  # the review role's, per turn

    def summary(self) -> dict:
        return {"task": self.task, "solved": self.solved, "turns": self.turns,
                "error": self.error}


class Recorder:
    """Builds the session trace call by call and asks the model for each output."""

    def __init__(self, session_id: str, task: Task, llm: LLM, model: str = ""):
        self.llm = llm
        self.session = Session(id=session_id, threads=[], calls=[], files={},
                               meta={"agent": AGENT, "model": model, "task": task.name,
                                     "structure": prompts.STRUCTURE})
        self.query = task.name

    def call(self, role: str, turn: int, messages: list[dict],
             files: dict[str, str] | None = None) -> str:
        """One LLM call: `messages` are its prompt, `files` the files it opens."""
        files = files or {}
        self.session.files.update(files)
        thread = [dict(m) for m in messages] + [{"role": "assistant", "content": ""}]
        self.session.threads.append(thread)
        self.session.calls.append(Call(thread=len(self.session.threads) - 1,
                                       message=len(thread) - 1, role=role, turn=turn,
                                       agent_id=AGENT, query_id=self.query,
                                       files=sorted(files)))
        text = self.llm.complete(self.session, len(self.session.calls) - 1)
        thread[-1]["content"] = text
        return text


def listing(task: Task) -> str:
    """Paths of the repository with their sizes, the localize role's view."""
    return "\n".join(f"{path} ({text.count(chr(10))} lines)"
                     for path, text in task.files().items())


def named_files(output: str, task: Task) -> list[str]:
    """Source files the localize output names (by path, or by file name when unique)."""
    sources = task.source_files()
    named = [p for p in sources if re.search(rf"(?<![\w/.]){re.escape(p)}\b", output)]
    for p in sources:
        base = p.rsplit("/", 1)[-1]
        if p not in named and re.search(rf"(?<![\w.]){re.escape(base)}\b", output) and \
                sum(q.rsplit("/", 1)[-1] == base for q in sources) == 1:
            named.append(p)
    return sorted(named)


def verdict(review: str) -> str:
    """accept, reject, or none when the review gave no verdict line."""
    m = re.search(r"verdict\s*:\s*(accept|reject)", review, re.IGNORECASE)
    return m.group(1).lower() if m else "none"


def run_task(task: Task, llm: LLM, *, max_turns: int = 3, model: str = "",
             session_id: str | None = None, workdir: Path | None = None) -> TaskResult:
    """Run the agent on one task until its tests pass or `max_turns` turns are spent."""
    rec = Recorder(session_id or f"{AGENT}/{task.name}", task, llm, model)
    with tempfile.TemporaryDirectory(prefix=f"agentspec-{task.name}-",
                                     dir=workdir) as tmp:
        out = rec.call("localize", 1, prompts.localize(task.issue, listing(task)))
        paths = named_files(out, task) or task.source_files()
        everything = task.files()
        files = {p: everything[p] for p in paths}
        result = TaskResult(task.name, False, 0, None, rec.session)
        previous, report, feedback = None, "", ""
        for turn in range(1, max_turns + 1):
            output = rec.call("code", turn, prompts.code(task.issue, files, previous, report,
                                                         feedback),
                              files if turn == 1 else None)
            run = try_patch(output, task.repo, Path(tmp) / f"turn-{turn}", task.timeout)
            patch = run.diff or output  # not a diff: the run and review roles see what it was
            report = rec.call("run", turn, prompts.run(patch, run.output))
            feedback = rec.call("review", turn, prompts.review(task.issue, patch, run.passed,
                                                               report))
            result.runs.append(run)
            result.verdicts.append(verdict(feedback))
            result.turns = turn
            if run.passed:
                result.solved = True
                break
            previous = patch
    return result

