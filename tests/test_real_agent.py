"""mini-swe-agent against `agentspec serve` (agents/mini_swe.py, scripts/real_agent.sh).

The sandbox runs real bubblewrap: writes outside the task's copy must leave the machine
untouched, the network must be off, a command past its timeout must be stopped with its
children. The slow test runs the driver end to end on one task against two real servers of
the embedded model.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from minisweagent.exceptions import Submitted

from agentspec.agents.mini_swe import (SANDBOX_DIR, DriverError, Sandbox, Server,
                                       method_entry, pick_tasks)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def copy(tmp_path) -> Path:
    d = tmp_path / "copy"
    d.mkdir()
    (d / "old.txt").write_text("old\n")
    return d


@pytest.fixture
def outside():
    """A folder outside the copy that the sandbox can see (so a failed write is a refusal)."""
    d = Path(tempfile.mkdtemp(prefix="agentspec-outside-", dir=Path.home()))
    (d / "keep.txt").write_text("keep\n")
    yield d
    shutil.rmtree(d)


def test_writes_outside_the_copy_leave_the_machine_untouched(copy, outside):
    sb = Sandbox(copy, timeout=30)
    tag = uuid.uuid4().hex
    assert sb.run(f"cat {outside}/keep.txt")["output"] == "keep\n"  # visible, read-only
    for command in [f"touch {outside}/marker", f"echo x > {Path.home()}/marker-{tag}",
                    f"rm {outside}/keep.txt", f"echo x > {outside}/keep.txt",
                    f"mkdir {ROOT}/marker-{tag}", f"echo x > /var/tmp/marker-{tag}"]:
        r = sb.run(command)
        assert r["returncode"] != 0 and "Read-only file system" in r["output"], command
    assert sb.run(f"echo x > /tmp/marker-{tag}")["returncode"] == 0
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "keep\n"
    assert not list(Path.home().glob(f"marker-{tag}")) and not (ROOT / f"marker-{tag}").exists()
    assert not Path(f"/tmp/marker-{tag}").exists()  # the sandbox's /tmp is its own
    assert not Path(f"/var/tmp/marker-{tag}").exists()
    # inside the copy, at the same fixed path in every run
    r = sb.run("pwd && echo new > new.txt && rm old.txt && mkdir -p pkg && touch pkg/m.py")
    assert r == {"output": SANDBOX_DIR + "\n", "returncode": 0, "exception_info": ""}
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*")) == \
        ["new.txt", "pkg", "pkg/m.py"]


def test_the_network_is_off(copy):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), 3)"
        probe = f'{sys.executable} -c "{connect}"'
        assert subprocess.run(probe, shell=True).returncode == 0  # reachable from here
        r = Sandbox(copy, timeout=30).run(probe)
    assert r["returncode"] != 0 and "Error" in r["output"]


def test_a_command_past_its_timeout_is_stopped_with_its_children(copy):
    sb = Sandbox(copy, timeout=30)
    t0 = time.monotonic()
    r = sb.run("(sleep 3; echo late > late.txt) & echo started; sleep 60", timeout=1)
    assert time.monotonic() - t0 < 10
    assert r["returncode"] == -1 and "did not finish in 1 s" in r["exception_info"]
    assert r["output"] == "started\n"
    time.sleep(4)
    assert not (copy / "late.txt").exists()  # the background child died with the sandbox
    assert sb.run("echo ok")["output"] == "ok\n"


def test_the_submission_line_ends_the_task(copy):
    sb = Sandbox(copy, timeout=30)
    assert sb.execute({"command": "echo hello"})["output"] == "hello\n"
    with pytest.raises(Submitted) as e:
        sb.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the fix"})
    assert e.value.messages[0]["extra"] == {"exit_status": "Submitted",
                                            "submission": "the fix\n"}
    # not on the first line, or a failing command: not a submission
    assert sb.execute({"command": "echo x; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    assert sb.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"})


def test_bad_task_names_and_unreachable_servers_are_one_line_errors():
    with pytest.raises(DriverError, match="unknown task 'nope'; known tasks: calc-expr"):
        pick_tasks("calc-expr,nope")
    assert [t.name for t in pick_tasks("")] == ["calc-expr", "date-range", "ini-config"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    with pytest.raises(DriverError, match=f"no agentspec server answers at .*:{port}"):
        Server("plain", f"http://127.0.0.1:{port}").connect()
    r = subprocess.run([sys.executable, "-m", "agentspec.agents.mini_swe", "--plain",
                        f"http://127.0.0.1:{port}", "--full", f"http://127.0.0.1:{port}",
                        "--out", "unused", "--tasks", "calc-expr"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith("error: no agentspec server answers")
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(["bash", str(ROOT / "scripts" / "real_agent.sh"), "unused", "nope"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: unknown task 'nope'")


def test_each_call_goes_to_both_servers_and_a_full_context_ends_the_task(model_folder,
                                                                         tmp_path):
    from minisweagent.exceptions import LimitsExceeded
    from test_serve import Server as Served

    from agentspec.agents.mini_swe import ComparedModel, agent_config

    served = Served(model_folder, "plain", tmp_path)  # one server stands for both here
    try:
        server = Server("plain", served.base).connect()
        model = ComparedModel({"plain": server, "full": server}, "t", 16,
                              **agent_config()["model"])
        chat = [{"role": "system", "content": "You fix bugs."},
                {"role": "user", "content": "def add(a, b):\n    return a - b\n"}]
        response = model._query(chat)
        (call,) = model.calls
        assert call["identical"] and response.choices[0].message.content is not None
        for method in ("plain", "full"):
            assert call[method]["tokens"] == call[method]["generated_tokens"] \
                == response.usage.completion_tokens
            assert call[method]["draft_tokens"] == 0 and call[method]["seconds"] > 0
            assert call[method]["steps"] >= call[method]["generated_tokens"]  # plain: AL <= 1
        with pytest.raises(LimitsExceeded) as e:
            model._query([{"role": "user", "content": "word " * 9000}])
        assert e.value.messages[0]["extra"]["exit_status"] == "ContextFull"
    finally:
        served.stop()


def test_method_entries_add_calls_up():
    def call(i, plain_s, full_s, full_steps, identical=True):
        return {"task": "t", "call": i, "identical": identical,
                "plain": {"tokens": 10, "seconds": plain_s, "generated_tokens": 10, "steps": 10,
                          "draft_tokens": 0, "accepted_tokens": 0},
                "full": {"tokens": 10, "seconds": full_s, "generated_tokens": 10,
                         "steps": full_steps, "draft_tokens": 12, "accepted_tokens": 8}}

    calls = [call(0, 2.0, 1.0, 4), call(1, 2.0, 1.0, 1, identical=False)]
    plain = method_entry(calls, "plain", None)
    full = method_entry(calls, "full", plain)
    assert plain["tokens_per_s"] == 5.0 and plain["al"] == 1.0 and plain["speedup"] == 1.0
    assert full["tokens_per_s"] == 10.0 and full["speedup"] == 2.0 and full["al"] == 4.0
    assert full["rejected"] == 8 and full["rejected_per_token"] == 0.4
    assert not full["identical_to_plain"] and full["mismatches"] == ["t#1"]


# ---------------------------------------------------------------- the real model


@pytest.mark.slow
def test_mini_swe_agent_end_to_end_against_two_servers(tmp_path):
    from test_serve import Server as Served

    from agentspec.models import resolve

    folder = resolve(None)
    profile = ROOT / "results" / "mlx-lambda-smollm2-float32-cpu.json"  # no measuring here
    served = {}
    try:
        for method in ("full", "plain"):
            served[method] = Served(folder, method, tmp_path, "--cost-profile", str(profile))
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "agentspec.agents.mini_swe", "--plain",
               served["plain"].base, "--full", served["full"].base, "--out", str(out),
               "--tasks", "calc-expr", "--steps", "2", "--max-tokens", "32"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        sessions = served["full"].metrics().get("agentspec_sessions_total")
    finally:
        for s in served.values():
            s.stop()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["format"] == "agentspec.agent/1" and summary["agent"].startswith("mini-swe")
    (task,) = summary["tasks"]
    assert task["task"] == "calc-expr" and task["error"] is None and 1 <= task["steps"] <= 2
    assert task["exit_status"] in ("LimitsExceeded", "Submitted") and task["identical"]
    if sessions is not None:  # the server counts the sessions it infers
        assert task["sessions"] == {"plain": 1, "full": 1}
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == task["steps"] and all(c["identical"] for c in calls)
    assert all(1 <= c["plain"]["tokens"] <= 32 and c["plain"]["tokens"] == c["full"]["tokens"]
               and c["full"]["al"] >= 1 for c in calls)
    plain, full = summary["methods"]["plain"], summary["methods"]["full"]
    assert full["identical_to_plain"] and full["mismatches"] == []
    assert full["output_tokens"] == plain["output_tokens"] == sum(c["full"]["tokens"]
                                                                  for c in calls)
    assert full["tokens_per_s"] > 0 and plain["tokens_per_s"] > 0
    assert full["speedup"] == pytest.approx(full["tokens_per_s"] / plain["tokens_per_s"],
                                            rel=1e-3)
    assert full["al"] >= 1 and plain["draft_per_step"] == 0
    trajectory = json.loads((out / "trajectories" / "calc-expr.traj.json").read_text())
    assert trajectory["info"]["config"]["environment_type"].endswith("mini_swe.Sandbox")
    assert trajectory["messages"][0]["role"] == "system"
