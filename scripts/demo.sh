#!/usr/bin/env bash
# Set up on a fresh machine and run the main job on the embedded default model: the
# four-role coding agent on the first TASKS evaluation tasks (3; TASKS=all runs all 10),
# drafting with agentspec and checked against plain decoding call by call (out/agent), then
# a replay of recorded sessions of public coding agents comparing drafting methods
# (out/bench.*). MAX_TURNS (default 1 here, to keep a CPU run short; the agent's default is
# 3) and TRACES can be set from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
# the demo needs no vLLM: its venv is made by the first `bash scripts/test.sh`
AGENTSPEC_SKIP_VLLM=${AGENTSPEC_SKIP_VLLM:-1} bash scripts/setup.sh
TRACES=${TRACES:-../shared/traces/acr-run-1.jsonl.gz}
mkdir -p out
.venv/bin/agentspec models pull smollm2-135m
TASKS=${TASKS:-3}
limit=(--max-tasks "$TASKS")
[ "$TASKS" = all ] && limit=()
.venv/bin/agentspec run-agent --all "${limit[@]}" --compare --max-turns "${MAX_TURNS:-1}" \
  --out out/agent
if [ -f "$TRACES" ]; then
  .venv/bin/agentspec bench --backend replay --traces "$TRACES" --sessions 20 \
    --methods plain,ngram,suffix,suffix-cold,full,full-cold --json out/bench.json --plot out/bench.png
else
  echo "[demo] no trace file at $TRACES: skipping the replay bench (set TRACES=...)"
fi
