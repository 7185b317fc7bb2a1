# Sourced by scripts that start OpenAI-compatible servers on free loopback ports and stop
# them, by process id, when the script exits (real_agent.sh, serve_bench.sh).
#
#   start_server NAME LOG COMMAND...   COMMAND gets `--port PORT` appended; sets $url once
#                                      /health answers (the first agentspec serve on a machine
#                                      measures its cost profile: minutes)
#   stop_servers                       stop every server started so far

server_pids=()

stop_servers() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${server_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  server_pids=()
}

start_server() {
  local name=$1 log=$2 port
  shift 2
  port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  "$@" --port "$port" >"$log" 2>&1 &
  server_pids+=($!)
  url=http://127.0.0.1:$port
  .venv/bin/python - "$url" "$!" "$log" "$name" <<'PY'
import os, sys, time
import httpx
url, pid, log, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
deadline = time.monotonic() + 1200
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"error: the {name} server exited at start:\n{open(log).read()}")
    try:
        if httpx.get(url + "/health", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(1)
sys.exit(f"error: the {name} server did not answer at {url} in 20 minutes (log: {log})")
PY
  echo "[servers] $name at $url (pid ${server_pids[-1]})"
}
