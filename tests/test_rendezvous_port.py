"""The Slurm batch script's rendezvous port (executor/slurm.py RENDEZVOUS_PORT_LINE), run in bash
as the batch host runs it: the job id's port below the ephemeral range, or, where something already
listens on it (seen: another job's rendezvous took the port, EADDRINUSE in rank 0), the next free one."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from ggpo_batch.executor.slurm import RENDEZVOUS_PORT_LINE

JOB_ID = 4242


def _port() -> int:
    out = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={JOB_ID}; {RENDEZVOUS_PORT_LINE}; echo $MASTER_PORT"],
                         capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_job_ids_port_unless_something_listens_on_it() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    derived = 10000 + JOB_ID % (max(low, 11000) - 10000)
    if _listening(derived):  # this machine's own: the rule below still holds
        assert _port() != derived
        return
    assert _port() == derived
    with socket.socket() as held:
        held.bind(("0.0.0.0", derived))
        held.listen()
        port = _port()
    assert port != derived and 10000 <= port < max(low, 11000)
    assert not _listening(port)
