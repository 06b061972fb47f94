#!/usr/bin/env bash
# Stop the dev Slurm (every node's slurmd, slurmctld, slurmdbd). --wipe also deletes its state folder AND its accounting
# database (always together: a fresh state folder restarts job ids at 1, and old accounting rows
# would then answer for new jobs).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
wipe=0
for arg in "$@"; do
    case "$arg" in
        --wipe) wipe=1 ;;
        *) die "unknown argument $arg (usage: down.sh [--wipe])" ;;
    esac
done
for d in $(slurmd_daemons) slurmctld slurmdbd; do
    if stop_daemon "$d"; then say "stopped $d"; else say "$d was not running"; fi
done
# munged is left running: other software on the machine may use it, and it holds no state of ours.
if (( wipe )); then
    rm -rf "$STATE"
    say "removed state folder $STATE"
    if drop_db 2>/dev/null; then say "dropped accounting database $DB_NAME"; else say "could not reach MariaDB to drop $DB_NAME"; fi
    for f in slurm.conf gres.conf slurmdbd.conf; do
        if [[ -L "$ETC/$f" ]]; then rm -f "$ETC/$f"; fi
    done
fi
