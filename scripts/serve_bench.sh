#!/usr/bin/env bash
# `agentspec serve` measured through the one client path (`agentspec bench --backend http`):
# 3 recorded sessions of the AutoCodeRover trace (--seed 7, prompts cut to their last 1,024
# tokens, 128 new tokens, greedy) against freshly started servers of the embedded model:
#   OUT/full-vs-plain.b1.json      --method full against --method plain, one client
#   OUT/full-vs-plain.b4.json      the same with 4 sessions' calls in flight (new servers)
#   OUT/plain-vs-mlx_lm.b1.json    --method plain against mlx-lm's own mlx_lm.server
#   OUT/nocache-vs-plain.b1.json   --method plain --cache-gb 0 (no prompt cache) against
#                                  --method plain: time to first token without and with it
# plus each server's /metrics after its run and its log. Servers are stopped on exit.
#
#   bash scripts/serve_bench.sh OUT        (about 50 min on a 2-core CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/serve_bench.sh OUT}
TRACES=${TRACES:-../shared/traces/acr-run-1.jsonl.gz}
mkdir -p "$OUT"
model=$(.venv/bin/agentspec models pull smollm2-135m | tail -1)
source scripts/servers.sh
trap stop_servers EXIT
trap 'exit 130' INT TERM

# measure NAME BATCH: the servers $url (measured) and $base (reference), then stop them
measure() {
  .venv/bin/agentspec bench --backend http --url "$1" --plain-url "$2" --traces "$TRACES" \
    --sessions 3 --seed 7 --batch "$4" --max-tokens 128 --max-prompt-tokens 1024 \
    --json "$OUT/$3.b$4.json" | tee "$OUT/$3.b$4.txt"
  curl -s "$1/metrics" >"$OUT/$3.b$4.metrics.txt"
  stop_servers
}

for batch in 1 4; do
  # (fresh, as every server here: nothing learned in an earlier run)
  start_server full "$OUT/full.b$batch.log" .venv/bin/agentspec serve --method full --no-state
  full=$url
  start_server plain "$OUT/plain.b$batch.log" .venv/bin/agentspec serve --method plain
  measure "$full" "$url" full-vs-plain "$batch"
done
start_server plain "$OUT/plain.log" .venv/bin/agentspec serve --method plain
plain=$url
# mlx_lm.server lists models by scanning the Hugging Face cache, which must exist
export HF_HUB_CACHE=${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}
mkdir -p "$HF_HUB_CACHE"
# on Linux, MLX's float32 matmuls are fast only with OpenBLAS (and this CPU's kernels) loaded
# first, which agentspec's engine does itself: give mlx_lm.server the same library and kernels
blas() { .venv/bin/python -c "from agentspec.backends.mlx import blas_env; print(blas_env().get('$1', ''))"; }
LD_PRELOAD=$(blas LD_PRELOAD) OPENBLAS_CORETYPE=$(blas OPENBLAS_CORETYPE) start_server mlx_lm "$OUT/mlx_lm.log" .venv/bin/python -m mlx_lm.server --model "$model"
measure "$plain" "$url" plain-vs-mlx_lm 1
start_server nocache "$OUT/nocache.log" .venv/bin/agentspec serve --method plain --cache-gb 0
nocache=$url
start_server plain "$OUT/plain.cache.log" .venv/bin/agentspec serve --method plain
measure "$nocache" "$url" nocache-vs-plain 1
