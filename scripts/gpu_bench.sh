#!/usr/bin/env bash
# agentspec inside vLLM on a GPU box: measure lambda(b) with real engine steps, then run every
# method on recorded agent sessions at batch sizes 1, 16 and 64, planning with that profile.
#
#   bash scripts/gpu_bench.sh OUTDIR [MODEL] [TRACES]
#
# MODEL: a model folder or a Hugging Face id already in the local cache (default: the
# embedded smollm2-135m); TRACES: agentspec.trace/1 sessions (default:
# ../shared/traces/acr-run-1.jsonl.gz). It first runs scripts/setup.sh, which on a Linux box
# with an NVIDIA GPU puts vLLM's CUDA build (the tested version) into .venv-vllm; steps
# already done are skipped. Sizes: SESSIONS (64), MAX_TOKENS (256), MAX_PROMPT_TOKENS (4096),
# BATCHES (1,16,64), METHODS (plain,ngram,suffix,full).
# Prints the lambda table, then per batch size the bench table (tokens/s, speedup over plain,
# AL, identical outputs); writes OUTDIR/lambda.{json,png} and OUTDIR/bench.bN.{json,png}.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 3 ]; then
  echo "usage: $0 OUTDIR [MODEL] [TRACES]" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
out=$1
model=${2:-smollm2-135m}
traces=${3:-$repo/../shared/traces/acr-run-1.jsonl.gz}
batches=${BATCHES:-1,16,64}
agentspec="$repo/.venv/bin/agentspec"
mkdir -p "$out"

"$agentspec" profile-lambda --backend vllm --model "$model" --batch "$batches" \
  --out "$out/lambda.json" --plot "$out/lambda.png"

# (several batch sizes: --json and --plot write bench.bN.json and bench.bN.png)
"$agentspec" bench --backend vllm --model "$model" --traces "$traces" \
  --sessions "${SESSIONS:-64}" --batch "$batches" --methods "${METHODS:-plain,ngram,suffix,full}" \
  --max-tokens "${MAX_TOKENS:-256}" --max-prompt-tokens "${MAX_PROMPT_TOKENS:-4096}" \
  --cost-profile "$out/lambda.json" --json "$out/bench.json" --plot "$out/bench.png"
echo "wrote $out"
