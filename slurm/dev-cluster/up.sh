#!/usr/bin/env bash
# Start a real two-node Slurm 22.05 on this host (one slurmd per node, Slurm's multiple-slurmd
# mode), each node declaring 4 GPUs as generic resources (no hardware), slurmdbd on MariaDB. Idempotent: installs only missing packages, rewrites the configs, restarts
# only what is down or whose config changed, and waits until the node is idle and sacct answers.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
t0=$(date +%s.%N)
[[ $EUID -eq 0 ]] || die "run as root (daemons run as SlurmUser=root on this dev cluster)"

# 1. packages
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    } || die "apt-get install ${missing[*]} failed"
else
    say "packages present"
fi
command -v mysql >/dev/null || die "the mysql client is missing (apt-get install mariadb-client)"

# 2. MariaDB reachable (this machine kind starts it; a laptop may need it started)
if ! mysql_admin -e 'SELECT 1' >/dev/null 2>&1; then
    if command -v mariadbd-safe >/dev/null || command -v mysqld_safe >/dev/null; then
        say "starting MariaDB"
        (service mariadb start || service mysql start) >/dev/null 2>&1 || true
        for _ in $(seq 1 50); do mysql_admin -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.2; done
    fi
    mysql_admin -e 'SELECT 1' >/dev/null 2>&1 || die "MariaDB not reachable at $DB_HOST:$DB_PORT as $DB_ADMIN"
fi

# 3. state folder and accounting database live and die together
if [[ ! -d "$STATE/ctld" ]] && db_exists; then
    say "state folder missing but database $DB_NAME exists: dropping it (job ids would collide)"
    drop_db
fi
if [[ -d "$STATE/ctld" ]] && ! db_exists; then
    say "database $DB_NAME missing but state folder exists: wiping $STATE"
    for d in $(slurmd_daemons) slurmd slurmctld slurmdbd; do stop_daemon "$d" || true; done
    rm -rf "$STATE"
fi
mkdir -p "$STATE"/{ctld,d,run,log,etc,dev}
for n in $(node_names); do mkdir -p "$STATE/d/$n"; done
for ((i = 0; i < NODE_GPUS; i++)); do ln -sfn /dev/null "$STATE/dev/gpu$i"; done
mysql_admin <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON \`$DB_NAME\`.* TO '$DB_USER'@'localhost';
GRANT ALL ON \`$DB_NAME\`.* TO '$DB_USER'@'127.0.0.1';
SQL

# 4. configs from the templates; the Slurm clients find them through /etc/slurm symlinks
last_port=$((SLURMD_PORT0 + NODES - 1))
if (( NODES == 1 )); then NODELIST="${NODE_PREFIX}1" PORTS="$SLURMD_PORT0"
else NODELIST="${NODE_PREFIX}[1-$NODES]" PORTS="[$SLURMD_PORT0-$last_port]"; fi
render() {
    sed -e "s|@NODELIST@|$NODELIST|g" -e "s|@PORTS@|$PORTS|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@HOST@|$HOST|g" -e "s|@STATE@|$STATE|g" \
        -e "s|@CPUS@|$NODE_CPUS|g" -e "s|@GPUS@|$NODE_GPUS|g" -e "s|@LAST_GPU@|$((NODE_GPUS - 1))|g" -e "s|@MEM_MB@|$NODE_MEM_MB|g" \
        -e "s|@PARTITION@|$PARTITION|g" -e "s|@DB_HOST@|$DB_HOST|g" -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@DB_USER@|$DB_USER|g" -e "s|@DB_PASS@|$DB_PASS|g" -e "s|@DB_NAME@|$DB_NAME|g" "$HERE/$1.in"
}
changed=0
for f in slurm.conf gres.conf slurmdbd.conf; do
    new="$(render "$f")"
    if [[ ! -f "$STATE/etc/$f" ]] || [[ "$new" != "$(cat "$STATE/etc/$f")" ]]; then
        printf '%s\n' "$new" > "$STATE/etc/$f"
        changed=1
        say "wrote $STATE/etc/$f"
    fi
done
chmod 600 "$STATE/etc/slurmdbd.conf"
mkdir -p "$ETC"
for f in slurm.conf gres.conf slurmdbd.conf; do
    if [[ -e "$ETC/$f" && ! -L "$ETC/$f" ]]; then
        die "$ETC/$f exists and is not ours; move it away or set up this dev cluster elsewhere"
    fi
    ln -sfn "$STATE/etc/$f" "$ETC/$f"
done
# The node names must resolve (a job's first node is its torch MASTER_ADDR): all are this host.
for n in $(node_names); do
    if ! getent hosts "$n" >/dev/null; then
        printf '127.0.0.1 %s  # ggpo dev-cluster\n' "$n" >> /etc/hosts
        say "added $n to /etc/hosts (127.0.0.1)"
    fi
done
if (( changed )); then
    # slurmd: the daemon of the single-node layout, if one is left from before
    for d in $(slurmd_daemons) slurmd slurmctld slurmdbd; do stop_daemon "$d" && say "stopped $d (config changed)" || true; done
fi

# 5. daemons, in dependency order
if ! pid_alive /run/munge/munged.pid; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    [[ -s /etc/munge/munge.key ]] || { mungekey --create >/dev/null 2>&1 || /usr/sbin/mungekey -c; chown munge:munge /etc/munge/munge.key; }
    runuser -u munge -- /usr/sbin/munged
    say "started munged"
fi
munge -n | unmunge >/dev/null || die "munge does not work (see /var/log/munge/munged.log)"

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    local end=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        (( $(date +%s) < end )) || die "timed out waiting for $what (logs in $STATE/log)"
        sleep 0.2
    done
}
if ! pid_alive "$STATE/run/slurmdbd.pid"; then
    slurmdbd
    say "started slurmdbd"
fi
wait_for 30 "slurmdbd" sacctmgr -n list cluster
if [[ -z "$(sacctmgr -n -P list cluster format=cluster where cluster="$CLUSTER")" ]]; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
    say "registered cluster $CLUSTER"
fi
if ! pid_alive "$STATE/run/slurmctld.pid"; then
    slurmctld
    say "started slurmctld"
fi
wait_for 30 "slurmctld" scontrol ping
stop_daemon slurmd >/dev/null && say "stopped the slurmd of the single-node layout" || true
for n in $(node_names); do
    if ! pid_alive "$(daemon_pidfile "slurmd.$n")"; then
        slurmd -N "$n"
        say "started slurmd -N $n"
    fi
done
node_idle() { [[ "$(sinfo -h -N -o %t -n "$1" -p "$PARTITION")" =~ ^(idle|mix|alloc)$ ]]; }
for n in $(node_names); do
    if ! node_idle "$n"; then
        # a node left DOWN/DRAIN by an earlier crash comes back
        scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
    fi
done
for n in $(node_names); do wait_for 30 "node $n to become idle" node_idle "$n"; done
wait_for 30 "sacct" sacct -n -X -S now
t1=$(date +%s.%N)
say "up: cluster $CLUSTER, nodes $NODELIST on $HOST (each $NODE_CPUS cpus, gpu:$NODE_GPUS), partition $PARTITION, state $STATE"
say "ready in $(printf '%.1f' "$(echo "$t1 - $t0" | bc 2>/dev/null || python3 -c "print($t1-$t0)")") s"
