#!/usr/bin/env bash
# A real third-party agent, mini-swe-agent, on tasks of tasks/ against `agentspec serve`:
# two servers of the embedded default model on free loopback ports (`--method full`, then
# `--method plain`), every model call sent to both and checked identical, the agent's shell
# commands run in a bubblewrap sandbox (agents/mini_swe.py). Writes OUT/summary.json,
# OUT/calls.jsonl (per call: tokens, seconds, AL of each server), OUT/trajectories/,
# OUT/run.log and the servers' logs; the servers are stopped on exit.
#
#   bash scripts/real_agent.sh OUT [TASKS]     TASKS: comma list (default: 3 evaluation tasks)
#
# STEPS (model calls per task, default 10), MAX_TOKENS (per answer, default 256),
# SERVE_ARGS (extra `agentspec serve` options for both) can be set from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/real_agent.sh OUT [TASKS]}
TASKS=${2:-}
for name in ${TASKS//,/ }; do
  if [ ! -f "tasks/$name/task.toml" ]; then
    echo "error: unknown task '$name'; known tasks: $(ls tasks | paste -sd, -)" >&2
    exit 2
  fi
done
AGENTSPEC_SKIP_VLLM=${AGENTSPEC_SKIP_VLLM:-1} bash scripts/setup.sh
.venv/bin/agentspec models pull smollm2-135m >/dev/null
mkdir -p "$OUT"

source scripts/servers.sh
trap stop_servers EXIT
trap 'exit 130' INT TERM

# serve METHOD: an `agentspec serve --method METHOD` server, fresh (what an earlier run
# learned is not taken back); sets $url
serve() {
  # shellcheck disable=SC2086
  start_server "$1" "$OUT/serve-$1.log" .venv/bin/agentspec serve --method "$1" --no-state \
    ${SERVE_ARGS:-}
}

serve full  # alone while it may measure the machine's cost profile
full=$url
serve plain
plain=$url
.venv/bin/python -m agentspec.agents.mini_swe --plain "$plain" --full "$full" --out "$OUT" \
  --tasks "$TASKS" --steps "${STEPS:-10}" --max-tokens "${MAX_TOKENS:-256}" 2>&1 \
  | tee "$OUT/run.log"
