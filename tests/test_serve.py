"""`agentspec serve`: real server subprocesses on loopback ports, driven by the openai client.

A `full` server and a `plain` server run the tiny random llama of conftest; every answer of
`full` (alone, streamed, or 4 clients at once) must equal `plain`'s sequential answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

MODEL = "m"  # the name the tests serve the tiny model under (--model is a folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, folder: Path, method: str, home: Path, *extra: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = home / f"serve-{method}-{self.port}.log"
        cmd = [str(Path(sys.executable).parent / "agentspec"), "serve", "--model", str(folder),
               "--method", method, "--port", str(self.port), "--max-batch", "4", *extra]
        env = dict(os.environ, AGENTSPEC_HOME=str(home))
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     env=env)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            self.stop()
            raise AssertionError(f"server did not start: {self.log.read_text()}")
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="-", max_retries=0,
                                    timeout=120)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics", timeout=10).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def chat(self, messages, **kw) -> str:
        r = self.client.chat.completions.create(model=MODEL, messages=messages, **kw)
        return r.choices[0].message.content

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-home")


def served_folder(model_folder: Path, home: Path) -> Path:
    """The model folder under the name clients call it by (the folder's name)."""
    link = home / MODEL
    if not link.exists():
        link.symlink_to(model_folder, target_is_directory=True)
    return link


@pytest.fixture(scope="module")
def servers(model_folder, home):
    served = {}
    try:
        link = served_folder(model_folder, home)
        for method in ("full", "plain"):
            served[method] = Server(link, method, home)
        yield served
    finally:
        for s in served.values():
            s.stop()


def chat_of(i: int, turns: int = 1) -> list[dict]:
    msgs = [{"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": f"Fix src/calc.py, case {i}:\ndef add(a, b):\n"
                                        "    return a - b\n"}]
    for t in range(1, turns):
        msgs += [{"role": "assistant", "content": "--- a/src/calc.py\n+++ b/src/calc.py\n"},
                 {"role": "user", "content": f"The test failed ({t}): assert add(1, 2) == 3"}]
    return msgs


GREEDY = {"temperature": 0, "max_tokens": 24}


def test_models_health_and_a_first_cost_profile(servers, home):
    full = servers["full"]
    assert MODEL in [m.id for m in full.client.models.list().data]
    assert "measuring one" in full.log.read_text()  # first use measured this machine's profile
    assert list((home / "profiles").glob("*.json"))


def test_whole_and_streamed_answers_equal_plain(servers):
    full, plain = servers["full"], servers["plain"]
    for i in range(2):
        want = plain.chat(chat_of(i), **GREEDY)
        assert full.chat(chat_of(i), **GREEDY) == want
        stream = full.client.chat.completions.create(
            model=MODEL, messages=chat_of(i), stream=True,
            stream_options={"include_usage": True}, **GREEDY)
        pieces, usage, finish = [], None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
                finish = c.finish_reason or finish
        assert "".join(pieces) == want
        assert finish in ("stop", "length") and usage.completion_tokens <= 24
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_four_concurrent_clients_equal_plain_sequential(servers):
    full, plain = servers["full"], servers["plain"]
    convs = [chat_of(10 + i, turns=1 + i % 3) for i in range(4)]
    want = [plain.chat(c, **GREEDY) for c in convs]
    got = [None] * 4
    before = full.metrics()

    def ask(i):
        got[i] = full.chat(convs[i], **GREEDY)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == want
    after = full.metrics()
    batched = sum(v for k, v in after.items() if k.startswith("agentspec_batch_size_steps_total")
                  and 'size="1"' not in k) - sum(
        v for k, v in before.items() if k.startswith("agentspec_batch_size_steps_total")
        and 'size="1"' not in k)
    assert batched > 0  # some steps verified several rows at once


def test_seeded_sampling_equals_plain(servers):
    full, plain = servers["full"], servers["plain"]
    kw = {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_tokens": 20}
    assert full.chat(chat_of(3), **kw) == plain.chat(chat_of(3), **kw)


def test_completions_and_stop_strings(servers):
    full, plain = servers["full"], servers["plain"]
    prompt = "def add(a, b):\n    return a"
    a = full.client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    b = plain.client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    assert a.choices[0].text == b.choices[0].text
    text = b.choices[0].text
    if len(text) > 4:
        stop = text[2:4]
        cut = full.client.completions.create(model=MODEL, prompt=prompt, stop=[stop], **GREEDY)
        assert cut.choices[0].text == text[:text.find(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_prompt_cache_reuse(servers):
    full = servers["full"]
    before = full.metrics()
    first = full.chat(chat_of(20, turns=2), **GREEDY)
    longer = chat_of(20, turns=2) + [{"role": "assistant", "content": first},
                                     {"role": "user", "content": "Again, please."}]
    full.chat(longer, **GREEDY)
    after = full.metrics()
    assert after["agentspec_prompt_cache_hits_total"] > before["agentspec_prompt_cache_hits_total"]
    assert after["agentspec_prompt_cache_hit_tokens_total"] - \
        before["agentspec_prompt_cache_hit_tokens_total"] > 40
    assert after["agentspec_time_to_first_token_seconds_count"] > 0


BAD = [
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 5}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "'n' > 1"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": 3}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "seed": "x"}, 400, "seed"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     400, "does not support tools"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "nope"}, 404, "not served"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "context is 8192"),
]


@pytest.mark.parametrize("body,status,says", BAD)
def test_bad_input_is_one_openai_error_and_the_server_keeps_serving(servers, body, status,
                                                                    says):
    full = servers["full"]
    r = httpx.post(full.base + "/v1/chat/completions", json={"model": MODEL, **body},
                   timeout=30)
    assert r.status_code == status
    error = r.json()["error"]
    assert says in error["message"] and "Traceback" not in r.text
    assert set(error) >= {"message", "type", "param", "code"}
    assert full.chat(chat_of(0), **GREEDY)


def test_malformed_json_and_the_openai_client_errors(servers):
    full = servers["full"]
    r = httpx.post(full.base + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        full.client.chat.completions.create(model="nope", messages=chat_of(0))
    with pytest.raises(openai.BadRequestError, match="context"):
        full.client.completions.create(model=MODEL, prompt="word " * 9000)


def test_a_client_that_drops_mid_stream_does_not_stop_the_server(servers):
    full = servers["full"]
    body = {"model": MODEL, "messages": chat_of(30), "stream": True, "temperature": 0,
            "max_tokens": 400}
    with httpx.stream("POST", full.base + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(3)]
    assert got[0].startswith("data: ")
    assert full.chat(chat_of(1), **GREEDY) == servers["plain"].chat(chat_of(1), **GREEDY)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the dropped row leaves the batch
        if json.loads(httpx.get(full.base + "/health", timeout=5).text)["status"] == "ok":
            break
    assert full.proc.poll() is None


def test_metrics_count_drafts(servers):
    m = servers["full"].metrics()
    assert m["agentspec_requests_total"] >= 10
    assert m["agentspec_generated_tokens_total"] > 0 and m["agentspec_steps_total"] > 0
    assert "agentspec_accepted_tokens_total" in m and m["agentspec_draft_tokens_total"] >= 0


def test_sessions_are_inferred_one_per_conversation(servers):
    before = servers["full"].metrics()["agentspec_sessions_total"]
    for i in (7, 8):
        for turns in (1, 2, 3):  # each call re-sends the conversation so far
            servers["full"].chat(chat_of(i, turns), **GREEDY)
    assert servers["full"].metrics()["agentspec_sessions_total"] - before == 2


def test_what_full_learned_is_kept_across_restarts(model_folder, home, tmp_path):
    """A server saves its drafter's state as it stops and the next run takes it back (G
    holds the outputs of both runs); a state file it cannot take stops it in one line and
    is left as it was."""
    import numpy as np

    folder, state = served_folder(model_folder, home), tmp_path / "full.npz"
    for run, asks in enumerate((2, 1)):
        server = Server(folder, "full", home, "--state", str(state))
        try:
            answers = [server.chat(chat_of(40 + run * 2 + i), **GREEDY) for i in range(asks)]
        finally:
            server.stop()
        assert all(answers)
        said = server.log.read_text()
        assert ("resumed what full learned, from" if run else "keeping what full learns in") \
            in said, said
        with np.load(state) as z:
            assert len(z["g/lengths"]) == 2 + run  # every output served so far
    state.write_bytes(b"garbage")
    cmd = [str(Path(sys.executable).parent / "agentspec"), "serve", "--model", str(folder),
           "--port", str(free_port()), "--state", str(state)]
    for run_home in (home, tmp_path / "no-profile-yet"):  # (fails before measuring one)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, AGENTSPEC_HOME=str(run_home)))
        said = done.stdout + done.stderr
        assert done.returncode != 0
        assert f"state {state}: not a readable state file" in said and "measuring" not in said
        assert state.read_bytes() == b"garbage"


def test_bench_over_http_replays_a_trace_against_full_and_plain(servers, model_folder,
                                                                 tmp_path):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}") for i in range(3)])
    out = tmp_path / "http.json"
    r = CliRunner().invoke(app, [
        "bench", "--backend", "http", "--url", servers["full"].base, "--plain-url",
        servers["plain"].base, "--traces", str(trace), "--no-split", "--batch", "1,2",
        "--max-tokens", "16", "--model", str(model_folder), "--json", str(out)])
    assert r.exit_code == 0, r.output
    for b in (1, 2):
        report = json.loads(out.with_suffix(f".b{b}.json").read_text())
        assert report["backend"] == "http" and report["batch"] == b and report["calls"] > 0
        full, plain = report["methods"]["server"], report["methods"]["plain"]
        assert full["identical_to_plain"] and full["output_tokens"] == plain["output_tokens"] > 0
        assert full["speedup"] > 0 and full["ttft_s"]["mean"] > 0
        assert full["decode_tokens_per_s"] > 0 and full["decode_speedup"] > 0
        assert full["al"] >= 1.0 and plain["al"] == 1.0  # both publish agentspec counters
    r = CliRunner().invoke(app, ["bench", "--backend", "http", "--url", servers["full"].base,
                                 "--traces", str(trace)])
    assert r.exit_code == 2 and "give both" in r.output
    r = CliRunner().invoke(app, ["bench", "--backend", "http", "--url", "http://127.0.0.1:9",
                                 "--plain-url", "http://127.0.0.1:9", "--traces", str(trace),
                                 "--no-split", "--model", str(model_folder)])
    assert r.exit_code == 2 and "is not an OpenAI-compatible server" in r.output


def test_the_built_in_agent_runs_against_a_server(servers, model_folder, tmp_path):
    from typer.testing import CliRunner

    from agentspec.agents.tasks import list_tasks
    from agentspec.cli import app

    task = list_tasks("eval")[0].name
    r = CliRunner().invoke(app, [
        "run-agent", "--task", task, "--url", servers["full"].base, "--plain-url",
        servers["plain"].base, "--max-turns", "1", "--max-tokens", "12", "--model",
        str(model_folder), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["backend"] == "http" and summary["tasks"][0]["error"] is None
    full, plain = summary["methods"]["server"], summary["methods"]["plain"]
    assert full["identical_to_plain"] and full["output_tokens"] == plain["output_tokens"] > 0
    assert full["al"] >= 1.0 and full["speedup"] > 0 and "code" in full["by_role"]


class Chars:
    """A tokenizer whose ids are characters; 0 is half of a two-byte character."""

    def decode(self, ids):
        text = "".join(chr(i) if i else "\ufffd" for i in ids)
        return text.replace("\ufffd" + chr(1), "é")


def test_http_bench_separates_the_decode_rate_from_the_prefill():
    from agentspec.backends.http_bench import Reply, ServerRun, method_entry

    # each call: 11 tokens; plain waits 2 s for its first token then 10 tokens in 5 s, full
    # waits as long and writes the 10 in 2 s
    plain = ServerRun({"a": Reply("x" * 11, 11, 7.0, 2.0), "b": Reply("y", 11, 7.0, 2.0)}, 14.0)
    full = ServerRun({"a": Reply("x" * 11, 11, 4.0, 2.0), "b": Reply("y", 11, 4.0, 2.0)}, 8.0)
    e = method_entry(full, plain, {"a": "code", "b": "code"}, len)
    assert e["decode_tokens_per_s"] == 5.0 and e["decode_speedup"] == 2.5
    assert e["speedup"] == 1.75 and e["identical_to_plain"]  # wall time counts the prefill


def test_text_stream_holds_back_partial_characters_and_stop_strings():
    from agentspec.backends.openai_server import TextStream

    t = TextStream(Chars(), ["END"])
    assert t.add([ord("a"), 0]) == "a"  # the half character waits
    assert t.add([1, ord("E")]) == "é"  # "E" may start the stop string
    assert t.add([ord("x")]) == "Ex" and not t.stopped
    assert t.add([ord("E"), ord("N"), ord("D"), ord("z")]) == "" and t.stopped
    assert t.text == "aéEx"
    t = TextStream(Chars(), [])
    assert t.add([ord("E")]) == "E" and t.rest() == ""
