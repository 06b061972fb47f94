"""Small network helpers shared by the executors, the training job and the tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now: for torch's rendezvous or a private test server.

    A fixed port can be held by a process a killed run left behind (EADDRINUSE); the kernel's
    choice is free at the moment of asking, which is as good as a single host can do.
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
