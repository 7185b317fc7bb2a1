"""agentspec's vLLM drafter, bench and cost probe (`agentspec.backends.vllm_*`).

Fast tests drive `AgentspecProposer` with a fake runner and the bench's bookkeeping, without
vLLM. The `vllm` tests need the Python of a separate vLLM environment ($AGENTSPEC_VLLM_PYTHON,
default .venv-vllm/bin/python, made by scripts/setup.sh). One runs this file as a script
there: the same prompts with plain greedy decoding and with the proposer, each in its own
process, on the embedded model; the outputs must be equal and vLLM's spec-decode counters
must show accepted drafts. The others run `agentspec bench --backend vllm` and
`agentspec profile-lambda --backend vllm` on small settings.

    .venv-vllm/bin/python tests/test_vllm.py            # both runs, compare
    .venv-vllm/bin/python tests/test_vllm.py agentspec  # one run, one JSON line
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VLLM_PYTHON = os.environ.get("AGENTSPEC_VLLM_PYTHON", str(Path(__file__).resolve().parents[1]
                                                          / ".venv-vllm" / "bin" / "python"))
PROPOSER = "agentspec.backends.vllm_drafter.AgentspecProposer"
CODE = "def add(a, b):\n    return a + b\n\n"
PROMPTS = [
    (CODE * 3 + "def add(a, b):\n", {"agentspec_session": "s1", "agentspec_role": "code",
                                      "agentspec_structure": '[["```", "```"]]'}),
    ("1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,", {"agentspec_session": "s1"}),
    ("def sub(a, b):\n    return a - b\n\nRepeat the code above exactly:\n",
     {"agentspec_structure": "not json", "agentspec_role": ["bad"]}),  # warnings only
    ("The quick brown fox jumps over the lazy dog. " * 3, None),
]


def _model() -> str:
    from agentspec.models import DEFAULT_MODEL, models_dir

    return os.environ.get("AGENTSPEC_VLLM_MODEL") or str(models_dir() / DEFAULT_MODEL)


def _run(mode: str) -> dict:
    """Generate PROMPTS greedily with vLLM on the CPU, plain or with the proposer; "unhooked":
    start an engine with the proposer in this process after removing a runner method it
    hooks, which must fail at start."""
    from vllm import LLM, SamplingParams

    spec = None
    if mode == "unhooked":
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine runs in this process
        del GPUModelRunner._on_request_state_removed
    if mode in ("agentspec", "unhooked"):
        spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8}
    # gpu_memory_utilization is the share of RAM on CPU; 0.1 left no room for the KV cache
    try:
        llm = LLM(model=_model(), dtype="float32", max_model_len=1024,
                  gpu_memory_utilization=0.3, enforce_eager=True, disable_log_stats=False,
                  speculative_config=spec)
    except Exception as e:  # noqa: BLE001 - the unhooked run reports what stopped it
        return {"mode": mode, "error": f"{type(e).__name__}: {e}"}
    params = [SamplingParams(temperature=0.0, max_tokens=64, extra_args=x) for _, x in PROMPTS]
    t0 = time.time()
    outs = llm.generate([p for p, _ in PROMPTS], params)
    counters = {m.name: getattr(m, "values", None) or getattr(m, "value", None)
                for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    return {"mode": mode, "gen_s": round(time.time() - t0, 2),
            "outputs": [list(o.outputs[0].token_ids) for o in outs], "counters": counters}


def _check(python: str = sys.executable) -> tuple[dict, str]:
    """Run both modes in subprocesses; returns ({check: passed}, a readable log)."""
    stats_file = tempfile.mktemp(suffix=".json")
    results, log = {}, []
    for mode in ("plain", "agentspec"):
        env = dict(os.environ, AGENTSPEC_VLLM_STATS=stats_file)
        # the two environments' numba versions differ: keep their caches apart
        env.setdefault("NUMBA_CACHE_DIR", str(Path(python).parent.parent / "numba-cache"))
        p = subprocess.run([python, __file__, mode], env=env, capture_output=True, text=True,
                           timeout=900)
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode or not lines:
            return {f"{mode} run": False}, p.stdout[-3000:] + p.stderr[-6000:]
        results[mode] = json.loads(lines[-1])
        results[mode]["warnings"] = [line for line in p.stderr.splitlines()
                                     if "agentspec:" in line]
    plain, spec = results["plain"], results["agentspec"]
    stats = json.loads(Path(stats_file).read_text()) if os.path.exists(stats_file) else {}
    Path(stats_file).unlink(missing_ok=True)
    c = spec["counters"]
    log += [f"gen_s plain {plain['gen_s']} agentspec {spec['gen_s']}", f"counters {c}",
            f"drafter stats {stats}", *spec["warnings"]]
    checks = {
        "outputs equal plain greedy": plain["outputs"] == spec["outputs"],
        "drafter proposed": (c.get("vllm:spec_decode_num_drafts") or 0) > 0,
        "drafts accepted": (c.get("vllm:spec_decode_num_accepted_tokens") or 0) > 0,
        "drafter saw every request finish": stats.get("finished") == len(PROMPTS),
        "drafter's accepted count is vLLM's":
            stats.get("accepted") == c.get("vllm:spec_decode_num_accepted_tokens"),
        "bad metadata warned": len(spec["warnings"]) >= 2,
    }
    log += [("PASS " if ok else "FAIL ") + name for name, ok in checks.items()]
    return checks, "\n".join(log)


# Run as a script in the vLLM environment. vLLM's spawned workers import this file again
# (as __mp_main__) and run the rest of it: it must not import numba (agentspec.policy) at the
# top, because vLLM's CPU kernel registration then fails on llvmlite's objects.
if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(_run(sys.argv[1])), flush=True)
        sys.exit(0)
    passed, text = _check()
    print(text)
    sys.exit(0 if all(passed.values()) else 1)


from types import SimpleNamespace as NS  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import CORPUS  # noqa: E402

A = list(range(5, 17))


def _proposer(k: int = 4, max_model_len: int = 200, tokenizer: Path | None = None):
    from agentspec.backends.vllm_drafter import AgentspecProposer

    config = NS(speculative_config=NS(num_speculative_tokens=k),
                model_config=NS(max_model_len=max_model_len, tokenizer=tokenizer, model=None))
    return AgentspecProposer(config)


class FakeRunner:
    """What the proposer reads of vLLM's model runner: batch order, prompts, extra_args."""

    def __init__(self):
        self.input_batch = NS(req_ids=[])
        self.requests = {}
        self.tokens: dict[str, list[int]] = {}

    def add(self, rid: str, prompt: list[int], extra_args: dict | None = None,
            max_tokens: int = 16):
        self.input_batch.req_ids.append(rid)
        self.requests[rid] = NS(prompt_token_ids=prompt, output_token_ids=[],
                                sampling_params=NS(extra_args=extra_args,
                                                   max_tokens=max_tokens))
        self.tokens[rid] = list(prompt)

    def step(self, p, sampled: dict[str, list[int]], scheduled: dict, prefill: int = 0):
        """Append this step's tokens, then ask for drafts as vLLM does. `prefill`: prompt
        tokens the step also computed (a prefill chunk beside the decoding rows)."""
        rows = self.input_batch.req_ids
        p.bind(self, NS(scheduled_spec_decode_tokens=scheduled,
                        num_scheduled_tokens={rid: 1 for rid in rows},
                        total_num_scheduled_tokens=len(rows) + prefill + sum(
                            len(d) for d in scheduled.values())))
        rows = []
        for rid in self.input_batch.req_ids:
            self.tokens[rid] += sampled.get(rid, [])
            self.requests[rid].output_token_ids = self.tokens[rid][
                len(self.requests[rid].prompt_token_ids):]
            rows.append(self.tokens[rid])
        width = max(len(r) for r in rows) + 1
        table = np.zeros((len(rows), width), dtype=np.int32)
        for i, r in enumerate(rows):
            table[i, :len(r)] = r
        drafts = p.propose([sampled.get(rid, []) for rid in self.input_batch.req_ids],
                           np.array([len(r) for r in rows]), table)
        return dict(zip(self.input_batch.req_ids, drafts))


def test_request_meta_reads_flat_keys():
    from agentspec.backends.vllm_drafter import request_meta

    fields, problems = request_meta("r1", {
        "agentspec_session": "s", "agentspec_agent": "a", "agentspec_query": 7,
        "agentspec_role": "code", "agentspec_structure": '[["```", "```"]]', "other": 1})
    assert problems == []
    assert fields == {
        "session": "s", "agent": "a", "query": "7", "role": "code",
        "structure": (("```", "```"),)}


def test_request_meta_bad_values_only_warn():
    from agentspec.backends.vllm_drafter import request_meta

    fields, problems = request_meta("r1", {"agentspec_role": ["x"], "agentspec_session": "",
                                           "agentspec_structure": "[[1]]",
                                           "agentspec_agent": "ok"})
    assert len(problems) == 3 and all(p.startswith("request r1: agentspec_") for p in problems)
    assert fields["role"] == "agent" and fields["structure"] == ()
    assert fields["session"] == "" and fields["agent"] == "ok"  # "": inferred on start
    assert request_meta("r2", None)[0]["session"] == ""


def test_proposer_drafts_observes_and_finishes():
    from agentspec.backends.vllm_drafter import VllmContractError

    p = _proposer(k=4)
    p.load_model(None)  # the warm-up request leaves nothing behind
    assert not p.policy.sessions and not p.policy.running and not len(p.policy.g)
    runner = FakeRunner()
    prompt = A + A + A[:3]
    runner.add("r1", prompt, {"agentspec_session": "s"})
    runner.add("r2", [1, 2, 3], {"agentspec_structure": "not json"})
    with pytest.raises(VllmContractError, match="never went through propose_draft_token_ids"):
        p.propose([[1]], np.array([1]), np.zeros((1, 2), dtype=np.int32))  # hooks not in place
    drafts = runner.step(p, {"r1": [A[3]], "r2": []}, {})  # r2: still a prefill chunk
    assert drafts["r1"] == A[4:8] and drafts["r2"] == []
    assert p.stats["started"] == 1 and p.requests["r1"].session == "s"
    # vLLM verified 4 drafted tokens, accepted 2, and sampled one more
    runner.step(p, {"r1": [A[4], A[5], 99], "r2": [50]}, {"r1": drafts["r1"]})
    assert p.stats["accepted"] == 2
    assert p.requests["r1"].tokens == runner.tokens["r1"]
    r2_session = p.requests["r2"].session
    assert r2_session.startswith("inferred:") and p.requests["r2"].structure == ()
    p.finish("r1", runner.requests["r1"])
    p.finish("r2", runner.requests["r2"])
    assert p.stats["finished"] == 2 and not p.requests
    assert {"s", r2_session} <= set(p.policy.sessions) and p.stats["sessions"] == 2


def test_a_vllm_outside_the_tested_range_or_without_a_hook_stops_with_its_name():
    from agentspec.backends.vllm_drafter import (RUNNER_HOOKS, VllmContractError, check_vllm,
                                                 tested_vllm)

    wanted = tested_vllm()  # pyproject's `vllm` extra, as installed
    assert wanted and "<" in wanted and ">=" in wanted
    low = wanted.split(">=")[1].split(",")[0]
    runner = type("GPUModelRunner", (), {h: lambda self: None for h in RUNNER_HOOKS})
    check_vllm(low, runner)  # in range, hooks in place
    with pytest.raises(VllmContractError, match=r"vLLM 0\.1\.0 is not a version .* tested"):
        check_vllm("0.1.0", runner)
    with pytest.raises(VllmContractError, match=r"vLLM 99\.0 is not"):
        check_vllm("99.0", runner)
    del runner._on_request_state_removed
    with pytest.raises(VllmContractError, match="GPUModelRunner has no _on_request_state_removed"):
        check_vllm(low, runner)


def test_drafts_respect_k_and_max_model_len():
    p = _proposer(k=3, max_model_len=len(A) * 2 + 6)
    runner = FakeRunner()
    runner.add("r", A + A[:3])
    assert len(runner.step(p, {"r": [A[3]]}, {})["r"]) == 3
    drafts = runner.step(p, {"r": [A[4]]}, {})  # one token from the limit: draft fits
    assert len(drafts["r"]) <= len(A) * 2 + 6 - len(runner.tokens["r"]) - 1


def test_no_draft_past_max_tokens():
    p = _proposer(k=8)
    runner = FakeRunner()
    runner.add("r", A + A[:3], max_tokens=3)
    assert runner.step(p, {"r": [A[3]]}, {})["r"] == A[4:5]  # 1 written, 2 to go: 1 draft
    assert runner.step(p, {"r": [A[4], A[5]]}, {"r": A[4:5]})["r"] == []  # 3 written


def test_decode_steps_teach_the_policy_what_drafts_cost():
    p = _proposer(k=4)
    seen = []
    p.policy.observe_step = lambda verified, seconds: seen.append((verified, seconds))
    runner = FakeRunner()
    runner.add("r", A + A[:3], max_tokens=100)
    drafts = runner.step(p, {"r": [A[3]]}, {})  # the first call: no step before it to time
    runner.step(p, {"r": [A[4], A[5]]}, {"r": drafts["r"]})
    runner.step(p, {"r": [A[6]]}, {}, prefill=50)  # a prompt joined: not a decode step
    assert [verified for verified, _ in seen] == [[4]]
    assert 0 < seen[0][1] < 5


def test_request_files_reads_a_json_object_of_texts():
    from agentspec.backends.vllm_drafter import request_files

    files = {"src/a.py": "x = 1\n", "b.txt": ""}
    assert request_files("r", {"agentspec_files": json.dumps(files)}) == (files, [])
    assert request_files("r", {}) == ({}, []) and request_files("r", None) == ({}, [])
    for bad in ("{not json", json.dumps(["a.py"]), json.dumps({"a.py": 3}), {"a.py": "x"}):
        files, problems = request_files("r", {"agentspec_files": bad})
        assert files == {} and problems[0].startswith("request r: agentspec_files ignored")


def test_opened_files_join_w_once_and_drafts_copy_them(tiny_model_dir):
    from agentspec.drafter import FILE

    p = _proposer(k=4, tokenizer=tiny_model_dir)
    registered = []
    register = p.policy.register
    p.policy.register = lambda sid, kind, tokens, path="": (
        registered.append((sid, kind, path)), register(sid, kind, tokens, path))
    text = CORPUS[2] + CORPUS[0] + CORPUS[1]
    f = p.encode(text)
    runner = FakeRunner()
    files = json.dumps({"src/calc.py": text})
    runner.add("r1", [1, 2, 3] + f[:6], {"agentspec_session": "s", "agentspec_files": files})
    runner.add("r2", [1, 2, 3] + f[:6], {"agentspec_session": "t"})  # no file: nothing to copy
    drafts = runner.step(p, {"r1": [f[6]], "r2": [f[6]]}, {})
    assert drafts["r1"] == f[7:11] and drafts["r2"] == []
    runner.add("r3", [4], {"agentspec_session": "s", "agentspec_files": files})  # seen: skip
    runner.add("r4", [4], {"agentspec_session": "s",
                           "agentspec_files": json.dumps({"src/calc.py": text + "#\n"})})
    runner.step(p, {"r3": [5], "r4": [5]}, {})
    assert [r for r in registered if r[1] == FILE] == [("s", FILE, "src/calc.py")] * 2


def test_sessions_past_the_limit_drop_the_least_recent_idle_one(monkeypatch):
    monkeypatch.setenv("AGENTSPEC_MAX_SESSIONS", "2")
    p = _proposer()
    runner = FakeRunner()

    def start(rid: str, session: str) -> None:
        runner.add(rid, A, {"agentspec_session": session})
        runner.step(p, {rid: [A[0]]}, {})

    start("a1", "a")
    start("b1", "b")
    p.finish("b1", runner.requests["b1"])
    start("c1", "c")  # three sessions: b is idle and older than c; a is still running
    assert set(p.policy.sessions) == {"a", "c"} and list(p.book.seen) == ["a", "c"]
    p.finish("a1", runner.requests["a1"])
    start("c2", "c")  # used again: now the most recent
    start("d1", "d")
    assert set(p.policy.sessions) == {"c", "d"} and set(p.book.seen) == {"c", "d"}


def test_the_rung_and_its_setup_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTSPEC_VLLM_METHOD", "session")
    assert _proposer().policy.name == "session"
    monkeypatch.setenv("AGENTSPEC_VLLM_METHOD", "nope")
    with pytest.raises(ValueError, match="'nope' is not an agentspec policy"):
        _proposer()
    monkeypatch.setenv("AGENTSPEC_VLLM_METHOD", "full")
    setup = tmp_path / "setup.json"
    setup.write_text(json.dumps({"lambda": 0.5, "global_seed": [A, A]}))
    monkeypatch.setenv("AGENTSPEC_VLLM_SETUP", str(setup))
    p = _proposer()
    assert p.policy.config.lam == 0.5 and len(p.policy.g) >= 2 * len(A)


# --- bench bookkeeping (no vLLM) --------------------------------------------------------
def _tokenized(tiny_model_dir, n: int = 2):
    from agentspec.tokens import ChatTokenizer, tokenize_sessions
    from agentspec.trace import parse_session
    from conftest import session_obj

    tok = ChatTokenizer.from_model(tiny_model_dir)
    return tokenize_sessions([parse_session(session_obj(f"s{i}")) for i in range(n)], tok)


def test_bench_jobs_carry_metadata_files_and_cut_prompts(tiny_model_dir):
    from agentspec.backends.vllm_bench import speculative_config
    from agentspec.bench import job_sessions
    from agentspec.backends.vllm_drafter import request_files, request_meta

    sessions = _tokenized(tiny_model_dir)
    jobs = job_sessions(sessions, max_prompt_tokens=10)
    assert [[c["key"] for c in calls] for calls in jobs] == [["s0#0", "s0#1"], ["s1#0", "s1#1"]]
    first, second = jobs[0]
    assert first["prompt"] == sessions[0].calls[0].prompt.tolist()[-10:]
    fields, problems = request_meta("r", first["xargs"])
    assert problems == [] and fields["session"] == "s0" and fields["role"] == "code"
    assert fields["structure"] == (("```diff", "```"),) and fields["agent"] == "test"
    assert request_files("r", first["xargs"])[0] == {"src/calc.py": CORPUS[0]}
    assert "agentspec_files" not in second["xargs"]  # opened once, by the first call
    assert speculative_config("plain") is None
    assert speculative_config("ngram") == {"method": "ngram", "prompt_lookup_min": 2,
                                           "prompt_lookup_max": 4, "num_speculative_tokens": 5}
    assert speculative_config("full")["method"] == "custom_class"


def test_engines_leave_room_for_two_drafts_past_the_longest_call():
    from agentspec.backends.vllm_bench import DRAFT_TOKENS, engine_length
    from agentspec.bench import BenchError

    assert engine_length(1000, 128, None) == 1000 + 128 + 2 * DRAFT_TOKENS + 1
    assert engine_length(1000, 128, 2048) == engine_length(1000, 128, None)
    with pytest.raises(BenchError, match="draft room exceeds the model's context of 1152"):
        engine_length(1000, 128, 1152)  # the call itself fits, its drafts would not


def test_a_worker_run_becomes_a_bench_entry():
    from agentspec.backends.vllm_bench import measured_run
    from agentspec.bench import BenchSetup, method_entry

    roles = {"s#0": "code", "s#1": "review"}
    plain = measured_run("plain", {"seconds": 4.0, "propose_s": 0.0, "spec": {},
                                   "outputs": {"s#0": [1] * 10, "s#1": [2] * 6}}, roles, 2)
    spec = measured_run("full", {"seconds": 2.0, "propose_s": 0.001,
                                 "spec": {"s#0": (12, 6), "s#1": (0, 0)},
                                 "outputs": {"s#0": [1] * 10, "s#1": [2, 2, 2, 3, 2, 2]}},
                        roles, 2)
    e = method_entry(spec, plain, BenchSetup())
    assert e["tokens_per_s"] == 8.0 and e["speedup"] == 2.0
    assert e["steps"] == 4 + 6 and e["al"] == 1.6 and e["rejected"] == 6
    assert e["by_role"]["code"]["al"] == 2.5 and e["by_role"]["review"]["al"] == 1.0
    # full batches of 2: plain 8 batch steps; full 5 batch steps plus 12 drafts at lambda/2
    assert e["modeled_speedup"]["0.5"] == pytest.approx(8 / (5 + 0.5 * 12 / 2), abs=1e-4)
    assert e["identical_to_plain"] is False
    assert e["mismatches"] == [{"call": "s#1", "position": 3}]
    assert e["overhead_us_per_step"] == 100.0


def test_without_vllm_the_cli_says_how_to_get_it(tmp_path, monkeypatch, tiny_model_dir):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    monkeypatch.setenv("AGENTSPEC_VLLM_PYTHON", str(tmp_path / "no-python"))
    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj("a")])
    r = CliRunner().invoke(app, ["bench", "--backend", "vllm", "--traces", str(trace),
                                 "--no-split", "--model", str(tiny_model_dir)])
    if "import vllm" not in r.output:  # this Python has vLLM itself: nothing to say
        assert r.exit_code == 2 and "no Python with vLLM" in r.output, r.output
        assert "scripts/setup.sh" in r.output
    r = CliRunner().invoke(app, ["bench", "--traces", str(trace), "--batch", "1,2"])
    assert r.exit_code == 2 and "only with --backend vllm" in r.output


def _vllm_ready() -> None:
    # never skipped: a missing vLLM environment is a failed set-up
    assert Path(VLLM_PYTHON).exists(), (f"no vLLM environment at {VLLM_PYTHON}: run "
                                        f"scripts/setup.sh (or set AGENTSPEC_VLLM_PYTHON)")
    if not os.environ.get("AGENTSPEC_VLLM_MODEL"):
        from agentspec.models import resolve

        resolve(None)  # pulls the embedded model on first use


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_bench_is_lossless_and_copies(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    _vllm_ready()
    monkeypatch.setenv("AGENTSPEC_VLLM_PYTHON", VLLM_PYTHON)
    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}") for i in range(2)])
    r = CliRunner().invoke(app, ["bench", "--backend", "vllm", "--traces", str(trace),
                                 "--no-split", "--methods", "plain,ngram,full", "--batch",
                                 "1,2", "--max-tokens", "32", "--json", str(tmp_path / "r.json"),
                                 "--save-outputs", str(tmp_path / "served.json")])
    assert r.exit_code == 0, r.output
    # a run of minutes a method says in a log as each method ends (4 calls at 2 sizes)
    for name in ("plain", "ngram", "full"):
        assert f"[bench] {name}: 8 calls, done in " in r.output
    for b in (1, 2):
        report = json.loads((tmp_path / f"r.b{b}.json").read_text())
        served = json.loads((tmp_path / f"served.b{b}.json").read_text())
        assert served["format"] == "agentspec.outputs/1" and len(served["outputs"]) == 4
        assert sum(map(len, served["outputs"].values())) == \
            report["methods"]["plain"]["output_tokens"]
        assert report["format"] == "agentspec.bench/1" and report["backend"] == "vllm"
        assert report["batch"] == b and list(report["methods"]) == ["plain", "ngram", "full"]
        for name, m in report["methods"].items():
            assert m["identical_to_plain"] is True, (name, b, m["mismatches"])
            assert m["tokens_per_s"] > 0 and m["output_tokens"] > 0
        full = report["methods"]["full"]
        assert full["vllm_counters"]["vllm:spec_decode_num_accepted_tokens"] > 0
        assert full["al"] > 1.0 and full["rejected"] == (
            full["vllm_counters"]["vllm:spec_decode_num_draft_tokens"]
            - full["vllm_counters"]["vllm:spec_decode_num_accepted_tokens"])


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_suffix_gets_the_past_outputs_the_rungs_get(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    _vllm_ready()
    monkeypatch.setenv("AGENTSPEC_VLLM_PYTHON", VLLM_PYTHON)
    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}", task=f"task{i}")
                                               for i in range(6)])
    r = CliRunner().invoke(app, ["bench", "--backend", "vllm", "--traces", str(trace),
                                 "--methods", "plain,suffix,suffix-cold", "--max-tokens", "16",
                                 "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    given = {name: m["knowledge"]["global_seed_outputs"] for name, m in report["methods"].items()}
    assert given["suffix"] > 0 and given["suffix-cold"] == given["plain"] == 0
    for name, m in report["methods"].items():
        assert m["identical_to_plain"] is True, (name, m["mismatches"])


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_profile_lambda_writes_a_cost_profile(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from agentspec.costs import load_profile

    _vllm_ready()
    monkeypatch.setenv("AGENTSPEC_VLLM_PYTHON", VLLM_PYTHON)
    monkeypatch.setenv("AGENTSPEC_HOME", str(tmp_path / "home"))  # keep the cache clean
    r = CliRunner().invoke(app, ["profile-lambda", "--backend", "vllm", "--batch", "1,2",
                                 "--max-k", "2", "--context", "32", "--repeats", "2",
                                 "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    prof = load_profile(tmp_path / "p.json")
    assert prof.backend == "vllm" and sorted(prof.batches) == [1, 2]
    assert prof.batches[2].tokens_per_row == [1, 2, 3] and "vLLM" in prof.machine


@pytest.mark.vllm
@pytest.mark.slow
def test_an_engine_without_a_hooked_runner_method_fails_at_start():
    _vllm_ready()
    p = subprocess.run([VLLM_PYTHON, __file__, "unhooked"], capture_output=True, text=True,
                       timeout=900)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    assert lines, p.stdout[-2000:] + p.stderr[-4000:]
    error = json.loads(lines[-1]).get("error", "")
    assert "has no _on_request_state_removed" in error + p.stderr, p.stderr[-4000:]


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_custom_class_is_lossless():
    _vllm_ready()
    passed, text = _check(VLLM_PYTHON)
    print(text)
    assert all(passed.values()), text


def test_what_the_policy_learned_is_kept_across_engine_runs(tmp_path, monkeypatch):
    """$AGENTSPEC_VLLM_STATE: saved when the engine falls idle, a new engine takes back what
    the last one learned (G holds its output, so the next request drafts it); another
    method's file stops the engine."""
    from agentspec.state import StateError

    state = tmp_path / "state.npz"
    monkeypatch.setenv("AGENTSPEC_VLLM_STATE", str(state))
    first = _proposer(k=4)
    first.load_model(None)
    runner = FakeRunner()
    runner.add("r1", [1, 2, 3])
    runner.step(first, {"r1": []}, {})
    for token in A:  # the output: A, one token a step
        runner.step(first, {"r1": [token]}, {})
    first.finish("r1", runner.requests["r1"])  # none left running: it saves
    first.keeper.wait()
    again = _proposer(k=4)
    again.load_model(None)
    assert [d.tolist() for d in again.policy.g.documents()] == [[1, 2, 3] + A]  # lead, output
    runner = FakeRunner()
    runner.add("r2", [4, 4, 4])
    runner.step(again, {"r2": []}, {})
    runner.step(again, {"r2": [A[0]]}, {})
    drafts = runner.step(again, {"r2": [A[1]]}, {})
    assert drafts["r2"] and drafts["r2"] == A[2 : 2 + len(drafts["r2"])]
    monkeypatch.setenv("AGENTSPEC_VLLM_METHOD", "session")
    with pytest.raises(StateError, match="learned with method 'full', not 'session'"):
        _proposer(k=4)
