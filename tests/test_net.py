"""Free ports for tests and benchmarks: outside the range outgoing connections draw their local ports from, so
nothing takes one between its pick and the server binding it."""

from __future__ import annotations

import socket
from pathlib import Path

from rollout.net import free_port, port_is_free


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_bound() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(20)]
    assert all(1024 <= port < low or high < port <= 65535 for port in ports), ports
    assert len(set(ports)) == 20, "a stack's ports are picked before any is bound: never the same one twice"
    port = ports[-1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert not port_is_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)
