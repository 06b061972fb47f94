#!/bin/sh
# The cron/systemd alternative to RQ scheduling: run tonight's tier once, directly, no queue.
# Usage: tools/nightly/run-nightly.sh [REPO]; env PYTHON (default REPO/.venv/bin/python),
# GGPO_NIGHTLY_OUTPUT (default REPO/results/nightly) and the usual GGPO_DB_URL for the ledger.
# Once per night is enforced by the ledger (a unique (method, tier, night) claim), so a second
# start the same night records nothing new and exits 0.
set -eu
REPO=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
OUT=${GGPO_NIGHTLY_OUTPUT:-$REPO/results/nightly}
cd "$REPO"
exec "$PYTHON" -m ggpo_batch.nightly.night --night "$(date -u +%F)" --output-dir "$OUT"
