#!/usr/bin/env bash
# The method ladder on both recorded trace files, at batch 1 (lambda 0.2) and batch 16
# (lambda 0.5), with the baselines and full warm (the past outputs every method gets) and cold
# (suffix-cold, full-cold: given nothing), and full with each of its newer mechanisms switched
# off; then the copy bound of each trace (what no copying drafter can beat, on the same
# sessions) and what its frequency source could draft; and at batch 1, the baselines and full
# planned for cheaper drafts (lambda 0.1 and 0.02: what profile-lambda measures for engines at
# batch 1, from MLX on a CPU to a GPU).
# Reports land in results/ladder/ (OUT=... elsewhere: e.g. a held-out split,
# SEED=11 SESSIONS=24 OUT=results/ladder-seed11 bash scripts/ladder.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
TRACES=${TRACES:-../shared/traces}
SESSIONS=${SESSIONS:-32}
SEED=${SEED:-7}
OUT=${OUT:-results/ladder}
STRUCTURE='[["```", "```"], ["<original>", "</original>"], ["<patched>", "</patched>"]]'
METHODS=plain,ngram,suffix,suffix-cold,session,workspace,emission,global,fixed32,agspec,agentspec-s
METHODS=$METHODS,agentspec,full,full-cold,full-no-listings,full-no-frequency,full-no-session-text,full-no-learned-paths,full-no-classes,full-sent-only,full-no-sent-calibration,full-no-token-bias,full-no-extension,full-no-output-lead,full-no-agreement,full-no-blend,full-no-quiet,full-no-blocks
mkdir -p "$OUT"
for trace in acr-run-1 sweagent-gpt4-run-1; do
  for spec in "1 0.2" "16 0.5"; do
    set -- $spec
    out=$OUT/$trace-b$1
    .venv/bin/agentspec bench --backend replay --traces "$TRACES/$trace.jsonl.gz" \
      --sessions "$SESSIONS" --seed "$SEED" --batch "$1" --lambda "$2" --methods "$METHODS" \
      --structure "$STRUCTURE" --json "$out.json" --plot "$out.png" | tee "$out.txt"
  done
  for lam in 0.1 0.02; do
    out=$OUT/$trace-b1-lam$lam
    .venv/bin/agentspec bench --backend replay --traces "$TRACES/$trace.jsonl.gz" \
      --sessions "$SESSIONS" --seed "$SEED" --batch 1 --lambda "$lam" \
      --methods plain,suffix,suffix-cold,full --structure "$STRUCTURE" --json "$out.json" \
      --plot "$out.png" | tee "$out.txt"
  done
  .venv/bin/python scripts/copy_bound.py --traces "$TRACES/$trace.jsonl.gz" \
    --sessions "$SESSIONS" --seed "$SEED" --context 1,2,3,4 --frequency \
    --json "$OUT/$trace-bound.json" | tee "$OUT/$trace-bound.txt"
done
