"""Shared fixtures: a tiny byte-level BPE model folder, hand-made trace files, scripts/."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The test failed: assert add(1, 2) == 3\n",
    "Let me look at the file src/calc.py and fix the bug.\n",
    "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n",
]


# Test tiers, run in this order, each announced when it starts (a slow tier runs for minutes)
TIERS = {
    "unit": "unit tests (tiny models, seconds)",
    "slow": "slow tier: the real embedded model on MLX and long replays (minutes)",
    "vllm": "vllm tier: real vLLM engines on the CPU in .venv-vllm (minutes)",
}


def _tier(item) -> str:
    return "vllm" if item.get_closest_marker("vllm") else \
        "slow" if item.get_closest_marker("slow") else "unit"


def pytest_collection_modifyitems(items):
    order = list(TIERS)
    items.sort(key=lambda item: order.index(_tier(item)))  # stable: file order within a tier


_RUN: dict = {"tiers": {}, "now": None, "reporter": None}  # the announcing hooks' state


def pytest_collection_finish(session):
    _RUN["tiers"] = {item.nodeid: _tier(item) for item in session.items}
    _RUN["reporter"] = session.config.pluginmanager.get_plugin("terminalreporter")


def pytest_runtest_logstart(nodeid, location):
    tier = _RUN["tiers"].get(nodeid)
    if _RUN["reporter"] is not None and tier and tier != _RUN["now"]:
        _RUN["now"] = tier
        _RUN["reporter"].write_line("")
        _RUN["reporter"].write_line(f"[tests] {TIERS[tier]}")


def tiny_tokenizer(corpus: list[str] = CORPUS, vocab_size: int = 400) -> Tokenizer:
    """A byte-level BPE (GPT-2 style, like SmolLM2's) trained in milliseconds."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 5, trainer)
    return tok


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A model folder with only what tokenization needs (no weights)."""
    d = tmp_path_factory.mktemp("tiny-model")
    tiny_tokenizer().save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return d


def session_obj(sid: str, task: str | None = None, patch_twice: bool = True) -> dict:
    """A two-call session whose second output repeats the first: drafts should hit."""
    patch = CORPUS[3]
    return {
        "format": "agentspec.trace/1", "id": sid,
        "meta": {"agent": "test", "task": task or sid, "structure": [["```diff", "```"]]},
        "threads": [[
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": "Fix src/calc.py:\n" + CORPUS[0]},
            {"role": "assistant", "content": "```diff\n" + patch + "```\n"},
            {"role": "tool", "content": CORPUS[1]},
            {"role": "assistant", "content": ("```diff\n" + patch + "```\n") if patch_twice
             else "Done."},
        ]],
        "calls": [{"thread": 0, "message": 2, "role": "code", "turn": 1},
                  {"thread": 0, "message": 4, "role": "code", "turn": 2}],
        "files": {"src/calc.py": CORPUS[0]},
    }


def write_jsonl(path: Path, objs: list) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


@pytest.fixture
def trace(tmp_path):
    """A trace file of 8 sessions, each of its own task (the bench splits by task)."""
    return write_jsonl(tmp_path / "t.jsonl", [session_obj(f"s{i}", task=f"task{i}")
                                              for i in range(8)])


def random_init(model, seed: int):
    """Random MLX weights large enough that greedy output varies (default init repeats a token)."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    mx.random.seed(seed)

    def draw(path, w):
        if "norm" in path:
            return w
        return mx.random.normal(w.shape) * (1.0 if "embed" in path else 4.0 / w.shape[-1] ** 0.5)

    model.update(tree_map_with_path(draw, model.parameters()))
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory):
    """A loadable mlx-lm folder: a tiny random llama over the tiny tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    d = tmp_path_factory.mktemp("tiny-llama")
    tok = tiny_tokenizer()
    tok.save(str(d / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "rms_norm_eps": 1e-5, "vocab_size": vocab,
              "max_position_embeddings": 8192, "tie_word_embeddings": True,
              "eos_token_id": tok.token_to_id("<|im_end|>")}
    (d / "config.json").write_text(json.dumps(config))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>"}))
    m = random_init(llama.Model(llama.ModelArgs.from_dict(config)), 3)
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(m.parameters())))
    return d


def load_script(name: str):
    """A module of scripts/ (they are run as files, not installed)."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # (a dataclass's annotations are resolved through its module)
    spec.loader.exec_module(mod)
    return mod


def run_without_numba(how: str, code: str) -> None:
    """Run `code` in a fresh process where numba is missing ("no numba") or switched off
    ("env": AGENTSPEC_NO_NUMBA=1); it fails the test by failing."""
    code = ("import sys\nsys.modules['numba'] = None\n" if how == "no numba" else "") + code
    env = dict(os.environ, AGENTSPEC_NO_NUMBA="1" if how == "env" else "")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300,
                   cwd=Path(__file__).resolve().parent.parent)


def replayed_alike(run, wrap):
    """`full` replayed alone and inside `wrap` (a script's recording drafter), which must change
    no draft: the wrapper and the replay's totals."""
    from agentspec.bench import make_drafter
    from agentspec.replay import replay

    alone = replay(run.tokenized, make_drafter("full", run.setup)).total
    wrapper = wrap(make_drafter("full", run.setup))
    recorded = replay(run.tokenized, wrapper).total
    assert (recorded.steps, recorded.accepted, recorded.drafted) == \
        (alone.steps, alone.accepted, alone.drafted)
    return wrapper, alone


def replay_run(trace: Path, model_dir: Path, methods: str = "full"):
    """What `bench --backend replay` loads for a trace (every session, seed 0, batch 1), as
    the replay scripts load it (scripts/replay_options.py)."""
    args = argparse.Namespace(traces=[trace], sessions=None, seed=0, batch=1, lam=0.2,
                              structure=None, model=str(model_dir), json=None)
    return load_script("replay_options").load_replay(args, methods)
