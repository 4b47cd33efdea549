"""Inside a command seat's jail: the jail's one way out, and the command it runs.

Run as `python -I -S relay.py PORT SOCKET [PORT SOCKET ...] -- COMMAND...` on the bare interpreter (it imports
the standard library only, and nothing of rollout: the jail has neither). For each pair it listens on
127.0.0.1:PORT of the jail's own loopback and pumps every connection's bytes both ways to the Unix socket
SOCKET, where a process outside the jail decides what that reaches: a seat proxy (rollout.sandbox.seat_proxy)
lets through only the seat's own gateway routes, an endpoint bridge (rollout.sandbox.endpoint_bridge) one
declared `host:port`. It runs COMMAND (stdin empty, stdout and stderr its own) and exits with its exit code,
128 + N for a signal N. It is the jail's first process: when it exits, the PID namespace ends, and whatever
the command left running ends with it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading

CHUNK = 64 * 1024


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, path: str) -> None:
    with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        try:
            upstream.connect(path)
        except OSError:
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    pairs = argv[: argv.index("--")] if "--" in argv else []
    command = argv[len(pairs) + 1 :]
    if not pairs or len(pairs) % 2 or not command:
        print("usage: relay.py PORT SOCKET [PORT SOCKET ...] -- COMMAND...", file=sys.stderr)
        return 2
    for port, path in zip(pairs[::2], pairs[1::2], strict=True):
        listener = socket.create_server(("127.0.0.1", int(port)), backlog=64)
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        code = subprocess.call(command, stdin=subprocess.DEVNULL)
    except OSError as error:
        print(f"the agent command {command[0]!r} did not start: {error}", file=sys.stderr)
        return 127
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
