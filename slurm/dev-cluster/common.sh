# Shared settings of the dev-cluster scripts (sourced, not run). Every value can be overridden
# from the environment, e.g. GGPO_SLURM_STATE=/tmp/myslurm ./up.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${GGPO_SLURM_STATE:-/var/tmp/ggpo-slurm}"
CLUSTER="${GGPO_SLURM_CLUSTER:-ggpo-dev}"
PARTITION="${GGPO_SLURM_PARTITION:-dev}"
# NODES slurmd daemons on this one host (Slurm's multiple-slurmd mode: Debian builds slurmd with it),
# named NODE_PREFIX1..NODE_PREFIXn, each on its own port from SLURMD_PORT0; every node declares
# NODE_CPUS CPUs and NODE_GPUS GPUs. Four: multi-node runs take two, and the test suite runs one
# single-node Slurm test per node at a time (tests/conftest.py), most of them waiting on Slurm.
NODES="${GGPO_SLURM_NODES:-4}"
NODE_PREFIX="${GGPO_SLURM_NODE_PREFIX:-ggpo-dev-n}"
SLURMD_PORT0="${GGPO_SLURM_SLURMD_PORT:-17001}"  # 6817-6819 are slurmctld, slurmd, slurmdbd defaults
NODE_CPUS="${GGPO_SLURM_CPUS:-16}"
NODE_GPUS="${GGPO_SLURM_GPUS:-4}"
NODE_MEM_MB="${GGPO_SLURM_MEM_MB:-16000}"
DB_HOST="${GGPO_SLURM_DB_HOST:-127.0.0.1}"
DB_PORT="${GGPO_SLURM_DB_PORT:-3306}"
DB_ADMIN="${GGPO_SLURM_DB_ADMIN:-root}"
DB_NAME="${GGPO_SLURM_DB_NAME:-ggpo_slurm_acct}"
DB_USER="${GGPO_SLURM_DB_USER:-ggpo_slurmdbd}"
DB_PASS="${GGPO_SLURM_DB_PASS:-ggpo-dev-only}"
ETC=/etc/slurm
HOST="$(hostname -s)"
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd slurm-wlm-mysql-plugin)

say() { printf '[dev-cluster] %s\n' "$*"; }
die() { printf '[dev-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

mysql_admin() { mysql -h "$DB_HOST" -P "$DB_PORT" -u "$DB_ADMIN" --batch --skip-column-names "$@"; }

pid_alive() {  # pid_alive FILE: the process named in FILE is running
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "$NODE_PREFIX$i"; done; }
# this layout's slurmd daemons, and any other node's still running (from a larger layout before)
slurmd_daemons() {
    local n f
    { for n in $(node_names); do echo "slurmd.$n"; done
      for f in "$STATE"/run/slurmd.*.pid; do [[ -e "$f" ]] && basename "$f" .pid; done; } | sort -u
}

daemon_pidfile() {  # munged | slurmdbd | slurmctld | slurmd.<node> (one slurmd per node) | slurmd (before 2 nodes)
    case "$1" in
        munged) echo /run/munge/munged.pid ;;
        *) echo "$STATE/run/$1.pid" ;;
    esac
}

stop_daemon() {  # stop_daemon NAME: SIGTERM, wait up to 10 s, then SIGKILL
    local pidfile pid i
    pidfile="$(daemon_pidfile "$1")"
    pid_alive "$pidfile" || { rm -f "$pidfile"; return 1; }
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
    return 0
}

db_exists() {
    [[ -n "$(mysql_admin -e "SHOW DATABASES LIKE '$DB_NAME'" 2>/dev/null)" ]]
}

drop_db() { mysql_admin -e "DROP DATABASE IF EXISTS \`$DB_NAME\`"; }
