import json

import pytest
from typer.testing import CliRunner

from agentspec.cli import app
from agentspec.trace import TraceError, read_sessions
from agentspec.trace_import import import_mini_swe, mini_swe_session

runner = CliRunner()


def trajectory(task="astropy__astropy-1", fmt="mini-swe-agent-1", fence="```bash"):
    """A mini-swe-agent run as it saves it: the whole conversation, two model calls."""
    return {
        "trajectory_format": fmt, "instance_id": task,
        "info": {"mini_version": "1.15.0", "exit_status": "Submitted",
                 "config": {"model": {"model_name": "google/gemini-3-pro-preview"}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": f"THOUGHT: look.\n\n{fence}\nls\n```",
             "extra": {"response": {}}},
            {"role": "user", "content": [{"type": "text", "text": "<returncode>0</returncode>"},
                                         {"type": "image_url", "image_url": "x"}]},
            {"role": "assistant", "content": f"THOUGHT: done.\n\n{fence}\necho DONE\n```"},
        ],
    }


def test_a_run_is_one_thread_and_a_call_per_assistant_message():
    s = mini_swe_session(trajectory(), "mini")
    assert s.id == "mini/astropy__astropy-1" and s.task == "astropy__astropy-1"
    assert [c.message for c in s.calls] == [2, 4]
    assert all(c.thread == 0 and c.role == "agent" for c in s.calls)
    # the prompt of each call is every message before it: the history the agent re-sent
    assert [m["role"] for m in s.threads[0]] == ["system", "user", "assistant", "user",
                                                 "assistant"]
    assert s.threads[0][3]["content"] == "<returncode>0</returncode>"  # text parts only
    assert s.meta["agent"] == "mini-swe-agent-1.15.0"
    assert s.meta["model"] == "google/gemini-3-pro-preview"
    assert s.structure == (("```bash", "```"),)


def test_version_2_text_runs_and_their_exit_message():
    traj = trajectory(fmt="mini-swe-agent-1.1", fence="```mswea_bash_command")
    traj["messages"].append({"role": "exit", "content": "", "extra": {"exit_status": "done"}})
    s = mini_swe_session(traj, "mini")
    assert len(s.threads[0]) == 5 and len(s.calls) == 2
    assert s.structure == (("```mswea_bash_command", "```"),)


@pytest.mark.parametrize("mutate, needle", [
    (lambda t: t.pop("messages"), "no 'messages' list"),
    (lambda t: t.update(trajectory_format="swe-agent"), "trajectory_format 'swe-agent'"),
    (lambda t: t["messages"][2].update(tool_calls=[{"id": "1"}]), "message 2 holds tool calls"),
    (lambda t: t["messages"][1].update(role="robot"), "message 1 has role 'robot'"),
    (lambda t: t["messages"][1].update(content=7), "message 1: content"),
    (lambda t: t.update(messages=t["messages"][:2]), "no assistant message"),
])
def test_a_bad_trajectory_is_named(mutate, needle):
    traj = trajectory()
    mutate(traj)
    with pytest.raises(TraceError, match=needle):
        mini_swe_session(traj, "mini")


def test_a_folder_imports_with_bad_files_skipped_and_named(tmp_path):
    runs = tmp_path / "runs"
    for task in ("a__a-1", "b__b-2"):
        (runs / task).mkdir(parents=True)
        (runs / task / f"{task}.traj.json").write_text(json.dumps(trajectory(task)))
    (runs / "broken.traj.json").write_text("{not json")
    sessions, errors = import_mini_swe([runs], "mini")
    assert [s.id for s in sessions] == ["mini/a__a-1", "mini/b__b-2"]
    assert len(errors) == 1 and "broken.traj.json: not valid JSON" in str(errors[0])
    # a run of no SWE-bench instance (agentspec's own mini-swe-agent runs) is named by its file
    local = trajectory()
    local.pop("instance_id")
    (runs / "calc-expr.traj.json").write_text(json.dumps(local))
    sessions, _ = import_mini_swe([runs], "mini")
    assert "mini/calc-expr" in [s.id for s in sessions]
    with pytest.raises(TraceError, match="nothing: no such file or folder"):
        import_mini_swe([runs / "nothing"], "mini")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no .traj.json file in"):
        import_mini_swe([tmp_path / "empty"], "mini")


def test_several_runs_of_one_task_are_named_by_their_run(tmp_path):
    results = tmp_path / "results"
    for run, tasks in (("high", ("a__a-1", "b__b-2")), ("low", ("a__a-1",))):
        for task in tasks:
            (results / run / task).mkdir(parents=True)
            (results / run / task / f"{task}.traj.json").write_text(json.dumps(trajectory(task)))
    sessions, errors = import_mini_swe([results], "gpt")
    assert not errors
    assert [s.id for s in sessions] == ["gpt/high/a__a-1", "gpt/high/b__b-2", "gpt/low/a__a-1"]
    # the task stays the task, so the bench's task split keeps a task's runs on one side
    assert [s.task for s in sessions] == ["a__a-1", "b__b-2", "a__a-1"]
    # one run alone keeps the short names
    sessions, _ = import_mini_swe([results / "high"], "gpt")
    assert [s.id for s in sessions] == ["gpt/a__a-1", "gpt/b__b-2"]
    # two trajectories of one task in one run: nothing tells them apart
    (results / "low" / "copy.traj.json").write_text(json.dumps(trajectory("a__a-1")))
    with pytest.raises(TraceError, match="two trajectories of one task in one run under "
                                         "'gpt': gpt/low/a__a-1"):
        import_mini_swe([results], "gpt")


def test_import_trace_writes_a_trace_the_bench_reads(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.traj.json").write_text(json.dumps(trajectory("a__a-1")))
    (runs / "tools.traj.json").write_text(json.dumps(
        {**trajectory("t__t-1"), "messages": [{"role": "assistant", "content": "",
                                               "tool_calls": [{"id": "1"}]}]}))
    out = tmp_path / "mini.jsonl.gz"
    r = runner.invoke(app, ["import-trace", str(runs), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "skipped" in r.output and "holds tool calls" in r.output
    assert "wrote 1 sessions (2 calls)" in r.output
    (s,), bad = read_sessions([out])
    assert s.id == "runs/a__a-1" and bad == []
    r = runner.invoke(app, ["import-trace", str(runs / "tools.traj.json"), "--out", str(out)])
    assert r.exit_code == 2 and "no trajectory could be read" in r.output
