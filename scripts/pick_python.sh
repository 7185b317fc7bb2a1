# Sourced by setup.sh: pick_python prints the interpreter the venvs are made with: $PYTHON
# where set; else, of python3 on PATH and the system's /usr/bin/python3 ($PY_CANDIDATES
# instead, where set), the one that runs Python code fastest, of those 3.11 or newer that can
# make a venv. Half of a drafting step is the interpreter's, and builds differ: on this project's
# Linux machines, pyenv's python3 (libpython shared, no profile-guided build) took 1.9x as long
# as Debian's /usr/bin/python3.11 on such a loop, and the drafter's step 1.15x as long.
pick_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  local best="" best_s="" p real s seen=""
  for p in ${PY_CANDIDATES:-python3 /usr/bin/python3}; do
    real=$("$p" -c "import sys; print(sys.executable)" 2>/dev/null) || continue
    case " $seen " in *" $real "*) continue ;; esac
    seen="$seen $real"
    s=$("$p" -c "$PY_SPEED" 2>/dev/null) || continue
    if [ -z "$best" ] || awk "BEGIN { exit !($s < $best_s) }"; then best=$real best_s=$s; fi
  done
  echo "${best:-python3}"
}
# the loop each candidate times (no venv module or no pip to put in one: not a candidate)
PY_SPEED='
import sys, time, venv, ensurepip
assert sys.version_info >= (3, 11)
def loop(n):
    seen, total = {}, 0
    for i in range(n):
        row = [i, i + 1, i + 2]
        seen[i & 255] = row
        total += max(row) - min(row) + len(seen)
    return total
times = []
for _ in range(5):
    start = time.perf_counter()
    loop(40000)
    times.append(time.perf_counter() - start)
print(f"{min(times):.4f}")
'
