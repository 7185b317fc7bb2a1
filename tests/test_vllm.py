"""agentspec's vLLM drafter (`agentspec.backends.vllm_drafter`).

Fast tests drive `AgentspecProposer` with a fake runner, without vLLM. The `vllm` test runs
this file as a script with the Python of a separate vLLM environment
($AGENTSPEC_VLLM_PYTHON, default .venv-vllm/bin/python, made by scripts/setup.sh): the same prompts with plain
greedy decoding and with the proposer, each in its own process, on the embedded model; the
outputs must be equal and vLLM's spec-decode counters must show accepted drafts.

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
    from agentspec.backends.models import DEFAULT_MODEL, models_dir

    return os.environ.get("AGENTSPEC_VLLM_MODEL") or str(models_dir() / DEFAULT_MODEL)


def _run(mode: str) -> dict:
    """Generate PROMPTS greedily with vLLM on the CPU, plain or with the proposer."""
    from vllm import LLM, SamplingParams

    spec = None
    if mode == "agentspec":
        spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8}
    # gpu_memory_utilization is the share of RAM on CPU; 0.1 left no room for the KV cache
    llm = LLM(model=_model(), dtype="float32", max_model_len=1024, gpu_memory_utilization=0.3,
              enforce_eager=True, disable_log_stats=False, speculative_config=spec)
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

A = list(range(5, 17))


def _proposer(k: int = 4, max_model_len: int = 200):
    from agentspec.backends.vllm_drafter import AgentspecProposer

    config = NS(speculative_config=NS(num_speculative_tokens=k),
                model_config=NS(max_model_len=max_model_len, tokenizer=None, model=None))
    return AgentspecProposer(config)


class FakeRunner:
    """What the proposer reads of vLLM's model runner: batch order, prompts, extra_args."""

    def __init__(self):
        self.input_batch = NS(req_ids=[])
        self.requests = {}
        self.tokens: dict[str, list[int]] = {}

    def add(self, rid: str, prompt: list[int], extra_args: dict | None = None):
        self.input_batch.req_ids.append(rid)
        self.requests[rid] = NS(prompt_token_ids=prompt, output_token_ids=[],
                                sampling_params=NS(extra_args=extra_args))
        self.tokens[rid] = list(prompt)

    def step(self, p, sampled: dict[str, list[int]], scheduled: dict):
        """Append this step's tokens, then ask for drafts as vLLM does."""
        p.bind(self, NS(scheduled_spec_decode_tokens=scheduled))
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
    assert fields["session"] == "request:r1" and fields["agent"] == "ok"
    assert request_meta("r2", None)[0]["session"] == "request:r2"


def test_proposer_drafts_observes_and_finishes():
    p = _proposer(k=4)
    p.load_model(None)  # the warm-up request leaves nothing behind
    assert not p.policy.sessions and not p.policy.running and not len(p.policy.g)
    runner = FakeRunner()
    prompt = A + A + A[:3]
    runner.add("r1", prompt, {"agentspec_session": "s"})
    runner.add("r2", [1, 2, 3], {"agentspec_structure": "not json"})
    assert p.propose([[1]], np.array([1]), np.zeros((1, 2), dtype=np.int32)) == [[]]  # unbound
    drafts = runner.step(p, {"r1": [A[3]], "r2": []}, {})  # r2: still a prefill chunk
    assert drafts["r1"] == A[4:8] and drafts["r2"] == []
    assert p.stats["started"] == 1 and p.requests["r1"].session == "s"
    # vLLM verified 4 drafted tokens, accepted 2, and sampled one more
    runner.step(p, {"r1": [A[4], A[5], 99], "r2": [50]}, {"r1": drafts["r1"]})
    assert p.stats["accepted"] == 2
    assert p.requests["r1"].tokens == runner.tokens["r1"]
    assert p.requests["r2"].session == "request:r2" and p.requests["r2"].structure == ()
    p.finish("r1", runner.requests["r1"])
    p.finish("r2", runner.requests["r2"])
    assert p.stats["finished"] == 2 and not p.requests
    assert "request:r2" not in p.policy.sessions and "s" in p.policy.sessions


def test_drafts_respect_k_and_max_model_len():
    p = _proposer(k=3, max_model_len=len(A) * 2 + 6)
    runner = FakeRunner()
    runner.add("r", A + A[:3])
    assert len(runner.step(p, {"r": [A[3]]}, {})["r"]) == 3
    drafts = runner.step(p, {"r": [A[4]]}, {})  # one token from the limit: draft fits
    assert len(drafts["r"]) <= len(A) * 2 + 6 - len(runner.tokens["r"]) - 1


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_custom_class_is_lossless():
    # never skipped: a missing vLLM environment is a failed set-up
    assert Path(VLLM_PYTHON).exists(), (f"no vLLM environment at {VLLM_PYTHON}: run "
                                        f"scripts/setup.sh (or set AGENTSPEC_VLLM_PYTHON)")
    if not os.environ.get("AGENTSPEC_VLLM_MODEL"):
        from agentspec.backends.models import resolve

        resolve(None)  # pulls the embedded model on first use
    passed, text = _check(VLLM_PYTHON)
    print(text)
    assert all(passed.values()), text
