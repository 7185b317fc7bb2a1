"""The MLX engine is lossless: speculative output equals plain greedy output, token for token."""

from __future__ import annotations

import json
import random
import warnings

import pytest

mlx_engine = pytest.importorskip("agentspec.backends.mlx")

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import llama, mamba  # noqa: E402
from mlx_lm.models.cache import KVCache, RotatingKVCache  # noqa: E402

from agentspec.drafter import Plain, Request  # noqa: E402
from conftest import random_init  # noqa: E402

E = mlx_engine
VOCAB = 256


def tiny_llama(seed: int = 0, **extra):
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2,
                           intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, rms_norm_eps=1e-5, vocab_size=VOCAB,
                           max_position_embeddings=512, **extra)
    return random_init(llama.Model(args), seed)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


class Scripted:
    """Drafts from the known plain output: right, wrong, random-ish or nothing."""

    name = "scripted"

    def __init__(self, outputs: dict[str, list[int]], mode: str, k: int = 8, seed: int = 0):
        self.outputs, self.mode, self.k = outputs, mode, k
        self.rng = random.Random(seed)
        self.observed = []
        self.timed = []  # (draft length per row, seconds) of each verification reported

    def propose(self, batch, padded=False):
        drafts = []
        for r in batch:
            k = self.rng.randrange(0, self.k + 1) if self.mode == "mixed" else self.k
            right = self.outputs[r.id][len(r.output):][:k] + [self.rng.randrange(VOCAB)] * 3
            right = right[:k]
            if self.mode == "right":
                drafts.append(right)
            elif self.mode == "wrong":
                drafts.append([(t + 1) % VOCAB for t in right])
            elif self.mode == "empty":
                drafts.append([])
            elif self.mode == "random":
                drafts.append([self.rng.randrange(VOCAB) for _ in range(k)])
            else:  # mixed: right then wrong from a random position
                cut = self.rng.randrange(0, k + 1)
                drafts.append(right[:cut] + [(t + 1) % VOCAB for t in right[cut:]])
        return drafts

    def observe(self, request, drafted, accepted):
        self.observed.append((request.id, drafted, accepted))

    def observe_step(self, verified, seconds):
        self.timed.append((list(verified), seconds))


def reference(model, ps, max_tokens, stop=()):
    return [E.plain_tokens(model, p, max_tokens, stop).tokens for p in ps]


def req(i: int, p: list[int]) -> Request:
    return Request(id=f"r{i}", session="s", tokens=list(p), num_prompt=len(p))


MODES = ("right", "wrong", "empty", "random", "mixed")


def test_plain_loop_matches_mlx_lm(model):
    ps = prompts(4, seed=1)
    for p, ref in zip(ps, reference(model, ps, 30)):
        assert E.generate(model, p, None, max_tokens=30).tokens == ref
        assert E.generate(model, p, Plain(), max_tokens=30).tokens == ref


@pytest.mark.parametrize("mode", MODES)
def test_speculative_equals_plain_at_batch_1(model, mode):
    ps = prompts(4, seed=2)
    refs = reference(model, ps, 40)
    assert len({t for r in refs for t in r}) > 10  # the model does not repeat one token
    drafter = Scripted({f"r{i}": r for i, r in enumerate(refs)}, mode)
    for i, (p, ref) in enumerate(zip(ps, refs)):
        r = req(i, p)
        gen = E.generate(model, p, drafter, r, max_tokens=40)
        assert gen.tokens == ref
        assert r.tokens == p + ref
        assert sum(s[0] for s in gen.steps) == len(ref)
        if mode == "right":
            assert len(gen.steps) <= len(ref) // 9 + 2
        if mode in ("wrong", "empty"):
            assert gen.accepted == 0 and len(gen.steps) == len(ref)
    # the engine priced every verification for the drafter: one row, the draft it verified
    assert [t[0] for t in drafter.timed] == [[d] for _, d, _ in drafter.observed]
    assert all(t[1] > 0 for t in drafter.timed)


@pytest.mark.parametrize("mode", MODES)
def test_speculative_equals_plain_at_batch_4(model, mode):
    ps = prompts(7, seed=3)
    refs = reference(model, ps, 30)
    drafter = Scripted({f"r{i}": r for i, r in enumerate(refs)}, mode, seed=5)
    requests = [req(i, p) for i, p in enumerate(ps)]
    gens = E.generate_batch(model, ps, drafter, requests, batch=4, max_tokens=30)
    assert [g.tokens for g in gens] == refs
    assert [r.tokens for r in requests] == [p + ref for p, ref in zip(ps, refs)]
    # each verification is priced at what it computed: every row padded to the widest draft
    assert drafter.timed and all(len(set(v)) == 1 for v, _ in drafter.timed)
    if mode == "empty":
        assert {n for v, _ in drafter.timed for n in v} == {0}


def test_stop_tokens_and_max_tokens(model):
    ps = prompts(3, seed=4)
    refs = reference(model, ps, 40)
    stop = refs[0][12]
    cut = [r[:r.index(stop)] if stop in r else r for r in refs]
    assert reference(model, ps, 40, [stop]) == cut
    outputs = {f"r{i}": r for i, r in enumerate(refs)}
    for i, p in enumerate(ps):
        gen = E.generate(model, p, Scripted(outputs, "right"), req(i, p), 40, [stop])
        assert gen.tokens == cut[i]
        assert gen.finish == ("stop" if stop in refs[i] else "length")
        for n in (1, 2, 7, 9):  # drafts of 8 never push past max_tokens
            assert E.generate(model, p, Scripted(outputs, "right"), req(i, p), n).tokens == \
                refs[i][:n]
    gens = E.generate_batch(model, ps, Scripted(outputs, "mixed"), [req(i, p) for i, p in
                                                                   enumerate(ps)],
                            batch=2, max_tokens=40, stop_ids=[stop])
    assert [g.tokens for g in gens] == cut


def test_temperature_sampling_is_schedule_free(model):
    ps = prompts(3, seed=6)
    plain = [E.generate(model, p, None, max_tokens=30, temperature=0.8, seed=11).tokens
             for p in ps]
    assert plain != reference(model, ps, 30)  # it really samples
    outputs = {f"r{i}": r for i, r in enumerate(plain)}
    for mode in ("right", "mixed"):
        for i, p in enumerate(ps):
            gen = E.generate(model, p, Scripted(outputs, mode), req(i, p), 30, temperature=0.8,
                             seed=11)
            assert gen.tokens == plain[i]
    gens = E.generate_batch(model, ps, Scripted(outputs, "mixed"),
                            [req(i, p) for i, p in enumerate(ps)], batch=3, max_tokens=30,
                            temperature=0.8, seed=11 - 0)
    seq = [E.generate(model, p, None, max_tokens=30, temperature=0.8, seed=11 + i).tokens
           for i, p in enumerate(ps)]
    assert [g.tokens for g in gens] == seq


def test_shared_prefilled_cache_is_reused(model):
    p = prompts(1, seed=7)[0]
    ref = reference(model, [p], 20)[0]
    cache = E.prefill(model, p[:-1])
    drafter = Scripted({"r0": ref}, "mixed")
    for _ in range(2):
        assert E.generate(model, p, drafter, req(0, p), 20, cache=cache).tokens == ref
        assert E.trim_prompt_cache(cache, E.cache_len(cache) - (len(p) - 1)) >= 0
        assert E.cache_len(cache) == len(p) - 1
        assert E.plain_tokens(model, p, 20, cache=cache).tokens == ref
        E.trim_prompt_cache(cache, E.cache_len(cache) - (len(p) - 1))
    with pytest.raises(E.MLXError, match="cache holds"):
        E.generate(model, p + [1], drafter, req(0, p), 5, cache=cache)


# ---------------------------------------------------------------- caches that cannot roll back


class LyingKVCache(KVCache):
    """Claims to be trimmable but trims nothing after its first `honest` trims."""

    def __init__(self, honest: int = 0):
        super().__init__()
        self.honest = honest

    def trim(self, n):
        if self.honest > 0:
            self.honest -= 1
            return super().trim(n)
        return 0


class LyingLlama(llama.Model):
    honest = 0

    def make_cache(self):
        return [LyingKVCache(self.honest) for _ in self.layers]


class WindowByCache(llama.Model):
    """A model that relies on a rotating cache for its window (its mask has none)."""

    def make_cache(self):
        return [RotatingKVCache(max_size=8) for _ in self.layers]


def _as(cls, base):
    m = cls(base.args)
    m.update(base.parameters())
    mx.eval(m.parameters())
    return m


def _check_same(m, ps, n=25):
    refs = reference(m, ps, n)
    outputs = {f"r{i}": r for i, r in enumerate(refs)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, p in enumerate(ps):
            assert E.generate(m, p, Scripted(outputs, "mixed"), req(i, p), n).tokens == refs[i]
        gens = E.generate_batch(m, ps, Scripted(outputs, "mixed"),
                                [req(i, p) for i, p in enumerate(ps)], batch=4, max_tokens=n)
        assert [g.tokens for g in gens] == refs
    return [str(w.message) for w in caught]


def test_a_cache_whose_trim_does_nothing_disables_speculation(model):
    m = _as(LyingLlama, model)
    plan = E.plan_for(m)
    assert plan.mode == "none" and "did not remove" in plan.reason
    messages = _check_same(m, prompts(3, seed=8))
    assert sum("speculation disabled" in s for s in messages) == 1  # one warning, not one per call


def test_a_trim_failing_mid_request_recovers_with_identical_output(model):
    m = _as(LyingLlama, model)
    m.honest = 1  # passes the detection probe, then lies
    assert E.plan_for(m).mode == "trim"
    ps = prompts(2, seed=9)
    refs = reference(m, ps, 25)
    with pytest.warns(UserWarning, match="mid-request"):
        gen = E.generate(m, ps[0], Scripted({"r0": refs[0]}, "wrong"), req(0, ps[0]), 25)
    assert gen.tokens == refs[0]
    assert E.plan_for(m).mode == "none"


def test_recurrent_state_decodes_plainly():
    args = mamba.ModelArgs(model_type="mamba", vocab_size=VOCAB, hidden_size=32,
                           intermediate_size=64, state_size=8, num_hidden_layers=2,
                           conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4)
    m = random_init(mamba.Model(args), 1)
    plan = E.plan_for(m)
    assert plan.mode == "none" and "ArraysCache" in plan.reason
    _check_same(m, prompts(2, seed=10), n=15)


def test_sliding_window_layers_get_a_full_cache(model):
    m = tiny_llama(layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    plan = E.plan_for(m)
    assert plan.mode == "full" and plan.swap == (0,) and plan.window is None
    ps = [p for p in prompts(6, seed=11) if len(p) > 12][:3]  # longer than the window
    assert _check_same(m, ps) == []


def test_a_window_kept_only_by_the_cache_is_not_replaced(model):
    m = _as(WindowByCache, model)
    plan = E.plan_for(m)
    assert plan.mode == "full" and plan.window == 8
    ps = [p for p in prompts(6, seed=12) if len(p) > 12][:3]
    _check_same(m, ps)  # past the window: plain decoding with the rotating cache


# ---------------------------------------------------------------- bad input


def test_a_prompt_longer_than_the_context_is_one_clear_error(model):
    with pytest.raises(E.MLXError, match="context is 512"):
        E.generate(model, [1] * 600, None, max_tokens=5)


def test_max_tokens_stop_at_the_context(model):
    gen = E.generate(model, [1] * 500, Plain(), max_tokens=50)
    assert len(gen.tokens) == 12


def test_a_folder_that_does_not_load_is_one_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nonsense"}))
    with pytest.raises(E.MLXError, match="could not load the model"):
        E.load(str(tmp_path))
    with pytest.raises(E.MLXError, match="not in the local Hugging Face cache|huggingface_hub"):
        E.load("nobody/no-such-model-xyz")
    with pytest.raises(E.MLXError, match="--dtype"):
        E.load(None, "int3")


# ---------------------------------------------------------------- the real model


@pytest.mark.slow
def test_smollm2_speculative_equals_plain():
    from agentspec.models import resolve

    eng = E.load(None, "float32")
    assert eng.plan.mode == "trim" and eng.stop_ids
    tok = eng.tokenizer
    texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
             "Fix the bug in calc.py: the function add returns a - b instead of a + b."]
    ps = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
          for t in texts]
    refs = [E.plain_tokens(eng.model, p, 48, eng.stop_ids).tokens for p in ps]
    outputs = {f"r{i}": r for i, r in enumerate(refs)}
    for i, p in enumerate(ps):
        gen = E.generate(eng.model, p, Scripted(outputs, "mixed"), req(i, p), 48, eng.stop_ids)
        assert gen.tokens == refs[i]
    gens = E.generate_batch(eng.model, ps, Scripted(outputs, "mixed"),
                            [req(i, p) for i, p in enumerate(ps)], batch=2, max_tokens=48,
                            stop_ids=eng.stop_ids)
    assert [g.tokens for g in gens] == refs
    assert resolve(None).is_dir()


# ---------------------------------------------------------------- the command line


def test_cli_profile_lambda_then_bench_uses_the_cached_profile(tmp_path, model_folder,
                                                               monkeypatch):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from agentspec.costs import load_profile
    from conftest import session_obj, write_jsonl

    monkeypatch.setenv("AGENTSPEC_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    r = runner.invoke(app, ["profile-lambda", "--model", str(model_folder), "--batch", "1,2",
                            "--max-k", "4", "--context", "16", "--repeats", "1",
                            "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    prof = load_profile(tmp_path / "p.json")
    assert sorted(prof.batches) == [1, 2] and prof.batches[1].tokens_per_row == [1, 2, 3, 5]
    assert list((tmp_path / "home" / "profiles").glob("mlx-*-float32-*.json"))

    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}") for i in range(2)])
    r = runner.invoke(app, ["bench", "--backend", "mlx", "--model", str(model_folder),
                            "--traces", str(trace), "--no-split", "--methods",
                            "plain,suffix,full", "--max-tokens", "12", "--json",
                            str(tmp_path / "r.json"), "--save-outputs",
                            str(tmp_path / "served.json")])
    assert r.exit_code == 0, r.output
    for name in ("plain", "suffix", "full"):  # in a log, a line as each method ends
        assert f"[bench] {name}: 4 calls, done in " in r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["backend"] == "mlx" and report["calls"] == 4
    for name, m in report["methods"].items():
        assert m["identical_to_plain"] is True and m["mismatches"] == []
        assert m["tokens_per_s"] > 0 and "profile" in m["modeled_speedup"]
    assert report["methods"]["plain"]["speedup"] == 1.0

    # the model's own outputs, replayed: every method drafts against what it generated
    r = runner.invoke(app, ["bench", "--model", str(model_folder), "--traces", str(trace),
                            "--no-split", "--methods", "plain,suffix,full", "--outputs",
                            str(tmp_path / "served.json"), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    replayed = json.loads((tmp_path / "s.json").read_text())["methods"]
    assert replayed["plain"]["output_tokens"] == report["methods"]["plain"]["output_tokens"]
    assert replayed["full"]["al"] > 1.0


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/folder"], "does not exist"),
    (["--max-tokens", "4", "--dtype", "int3"], "--dtype"),
])
def test_cli_bench_mlx_bad_input_is_one_message(tmp_path, model_folder, args, message):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj("s0")])
    r = CliRunner().invoke(app, ["bench", "--backend", "mlx", "--traces", str(trace),
                                 "--no-split", "--methods", "plain", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_cli_bench_mlx_prompt_longer_than_the_context(tmp_path, model_folder):
    from typer.testing import CliRunner

    from agentspec.cli import app
    from conftest import session_obj, write_jsonl

    small = tmp_path / "small"
    small.mkdir()
    for f in model_folder.iterdir():
        (small / f.name).write_bytes(f.read_bytes())
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8}))
    trace = write_jsonl(tmp_path / "t.jsonl", [session_obj("s0")])
    r = CliRunner().invoke(app, ["bench", "--backend", "mlx", "--model", str(small),
                                 "--traces", str(trace), "--no-split", "--methods", "plain"])
    assert r.exit_code == 2, r.output
    assert "context is 8" in r.output and "--max-prompt-tokens" in r.output
    assert "Traceback" not in r.output


def test_load_casts_weights(model_folder):
    eng = E.load(str(model_folder), "float16")
    assert {v.dtype for _, v in tree_flatten(eng.model.parameters())} == {mx.float16}
    assert eng.plan.mode == "trim" and eng.name == model_folder.name and eng.stop_ids
    kept = E.load(str(model_folder), "keep")
    assert {v.dtype for _, v in tree_flatten(kept.model.parameters())} == {mx.float32}
    p = [5, 6, 7, 8]
    ref = E.plain_tokens(eng.model, p, 10).tokens
    assert E.generate(eng.model, p, Scripted({"r0": ref}, "mixed"), req(0, p), 10).tokens == ref


def test_openblas_kernels_follow_the_cpu_flags():
    """An OpenBLAS older than the CPU would fall back to SSE3 kernels ("Prescott"): 5x slower."""
    assert E.openblas_core({"avx2", "fma"} | E.AVX512_FLAGS) == "SkylakeX"
    assert E.openblas_core({"avx2", "fma", "avx512f"}) == "Haswell"  # partial AVX-512
    assert E.openblas_core({"sse3", "avx"}) is None  # OpenBLAS's own detection decides


def test_openblas_core_set_by_the_user_is_kept(monkeypatch):
    monkeypatch.setattr(E, "find_openblas", lambda: "/usr/lib/libopenblas.so.0")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert E.blas_env() == {"LD_PRELOAD": "/usr/lib/libopenblas.so.0", "OPENBLAS_CORETYPE": "Zen"}
    monkeypatch.setattr(E, "find_openblas", lambda: None)
    assert E.blas_env() == {}
