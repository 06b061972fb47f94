#!/usr/bin/env bash
# Start the services the tests talk to, each only if it is not already answering:
# PostgreSQL (127.0.0.1:5432), Redis (127.0.0.1:6379), MariaDB (for slurmdbd) and the
# single-node Slurm of slurm/dev-cluster; Debian's chromium for the dashboard's browser tests.
# Idempotent; prints what it did.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v pg_isready >/dev/null || ! pg_isready -q -h 127.0.0.1 -p 5432; then
  if ! ls /etc/postgresql >/dev/null 2>&1; then
    echo "services: installing PostgreSQL"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  echo "services: starting PostgreSQL"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432

if ! (command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1); then
  if ! command -v redis-server >/dev/null; then
    echo "services: installing Redis"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  echo "services: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.5; done
fi
echo "services: redis $(redis-cli -h 127.0.0.1 -p 6379 ping)"

# The dashboard's browser tests (tests/dashboard) drive Debian's chromium through Playwright;
# nothing is downloaded at test time (never `playwright install`).
if ! command -v chromium >/dev/null; then
  echo "services: installing chromium (headless browser for the dashboard tests)"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

# tests/test_ledger_failures.py runs a PostgreSQL of its own that speaks German: it builds de_DE.UTF-8 into
# its own folder with localedef (LOCPATH), from the locale sources of Debian's `locales` package.
if [ ! -e /usr/share/i18n/locales/de_DE ]; then
  echo "services: installing locale sources (locales)"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq locales >/dev/null
fi

if [ -x slurm/dev-cluster/up.sh ] && [ "${GGPO_NO_SLURM:-0}" != 1 ]; then
  slurm/dev-cluster/up.sh
fi
