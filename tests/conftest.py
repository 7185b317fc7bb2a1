"""Shared fixtures: a tiny byte-level BPE model folder and hand-made trace files."""

from __future__ import annotations

import json
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
