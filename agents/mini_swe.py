"""mini-swe-agent, a third-party bash-only agent, on the tasks against `agentspec serve`.

mini-swe-agent (the SWE-agent team's agent) runs unchanged: its DefaultAgent with its own
text-based config, and its litellm model pointed at the OpenAI-compatible servers, which see
an ordinary client (no agentspec metadata: the server infers each task's session from the
prompt each call continues). Every model call is sent to the `full` and the `plain` server in
turn, non-streaming and one at a time; the texts must be identical, and each call's tokens,
seconds and acceptance length (from the servers' /metrics) go to a per-call log. The agent
goes on with the `full` answer.

The agent's shell commands run in a bubblewrap sandbox on a temporary copy of the task's
repository, which appears at /tmp/task in every run: the rest of the file system is
read-only, /tmp is private, there is no network, and each command has a timeout.

    python -m agentspec.agents.mini_swe --plain http://127.0.0.1:8001 \\
        --full http://127.0.0.1:8002 --tasks calc-expr --out out/real-agent
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # no banner on import
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download on import

import httpx  # noqa: E402
import litellm  # noqa: E402
import yaml  # noqa: E402
from minisweagent import __version__ as MINI_VERSION  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_path  # noqa: E402
from minisweagent.exceptions import LimitsExceeded, Submitted  # noqa: E402
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # noqa: E402

from agentspec.agents.tasks import Task, TaskError, list_tasks, load_task  # noqa: E402
from agentspec.agents.tools import copy_repo  # noqa: E402

litellm.suppress_debug_info = True

AGENT = "mini-swe-agent"
CONFIG = "mini_textbased"  # the agent's own config for models without tool calls
SANDBOX_DIR = "/tmp/task"  # where the copy of the repository appears in the sandbox
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's end-of-task line
METHODS = ("plain", "full")
COUNTERS = ("generated_tokens", "steps", "draft_tokens", "accepted_tokens", "sessions")


class DriverError(Exception):
    """Bad input or an unreachable server: one line for the user."""


# ---------------------------------------------------------------------------- sandbox


class Sandbox:
    """mini-swe-agent environment: each command runs in bubblewrap on a copy of the repo."""

    def __init__(self, copy: Path, *, timeout: float = 60, env: dict[str, str] | None = None):
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise DriverError("bubblewrap (bwrap) is not installed: run scripts/setup.sh as "
                              "root, or apt-get install bubblewrap")
        self.copy = Path(copy).resolve()
        self.timeout = timeout
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        self.env = {"PATH": path, "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb",
                    "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                    **(env or {})}
        self.config = {"cwd": SANDBOX_DIR, "timeout": timeout, "env": self.env}
        # the sandbox's /tmp is empty: a checkout or Python living under /tmp stays visible,
        # read-only, so its tools (the venv's python) still run there
        here = [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(),
                Path(sys.base_prefix).resolve()]
        self.keep = sorted({str(d) for d in here if d.is_relative_to("/tmp")})

    def argv(self, command: str, cwd: str = "") -> list[str]:
        args = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", *[a for d in self.keep for a in ("--ro-bind", d, d)],
                "--bind", str(self.copy), SANDBOX_DIR,
                "--chdir", cwd or SANDBOX_DIR, "--unshare-all", "--hostname", "sandbox",
                "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        return args + ["bash", "-c", command]

    def run(self, command: str, cwd: str = "", timeout: float | None = None) -> dict:
        """{"output", "returncode", "exception_info"} of one command; stopped at its timeout."""
        timeout = timeout or self.timeout
        proc = subprocess.Popen(self.argv(command, cwd), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap dies, and the sandbox with it
            out, _ = proc.communicate()
            return {"output": out.decode("utf-8", "replace"), "returncode": -1,
                    "exception_info": f"the command did not finish in {timeout:g} s and "
                                      "was stopped"}
        return {"output": out.decode("utf-8", "replace"), "returncode": proc.returncode,
                "exception_info": ""}

    # the mini-swe-agent Environment interface

    def execute(self, action: dict, cwd: str = "", *, timeout: float | None = None) -> dict:
        result = self.run(action.get("command", ""), cwd, timeout)
        first, _, rest = result["output"].lstrip().partition("\n")
        if first.strip() == SUBMIT and result["returncode"] == 0:
            raise Submitted({"role": "exit", "content": rest,
                             "extra": {"exit_status": "Submitted", "submission": rest}})
        return result

    def get_template_vars(self, **kwargs) -> dict:
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": self.config,
                                    "environment_type": "agentspec.agents.mini_swe.Sandbox"}}}


# ---------------------------------------------------------------------------- servers


@dataclass
class Server:
    method: str
    url: str
    model: str = ""  # the served name, from /v1/models

    def connect(self) -> "Server":
        try:
            httpx.get(self.url + "/health", timeout=10).raise_for_status()
            self.model = self.model or httpx.get(self.url + "/v1/models",
                                                 timeout=10).json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise DriverError(f"no agentspec server answers at {self.url} "
                              f"({type(e).__name__}: {e})") from None
        return self

    def counters(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                  if line and not line.startswith("#")}
        return {c: values[f"agentspec_{c}_total"] for c in COUNTERS
                if f"agentspec_{c}_total" in values}


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


# ---------------------------------------------------------------------------- the model


class ComparedModel(LitellmTextbasedModel):
    """mini-swe-agent's litellm model, every call answered by both servers and compared."""

    abort_exceptions = [BaseException]  # no retries: a failed call ends the task

    def __init__(self, servers: dict[str, Server], task: str, max_tokens: int,
                 call_timeout: float = 900, **kwargs):
        super().__init__(model_name=f"openai/{servers['full'].model}",
                         cost_tracking="ignore_errors", **kwargs)
        self.servers, self.task = servers, task
        self.max_tokens, self.call_timeout = max_tokens, call_timeout
        self.calls: list[dict] = []  # the per-call log

    def _query(self, messages: list[dict], **kwargs):
        index = len(self.calls)
        order = METHODS if index % 2 == 0 else METHODS[::-1]  # the methods take turns first
        responses, record = {}, {"task": self.task, "call": index}
        for method in order:
            server = self.servers[method]
            before = server.counters()
            t0 = time.perf_counter()
            try:
                response = litellm.completion(
                    model=f"openai/{server.model}", messages=messages, api_base=server.url + "/v1",
                    api_key="-", timeout=self.call_timeout,
                    **{**self.config.model_kwargs, **kwargs, "temperature": 0,
                       "max_tokens": self.max_tokens})
            except litellm.BadRequestError as e:
                if "context" not in str(e):
                    raise
                raise LimitsExceeded({"role": "exit", "content": "ContextFull",
                                      "extra": {"exit_status": "ContextFull",
                                                "submission": ""}}) from None
            seconds = time.perf_counter() - t0
            d = delta(server.counters(), before)
            responses[method] = response
            record[method] = {"tokens": response.usage.completion_tokens,
                              "seconds": round(seconds, 4),
                              "al": round(d["generated_tokens"] / max(d["steps"], 1), 4), **d}
        texts = {m: r.choices[0].message.content or "" for m, r in responses.items()}
        record["identical"] = texts["full"] == texts["plain"]
        record["finish_reason"] = responses["full"].choices[0].finish_reason
        self.calls.append(record)
        return responses["full"]


# ---------------------------------------------------------------------------- one task


def agent_config() -> dict:
    """mini-swe-agent's own text-based config: its agent, environment and model sections."""
    return yaml.safe_load(get_config_path(CONFIG).read_text())


def tests_pass(task: Task, sandbox: Sandbox) -> bool:
    """The task's tests, restored to their original text, pass on the agent's copy."""
    sources = set(task.source_files())
    for rel, text in task.files().items():
        if rel not in sources:
            (sandbox.copy / rel).parent.mkdir(parents=True, exist_ok=True)
            (sandbox.copy / rel).write_text(text)
    result = sandbox.run("python -m pytest -q -x -p no:cacheprovider", timeout=task.timeout)
    return result["returncode"] == 0


@dataclass
class TaskRun:
    task: str
    solved: bool
    steps: int
    error: str | None
    exit_status: str
    seconds: float
    sessions: dict[str, float] | None  # sessions each server started (when it counts them)
    calls: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        out = {"task": self.task, "solved": self.solved, "steps": self.steps,
               "error": self.error, "exit_status": self.exit_status,
               "seconds": round(self.seconds, 1),
               "identical": all(c["identical"] for c in self.calls)}
        if self.sessions is not None:
            out["sessions"] = self.sessions
        return out


def run_task(task: Task, servers: dict[str, Server], out: Path, *, steps: int = 10,
             max_tokens: int = 256, command_timeout: float = 60) -> TaskRun:
    """mini-swe-agent on one task, until it submits or spends `steps` model calls."""
    config = agent_config()
    agent_kw = {k: v for k, v in config["agent"].items() if k != "mode"}
    agent_kw.update(step_limit=steps, cost_limit=0, max_consecutive_format_errors=0,
                    output_path=out / "trajectories" / f"{task.name}.traj.json")
    t0 = time.perf_counter()
    before = {m: s.counters() for m, s in servers.items()}
    with tempfile.TemporaryDirectory(prefix=f"agentspec-mini-{task.name}-") as tmp:
        sandbox = Sandbox(copy_repo(task.repo, Path(tmp) / "repo"), timeout=command_timeout,
                          env=config["environment"]["env"])
        model = ComparedModel(servers, task.name, max_tokens, **config["model"])
        agent = DefaultAgent(model, sandbox, **agent_kw)
        error = None
        try:
            exit_status = agent.run(task.issue).get("exit_status", "")
        except Exception as e:  # noqa: BLE001 - the task's error, reported in its summary
            exit_status, error = type(e).__name__, f"{type(e).__name__}: {e}".splitlines()[0]
        solved = tests_pass(task, sandbox)
    sessions = None
    if all("sessions" in before[m] for m in servers):
        sessions = {m: delta(s.counters(), before[m])["sessions"] for m, s in servers.items()}
    return TaskRun(task.name, solved, len(model.calls), error, exit_status,
                   time.perf_counter() - t0, sessions, model.calls)


# ---------------------------------------------------------------------------- summary


def method_entry(calls: list[dict], method: str, plain: dict | None) -> dict:
    total = {k: sum(c[method].get(k, 0) for c in calls)
             for k in ("tokens", "seconds", *COUNTERS)}
    generated, steps = total["generated_tokens"], max(total["steps"], 1)
    rejected = total["draft_tokens"] - total["accepted_tokens"]
    entry = {"al": round(generated / steps, 4),
             "rejected_per_token": round(rejected / max(generated, 1), 4),
             "draft_per_step": round(total["draft_tokens"] / steps, 4),
             "steps": int(total["steps"]), "output_tokens": int(total["tokens"]),
             "calls": len(calls), "seconds": round(total["seconds"], 3),
             "tokens_per_s": round(total["tokens"] / max(total["seconds"], 1e-9), 3),
             "rejected": int(rejected)}
    entry["speedup"] = round(entry["tokens_per_s"] / plain["tokens_per_s"], 4) if plain else 1.0
    mismatches = [f"{c['task']}#{c['call']}" for c in calls if not c["identical"]]
    entry["identical_to_plain"] = method == "plain" or not mismatches
    entry["mismatches"] = [] if method == "plain" else mismatches
    return entry


def summarize(runs: list[TaskRun], servers: dict[str, Server], *, steps: int,
              max_tokens: int) -> dict:
    calls = [c for r in runs for c in r.calls]
    plain = method_entry(calls, "plain", None)
    return {"format": "agentspec.agent/1", "agent": f"{AGENT} {MINI_VERSION}",
            "backend": "agentspec serve", "model": servers["full"].model, "method": "full",
            "max_steps": steps, "max_tokens": max_tokens,
            "servers": {m: s.url for m, s in servers.items()},
            "tasks": [r.summary() for r in runs],
            "methods": {"plain": plain, "full": method_entry(calls, "full", plain)}}


def pick_tasks(names: str | None, default: int = 3) -> list[Task]:
    """Tasks by comma-separated names; by default the first `default` evaluation tasks."""
    if not names:
        return list_tasks("eval")[:default]
    try:
        return [load_task(n.strip()) for n in names.split(",") if n.strip()]
    except TaskError as e:
        raise DriverError(str(e)) from None


def run(tasks: list[Task], servers: dict[str, Server], out: Path, *, steps: int = 10,
        max_tokens: int = 256, command_timeout: float = 60, say=print) -> dict:
    """Every task in turn; writes OUT/calls.jsonl and OUT/summary.json, returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    with (out / "calls.jsonl").open("w") as log:
        for task in tasks:
            say(f"[{AGENT}] {task.name}: up to {steps} steps")
            r = run_task(task, servers, out, steps=steps, max_tokens=max_tokens,
                         command_timeout=command_timeout)
            for c in r.calls:
                log.write(json.dumps(c) + "\n")
                say(f"  call {c['call']}: {c['full']['tokens']} tokens, plain "
                    f"{c['plain']['seconds']:.1f} s, full {c['full']['seconds']:.1f} s "
                    f"(AL {c['full']['al']:.2f}), identical {c['identical']}")
            log.flush()
            say(f"[{AGENT}] {task.name}: {r.exit_status} after {r.steps} steps, solved "
                f"{r.solved}, {r.seconds:.0f} s" + (f", error {r.error}" if r.error else ""))
            runs.append(r)
    summary = summarize(runs, servers, steps=steps, max_tokens=max_tokens)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plain", required=True, help="URL of an `agentspec serve --method plain`")
    p.add_argument("--full", required=True, help="URL of an `agentspec serve --method full`")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tasks", default="", help="comma-separated task names "
                   "(default: the first 3 evaluation tasks)")
    p.add_argument("--steps", type=int, default=10, help="model calls per task at most")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per answer at most")
    p.add_argument("--command-timeout", type=float, default=60, help="seconds per command")
    args = p.parse_args(argv)
    try:
        tasks = pick_tasks(args.tasks)
        servers = {"plain": Server("plain", args.plain.rstrip("/")).connect(),
                   "full": Server("full", args.full.rstrip("/")).connect()}
        s = run(tasks, servers, args.out, steps=args.steps, max_tokens=args.max_tokens,
                command_timeout=args.command_timeout, say=lambda m: print(m, flush=True))
    except DriverError as e:
        sys.exit(f"error: {e}")
    for m, e in s["methods"].items():
        print(f"{m}: {e['tokens_per_s']} tokens/s, speedup {e['speedup']}, AL {e['al']}, "
              f"identical {e['identical_to_plain']}")


if __name__ == "__main__":
    main()
