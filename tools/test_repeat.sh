#!/usr/bin/env bash
# Flake hunting: run the tests matching K (a pytest -k expression) N times each (pytest-repeat, from
# the dev extra), optionally beside BUSY CPU-bound processes, and report each failure with its seed
# and log. Usage (make test-repeat wraps it):
#   tools/test_repeat.sh N K [BUSY] [WORKERS] [PATHS...]
#   make test-repeat N=6 K='preempted' BUSY=3 WORKERS=2
# The log stays in $GGPO_REPEAT_DIR (default: a fresh folder under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:?N: how many times each test}"; k="${2:?K: a pytest -k expression}"
busy="${3:-0}"; workers="${4:-}"; shift $(( $# < 4 ? $# : 4 )) || true
paths=("$@")
py="${PY:-.venv/bin/python}"
out="${GGPO_REPEAT_DIR:-$(mktemp -d /tmp/ggpo-repeat.XXXXXX)}"
mkdir -p "$out"
"$py" -c "import pytest_repeat" 2>/dev/null || { echo "test-repeat: pytest-repeat is missing: make setup (the dev extra has it)" >&2; exit 2; }

hogs=()
stop_hogs() { local p; for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for ((i = 0; i < busy; i++)); do
    "$py" -c "while True: pass" & hogs+=("$!")
done
(( busy )) && echo "test-repeat: $busy CPU-bound processes beside the tests (pids ${hogs[*]})"

xdist=(); [[ -n "$workers" ]] && xdist=(-n "$workers")
# One session: pytest-repeat runs the selection N times over (test ids end [1-N] .. [N-N]); the seed
# is the session's (PYTHONHASHSEED: set orders and hashing).
seed=$(( (RANDOM << 15 | RANDOM) % 4294967295 ))
log="$out/repeat-seed-$seed.log"
start=$(date +%s)
rc=0
PYTHONHASHSEED=$seed "$py" -m pytest -p no:cacheprovider -k "$k" --count "$n" \
    --repeat-scope session "${xdist[@]}" -rfE "${paths[@]}" >"$log" 2>&1 || rc=$?
echo "test-repeat: $(tail -1 "$log" | tr -d '=') in $(( $(date +%s) - start )) s, $n times over, seed $seed"
if (( rc )); then
    grep -E "^(FAILED|ERROR) " "$log" | sed "s|^|    |; s|\$| (seed $seed, log $log)|" || tail -20 "$log"
    echo "test-repeat: rerun with PYTHONHASHSEED=$seed; the full log is $log"
fi
exit "$rc"
