"""free_port: a port below the kernel's ephemeral range, free when asked. A port from the kernel's own
choice (bind to 0) is one it may hand next to any outgoing connection, and a rank's rendezvous once
lost its port that way (EADDRINUSE)."""

from __future__ import annotations

import socket

from ggpo_batch.common.netutil import _ephemeral_low, free_port


def test_ports_come_from_below_the_ephemeral_range_and_can_be_listened_on() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert all(10_000 <= p < low for p in ports), ports
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_a_port_someone_listens_on_is_not_offered() -> None:
    listeners = []
    try:
        taken = set()
        for _ in range(20):
            sock = socket.socket()
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            listeners.append(sock)
            taken.add(sock.getsockname()[1])
        assert len(taken) == 20
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for sock in listeners:
            sock.close()
