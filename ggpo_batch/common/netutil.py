"""Small network helpers shared by the executors, the training job and the tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10_000  # below it, well-known and registered services (the Slurm executor's job ports start here too)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now: for torch's rendezvous or a private test server.

    Chosen below the kernel's ephemeral range: a port the kernel hands out (bind to port 0) is one it
    may give next to any outgoing connection's local end, and between this call and the listener's
    bind a busy host took one that way (EADDRINUSE in a rank's rendezvous). A random port of the range
    below, tried with a bind, stays free unless a listener asks for it by number; the kernel's own
    choice where there is no such range.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(64 if low - _LOWEST >= 1_000 else 0):
        port = rng.randrange(_LOWEST, low)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
