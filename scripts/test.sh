#!/usr/bin/env bash
# Run the whole test suite (all tiers) after making sure the environment is set up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
