#!/bin/sh
# The cron/systemd alternative to RQ scheduling: run tonight's tier once, directly, no queue.
# Usage: tools/nightly/run-nightly.sh [REPO] ; env PYTHON (default REPO/.venv/bin/python).
# The once-per-night guard here is a lock file per night (flock + marker), the same rule the
# RQ path enforces with a Redis claim: one run per suite per night, never a silent second one.
set -eu
REPO=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
NIGHT=$(date -u +%F)
OUT=${GGPO_NIGHTLY_OUTPUT:-$REPO/results/nightly}
mkdir -p "$OUT/$NIGHT"
exec 9>"$OUT/$NIGHT/.lock"
flock -n 9 || { echo "nightly $NIGHT: another run holds the lock" >&2; exit 0; }
if [ -e "$OUT/$NIGHT/.claimed" ]; then echo "nightly $NIGHT: already ran" >&2; exit 0; fi
date -u +%FT%TZ > "$OUT/$NIGHT/.claimed"
cd "$REPO"
exec "$PYTHON" -m ggpo_batch.components.night --night "$NIGHT" --output-dir "$OUT"
