#!/usr/bin/env bash
# Set up on a fresh machine and run the main job on the embedded default model: replay
# recorded agent sessions and compare drafting methods (results in ./out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TRACES=${TRACES:-../shared/traces/acr-run-1.jsonl.gz}
mkdir -p out
.venv/bin/agentspec models pull smollm2-135m
.venv/bin/agentspec bench --backend replay --traces "$TRACES" --sessions 20 \
  --methods plain,ngram,suffix,full --json out/bench.json --plot out/bench.png
