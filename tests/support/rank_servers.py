"""The rank servers the suite's local jobs started (ggpo_batch/common/rank_client.py), ended with it.

A server ends by itself after GGPO_RANK_SERVER_IDLE_SECONDS (600 s by default, and the workers the
tests start drop the suite's GGPO_ variables); the suite does not leave its idle servers on the
machine that long. One with a live rank is left alone.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ggpo_batch.common import rank_client


def processes() -> list[tuple[int, int, bytes]]:
    """(pid, parent pid, command line) of every live process."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        if fields[0] != "Z":
            out.append((int(proc.name), int(fields[1]), cmd))
    return out


def end_idle_servers() -> list[int]:
    """SIGTERM every rank server of this user's default folder that has no live rank; their pids."""
    try:
        folder = str(rank_client.servers_dir()).encode()
    except OSError:
        return []
    running = processes()
    parents = {ppid for _pid, ppid, _cmd in running}
    matching = {pid for pid, _ppid, cmd in running if rank_client.SERVER_MODULE.encode() in cmd and folder in cmd}
    ended = []
    for pid, ppid, _cmd in running:
        # a forked rank has its server's command line, and its server for a parent
        if pid in matching and ppid not in matching and pid not in parents:
            try:
                os.kill(pid, signal.SIGTERM)
                ended.append(pid)
            except ProcessLookupError:
                pass
    return ended
