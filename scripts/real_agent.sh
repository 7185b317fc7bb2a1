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

pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT TERM

# serve METHOD: start a server on a free port, wait for its /health; sets $url
serve() {
  local port
  port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  # shellcheck disable=SC2086
  .venv/bin/agentspec serve --method "$1" --port "$port" ${SERVE_ARGS:-} >"$OUT/serve-$1.log" 2>&1 &
  pids+=($!)
  url=http://127.0.0.1:$port
  # the first start on a machine measures its cost profile (minutes)
  .venv/bin/python - "$url" "$!" "$OUT/serve-$1.log" <<'EOF'
import os, sys, time
import httpx
url, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 1200
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"error: agentspec serve exited at start:\n{open(log).read()}")
    try:
        if httpx.get(url + "/health", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(1)
sys.exit(f"error: agentspec serve did not answer at {url} in 20 minutes (log: {log})")
EOF
  echo "[real-agent] $1 server at $url (pid ${pids[-1]})"
}

serve full  # alone while it may measure the machine's cost profile
full=$url
serve plain
plain=$url
.venv/bin/python -m agentspec.agents.mini_swe --plain "$plain" --full "$full" --out "$OUT" \
  --tasks "$TASKS" --steps "${STEPS:-10}" --max-tokens "${MAX_TOKENS:-256}" 2>&1 \
  | tee "$OUT/run.log"
