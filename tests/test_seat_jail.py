"""A command seat's jail (bubblewrap, real processes, a real HTTP server standing in for the gateway): the
command reaches its own seat's routes through the relay and the runner's proxy, and nothing else: no other
seat, no operator route, no path that climbs out, no port of this machine; it reads its program's install and
the paths its seat declares, not the host's files; what it leaves running dies with it."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rollout.config import SandboxIsolation
from rollout.net import serving
from rollout.sandbox.seat_jail import seat_jail
from rollout.sandbox.seat_proxy import allowed

PROBE = r"""
import json, os, socket, subprocess, sys, urllib.request, urllib.error
base, other_port, secret, declared = sys.argv[1:5]
answers = {}
for path in ["/s/tok/v1/models", "/s/other/v1/models", "/operator/runs", "/s/tok/../operator/runs",
             "/s/tok/%2e%2e/operator/runs", "/s/tok%2f..%2foperator"]:
    try:
        answers[path] = urllib.request.urlopen(base + path, timeout=10).read().decode()
    except urllib.error.HTTPError as error:
        answers[path] = error.code
def reaches(port):
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
        return True
    except OSError:
        return False
subprocess.Popen(["setsid", "sleep", "1000.4242"], start_new_session=True)
print(json.dumps({
    "answers": answers,
    "other_port": reaches(other_port),
    "secret": os.path.exists(secret),
    "declared": open(declared).read(),
    "cwd": os.getcwd(),
    "uid": os.getuid(),
}))
"""


async def test_a_command_seat_reaches_its_own_seat_and_nothing_else(tmp_path: Path) -> None:
    seen: list[str] = []

    async def gateway(request: Request) -> PlainTextResponse:
        seen.append(request.url.path)
        return PlainTextResponse(f"gateway {request.url.path}")

    app = Starlette(routes=[Route("/{tail:path}", gateway, methods=["GET", "POST"])])
    (tmp_path / "operator.key").write_text("the host's key")
    declared = tmp_path / "agent-data.txt"
    declared.write_text("the seat's own data")
    elsewhere = socket.create_server(("127.0.0.1", 0))
    async with serving(app) as gateway_url:
        async with seat_jail(
            sys.executable,
            gateway_url=gateway_url,
            token="tok",
            isolation=SandboxIsolation.bwrap,
            readable=[declared],
        ) as seat:
            (seat.workdir / "repo").mkdir()
            done = await seat.run(
                [
                    sys.executable,
                    "-c",
                    PROBE,
                    seat.base_url,
                    str(elsewhere.getsockname()[1]),
                    str(tmp_path / "operator.key"),
                    str(declared),
                ],
                env={},
                cwd="repo",
                timeout_s=60,
                max_output_bytes=64 * 1024,
            )
            workdir = seat.workdir
            assert done.exit_code == 0, done.output
            report = json.loads(done.output.strip().splitlines()[-1])
            assert report["answers"]["/s/tok/v1/models"] == "gateway /s/tok/v1/models"
            refused = {path: code for path, code in report["answers"].items() if path != "/s/tok/v1/models"}
            assert set(refused.values()) == {403}, refused
            assert seen == ["/s/tok/v1/models"], "nothing else reached the gateway"
            assert report["other_port"] is False, "no other port of this machine"
            assert report["secret"] is False and report["declared"] == "the seat's own data"
            assert report["cwd"] == f"{seat.inside}/repo"
        assert not workdir.exists(), "the workspace goes with the jail"
    elsewhere.close()
    assert _sleepers() == [], "what the command left running died with it"


def _sleepers() -> list[Path]:
    return [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == "sleep 1000.4242"]


def _cmdline(process: Path) -> str:
    try:
        return (process / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_the_proxy_lets_through_only_the_seats_own_routes() -> None:
    prefix = "/s/tok/"
    assert allowed("/s/tok/v1/chat/completions?x=1", prefix)
    for path in (
        "/s/toke/v1",
        "/s/tok",
        "/s/tok/../x",
        "/s/tok/%2E%2E/x",
        "/s/tok/a%2Fb",
        "/s/tok/a\\b",
        "/v1/x",
    ):
        assert not allowed(path, prefix), path
