"""The four-role agent: its turn loop, recording, and its tools, with scripted model outputs."""

from __future__ import annotations

import json

import pytest

from agentspec.agents.agent import named_files, run_task, verdict
from agentspec.agents.tasks import load_task
from agentspec.agents.tools import try_patch
from agentspec.tokens import ChatTokenizer, tokenize_sessions
from agentspec.trace import parse_session, read_sessions, write_sessions

TASK = "rle-codec"


class ScriptedLLM:
    """Answers each role from a list, in order; records what it was asked."""

    def __init__(self, **outputs: list[str]):
        self.outputs = {role: list(texts) for role, texts in outputs.items()}
        self.asked: list[tuple[str, int, list[dict]]] = []

    def complete(self, session, index):
        call = session.calls[index]
        thread = session.threads[call.thread]
        assert thread[call.message] == {"role": "assistant", "content": ""}
        self.asked.append((call.role, call.turn, thread[:call.message]))
        return self.outputs[call.role].pop(0)


def fenced(diff: str) -> str:
    return f"Here is the fix.\n```diff\n{diff}```\n"


@pytest.fixture
def task():
    return load_task(TASK)


def test_a_failed_turn_then_the_reference_fix_solves_the_task(task):
    fix = (task.path / "fix.diff").read_text()
    llm = ScriptedLLM(localize=["rle/codec.py"],
                      code=["I think the bug is in decode.", fenced(fix)],
                      run=["no patch", "all passed"],
                      review=["VERDICT: reject\nWrite a diff.", "VERDICT: accept\nGood."])
    result = run_task(task, llm, max_turns=3)
    assert result.solved and result.turns == 2 and result.error is None
    assert result.verdicts == ["reject", "accept"]
    assert [(r, t) for r, t, _ in llm.asked] == [
        ("localize", 1), ("code", 1), ("run", 1), ("review", 1),
        ("code", 2), ("run", 2), ("review", 2)]
    first, second = result.runs
    assert not first.applied and "No patch" in first.output
    assert second.applied and second.passed and "passed" in second.output
    # turn 2's code prompt carries the report and the feedback of turn 1
    code2 = llm.asked[4][2][-1]["content"]
    assert "no patch" in code2 and "Write a diff." in code2
    # the run role sees the tool output as a tool message
    assert llm.asked[2][2][-1]["role"] == "tool"
    assert not any(task.repo.rglob("__pycache__"))


def test_unsolved_after_max_turns_and_the_task_repo_is_untouched(task, tmp_path):
    before = {p: p.read_bytes() for p in task.repo.rglob("*") if p.is_file()}
    evil = ("--- a/../outside.py\n+++ b/../outside.py\n@@ -0,0 +1 @@\n+print('x')\n")
    breaking = ("--- a/rle/codec.py\n+++ b/rle/codec.py\n@@ -1,1 +1,1 @@\n-nothing like this\n"
                "+x\n")
    llm = ScriptedLLM(localize=["I don't know"], code=[fenced(evil), fenced(breaking)],
                      run=["r1", "r2"], review=["no verdict", "VERDICT: reject"])
    result = run_task(task, llm, max_turns=2, workdir=tmp_path)
    assert not result.solved and result.turns == 2
    assert result.verdicts == ["none", "reject"]
    assert all(not r.applied for r in result.runs)
    assert "does not apply" in result.runs[0].output
    assert not (task.repo.parent / "outside.py").exists()
    assert not (tmp_path / "outside.py").exists()
    assert before == {p: p.read_bytes() for p in task.repo.rglob("*") if p.is_file()}
    # localize named nothing: the code role was shown every source file
    shown = llm.asked[1][2][-1]["content"]
    assert all(f"File {p}:" in shown for p in task.source_files())


def test_the_recorded_session_is_a_valid_trace_that_replays(task, tmp_path, tiny_model_dir):
    fix = (task.path / "fix.diff").read_text()
    llm = ScriptedLLM(localize=["The bug is in codec.py."], code=[fenced(fix)], run=["ok"],
                      review=["VERDICT: accept"])
    result = run_task(task, llm, model="scripted")
    s = result.session
    assert s.files == {"rle/codec.py": (task.repo / "rle/codec.py").read_text()}
    assert [c.role for c in s.calls] == ["localize", "code", "run", "review"]
    assert s.calls[1].files == ["rle/codec.py"] and s.calls[0].files == []
    assert {c.query_id for c in s.calls} == {TASK}
    assert s.meta["task"] == TASK and ["```diff", "```"] in s.meta["structure"]
    path = tmp_path / "t.jsonl.gz"
    write_sessions(path, [s])
    (back,), bad = read_sessions([path])
    assert not bad and back.to_json() == parse_session(json.loads(json.dumps(s.to_json()))).to_json()
    assert back.output(back.calls[1]) == fenced(fix)
    tok = ChatTokenizer.from_model(tiny_model_dir)
    (ts,) = tokenize_sessions([back], tok)
    assert [p for p, _ in ts.calls[1].new_files] == ["rle/codec.py"]
    assert [r for r, _ in ts.calls[2].new_messages] == ["system", "user", "tool"]


def test_named_files_and_verdicts(task):
    assert named_files("rle/codec.py", task) == ["rle/codec.py"]
    assert named_files("look at codec.py first", task) == ["rle/codec.py"]
    assert named_files("xrle/codec.pyc and codec.python", task) == []
    assert verdict("VERDICT: Accept\nfine") == "accept"
    assert verdict("Verdict : reject") == "reject"
    assert verdict("looks good") == "none"


def test_try_patch_runs_the_tests_of_a_copy(task, tmp_path):
    fix = (task.path / "fix.diff").read_text()
    run = try_patch(fenced(fix), task.repo, tmp_path / "a", task.timeout)
    assert run.applied and run.passed and run.diff.startswith("diff --git")
    assert (tmp_path / "a" / "rle" / "codec.py").read_text() != \
        (task.repo / "rle" / "codec.py").read_text()
    unfixed = try_patch(fenced(fix.replace("+            count += char",
                                           "+            count = char")),
                        task.repo, tmp_path / "b", task.timeout)
    assert unfixed.applied and not unfixed.passed and "failed" in unfixed.output


def test_a_hanging_test_suite_is_stopped(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_hang.py").write_text("import time\n\ndef test_x():\n"
                                                 "    time.sleep(60)\n")
    diff = "--- /dev/null\n+++ b/note.txt\n@@ -0,0 +1 @@\n+hi\n"
    run = try_patch(fenced(diff), repo, tmp_path / "w", timeout=2)
    assert run.applied and not run.passed and "did not finish in 2 s" in run.output


def test_run_agent_on_a_tiny_model_records_and_compares(tmp_path, model_folder, monkeypatch):
    from typer.testing import CliRunner

    from agentspec.cli import app

    monkeypatch.setenv("AGENTSPEC_HOME", str(tmp_path / "home"))
    r = CliRunner().invoke(app, ["run-agent", "--task", TASK, "--model", str(model_folder),
                                 "--compare", "--max-turns", "2", "--max-tokens", "16",
                                 "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["tasks"] == [{"task": TASK, "solved": False, "turns": 2, "error": None}]
    full, plain = summary["methods"]["full"], summary["methods"]["plain"]
    assert full["identical_to_plain"] is True and plain["speedup"] == 1.0
    assert full["output_tokens"] == plain["output_tokens"] > 0
    assert set(full["by_role"]) == {"localize", "code", "run", "review"}
    (s,), bad = read_sessions([tmp_path / "out" / "trace.jsonl.gz"])
    assert not bad and [c.role for c in s.calls] == ["localize"] + ["code", "run", "review"] * 2


@pytest.mark.parametrize("args, message", [
    ([], "--task"),
    (["--task", "no-such-task"], "unknown task 'no-such-task'"),
    (["--all", "--method", "warp"], "unknown method 'warp'"),
    (["--all", "--plain-url", "http://127.0.0.1:9"], "--plain-url goes with --url"),
    (["--all", "--url", "http://127.0.0.1:9"], "is not an OpenAI-compatible server"),
])
def test_run_agent_bad_input_is_one_message(args, message):
    from typer.testing import CliRunner

    from agentspec.cli import app

    r = CliRunner().invoke(app, ["run-agent", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
