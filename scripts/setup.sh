#!/usr/bin/env bash
# Set up agentspec in ./.venv on a fresh machine: the package with its extras, and the
# arctic-inference suffix tree (the SuffixDecoding baseline), which PyPI ships as source only.
# Safe to re-run: steps already done are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PIP="$VENV/bin/pip"

source scripts/pick_python.sh
PY=$(pick_python)

# run a long, quiet step (pip, a build), saying every 20 s that it still runs
with_heartbeat() {
  local start=$SECONDS beat status=0
  ( while sleep 20; do echo "[setup] ... still at it ($((SECONDS - start)) s)"; done ) &
  beat=$!
  "$@" || status=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$status"
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  "$PY" -m venv "$VENV"
  "$PIP" install -q --upgrade pip
fi

case "$(uname -s)" in
  Linux) extras="dev,bench,mlx,serve,agent" ;;
  Darwin) extras="dev,bench,mlx,serve,agent" ;;
  *) extras="dev,bench,serve,agent" ;;
esac

# torch is only needed to build arctic-inference (its setup.py imports it); 2.13.0 is the
# CPU build this project's Linux machines keep locally.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch"
  with_heartbeat "$PIP" install -q "torch==2.13.0" || with_heartbeat "$PIP" install -q "torch>=2.10"
fi

if ! "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  echo "[setup] building arctic-inference 0.3.0 (suffix tree only)"
  with_heartbeat "$PIP" install -q setuptools wheel ninja "cmake>=3.18" "nanobind==2.9.2" "protobuf==5.29.6" grpcio-tools
  # cmake must find the venv's Python (and its nanobind), not whatever python3 is on PATH
  PATH="$PWD/$VENV/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/$VENV/bin/python" \
    with_heartbeat "$PIP" install -q --no-build-isolation --no-deps "arctic-inference==0.3.0"
fi

# MLX on Linux runs on the CPU, and its float32 matmuls are only fast with an optimized BLAS
# loaded first (agentspec's MLX engine preloads Debian's OpenBLAS when it is installed).
if [ "$(uname -s)" = Linux ]; then
  if dpkg -s libopenblas0-pthread >/dev/null 2>&1; then
    :
  elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing libopenblas0-pthread (fast float32 matmuls for MLX on CPU)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread; } \
      >/dev/null 2>&1 || echo "[setup] note: could not install libopenblas0-pthread; MLX will use its slow reference BLAS"
  else
    echo "[setup] note: install libopenblas0-pthread (apt-get, as root) for fast float32 MLX on CPU;" \
         "without it MLX uses its slow reference BLAS"
  fi
fi

# scripts/real_agent.sh runs a third-party agent's shell commands in a bubblewrap sandbox
if [ "$(uname -s)" = Linux ] && ! command -v bwrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing bubblewrap (the sandbox of scripts/real_agent.sh)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } \
      >/dev/null 2>&1 || echo "[setup] note: could not install bubblewrap; scripts/real_agent.sh needs it"
  else
    echo "[setup] note: install bubblewrap (apt-get, as root) for scripts/real_agent.sh"
  fi
fi

# vLLM lives in its own venv: it pins torch and transformers versions of its own. The CUDA
# build on Linux with an NVIDIA GPU, the CPU build on other Linux x86_64 machines, none on
# macOS (scripts/vllm_build.py decides; both take the tested range of the `vllm` extra).
# The drafter's test tier runs engines there. AGENTSPEC_SKIP_VLLM=1 skips it.
if [ -z "${AGENTSPEC_SKIP_VLLM:-}" ]; then
  IFS=$'\t' read -r vllm_req vllm_why < <("$PY" scripts/vllm_build.py)
  if [ "$vllm_req" = - ]; then
    echo "[setup] vLLM: none ($vllm_why)"
  elif .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
    echo "[setup] vLLM already in .venv-vllm ($(.venv-vllm/bin/python -c 'import vllm; print(vllm.__version__)'))"
  else
    echo "[setup] creating .venv-vllm with $vllm_req: $vllm_why (a few minutes, several GB)"
    "$PY" -m venv .venv-vllm
    .venv-vllm/bin/pip install -q --upgrade pip
    with_heartbeat .venv-vllm/bin/pip install -q "$vllm_req"
    # PyPI's torchvision/torchaudio/torchcodec builds break the transformers import beside it
    .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
    with_heartbeat .venv-vllm/bin/pip install -q numpy typer rich tokenizers jinja2 gguf safetensors numba pytest packaging
  fi
fi

# vLLM's `suffix` method imports arctic-inference: .venv-vllm gets the same build as .venv
# (a wheel made there with the same Python; the suffix-tree extension does not link torch)
if [ -x .venv-vllm/bin/python ] \
    && ! .venv-vllm/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  echo "[setup] installing arctic-inference 0.3.0 into .venv-vllm"
  wheels=$(mktemp -d)
  PATH="$PWD/$VENV/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/$VENV/bin/python" \
    with_heartbeat "$PIP" wheel -q --no-build-isolation --no-deps -w "$wheels" "arctic-inference==0.3.0"
  .venv-vllm/bin/pip install -q --no-deps "$wheels"/arctic_inference-*.whl
  rm -rf "$wheels"
fi

# the package itself, in each venv: again only when pyproject.toml (its dependencies) changed
pyproject_sha=$("$PY" -c "import hashlib; print(hashlib.sha1(open('pyproject.toml', 'rb').read()).hexdigest())")
install_agentspec() {  # venv, what it gets (for the stamp and the message), pip arguments
  local venv=$1 what=$2
  shift 2
  local stamp="$venv/.agentspec-installed" want="$what $pyproject_sha"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import agentspec" 2>/dev/null; then
    echo "[setup] $what already installed in $venv (pyproject.toml unchanged)"
  else
    echo "[setup] installing $what into $venv"
    # setuptools warns at length that an editable install maps agentspec.backends and
    # agentspec.agents to backends/ and agents/: that mapping is the layout, not a problem
    PYTHONWARNINGS="ignore::Warning" with_heartbeat "$venv/bin/pip" install -q "$@"
    echo "$want" > "$stamp"
  fi
}
# arctic-inference is already built above; pip sees it as satisfied
install_agentspec "$VENV" "agentspec[$extras]" -e ".[$extras]"
if [ -x .venv-vllm/bin/python ]; then
  install_agentspec .venv-vllm "agentspec (no deps)" --no-deps -e .
fi
echo "[setup] done: $("$VENV/bin/agentspec" --help >/dev/null && echo "agentspec CLI ready in $VENV/bin")"
