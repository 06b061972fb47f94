#!/usr/bin/env bash
# The README's main job on the embedded default: SQLite ledger, in-process queue (memory://),
# local executor. Runs the 5-arm demo experiment on this machine's CPU, then shows what it cost.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
export GGPO_REDIS_URL=memory://
export GGPO_DATA_DIR="${GGPO_DATA_DIR:-$PWD/out/demo}"
echo "demo: ledger and job folders in $GGPO_DATA_DIR"
"$bin/ggpo-batch" db upgrade
"$bin/ggpo-batch" enqueue jobs/demo-cpu.toml
"$bin/ggpo-batch" status -e demo-cpu
"$bin/ggpo-batch" report demo-cpu --plot "$GGPO_DATA_DIR/plots"
"$bin/ggpo-batch" nightly --seeds 42,43,44 --json > "$GGPO_DATA_DIR/nightly-record.json"
"$bin/ggpo-batch" status --components
echo "demo: done. Plots in $GGPO_DATA_DIR/plots, nightly record in $GGPO_DATA_DIR/nightly-record.json"
