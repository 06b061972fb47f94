#!/usr/bin/env bash
# Print what runs of the dev Slurm and what it answers. Exit 0 only if the node is usable.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ok=1
for d in munged slurmdbd slurmctld $(slurmd_daemons); do
    if pid_alive "$(daemon_pidfile "$d")"; then say "$d running (pid $(cat "$(daemon_pidfile "$d")"))"
    else say "$d NOT running"; ok=0; fi
done
say "state folder: $STATE  config: $ETC/slurm.conf -> $(readlink "$ETC/slurm.conf" 2>/dev/null || echo none)"
if command -v sinfo >/dev/null && (( ok )); then
    sinfo -N -o '%N %t %c %G' || ok=0
    squeue -h -o '%i %j %T' | head -20 || ok=0
    sacct -n -X -S now >/dev/null && say "sacct answers" || { say "sacct does NOT answer"; ok=0; }
fi
(( ok )) && say "usable" || { say "not usable (run slurm/dev-cluster/up.sh)"; exit 1; }
