"""Free ports for tests and benchmarks: outside the range outgoing connections draw their local ports from, so
nothing takes one between its pick and the server binding it."""

from __future__ import annotations

import os
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


def test_processes_given_different_slices_never_pick_the_same_port() -> None:
    import subprocess
    import sys

    from rollout.net import PORT_SLICE_VARIABLE

    def picks(slice_: str) -> set[int]:
        script = "from rollout.net import free_port; print(*(free_port() for _ in range(200)))"
        environment = {**os.environ, PORT_SLICE_VARIABLE: slice_}
        out = subprocess.run(
            [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True
        )
        return set(map(int, out.stdout.split()))

    first, second = picks("0/2"), picks("1/2")
    assert len(first) == len(second) == 200
    assert max(first) < min(second), "the first slice lies wholly below the second"
