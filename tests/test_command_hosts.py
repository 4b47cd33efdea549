"""Command hosts (the `command` sandbox kind): a command seat played on a host claimed from its pool rather
than in the runner's jail. The Task's folder travels there and back; the command reaches its own seat and
nothing else; what it leaves in its workspace comes back without anything that leads out of the runner's
folder; the claim is released after; what a host will not do is refused before a command runs. The red team
plays a command host too (tests/test_sandbox_escape.py)."""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import tarfile
import uuid
from pathlib import Path
from typing import cast

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollout.activities.agent_loop import TaskFailed
from rollout.activities.external_loop import CommandHosts, play_external
from rollout.config import ConfigError, SandboxIsolation, load
from rollout.harness import CommandOutcome, CommandSetup, End, Observation, RunContext, Task
from rollout.ledger import Ledger
from rollout.ledger.queries import held_sandbox
from rollout.net import serving
from rollout.sandbox.archive import ArchiveTooLarge, pack, unpack
from rollout.sandbox.claims import SandboxPool
from rollout.sandbox.client import SandboxActionError, SandboxClient
from rollout.sandbox.command_host import CommandHost
from rollout.sandbox.hosting import hosted_sandbox
from rollout.sandbox.keys import kind_key
from rollout.sandbox.private_root import private_root
from rollout.sandbox.remote_seat import RemoteSeat
from rollout.sandbox.world import SandboxSetupError
from tests.sandboxutil import SANDBOX_KEY, claimed_seat

AGENT = r"""
import json, os, pathlib, urllib.request, urllib.error
task = pathlib.Path("task.txt").read_text()
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as error:
        return error.code
own = get(os.environ["OPENAI_BASE_URL"] + "/models")
other = get(os.environ["OPENAI_BASE_URL"].replace("/s/tok/", "/s/other/") + "/models")
pathlib.Path("answer.txt").write_text(task.upper())
os.symlink("/etc/passwd", "passwd")
os.symlink("../../../../../../tmp", "up")
os.mkfifo("pipe")
print(json.dumps({"own": own, "other": other, "home": os.environ["HOME"], "cwd": os.getcwd()}))
"""


class TravellingTask(Task):
    """Prepares a folder for the command; scores what came back of it."""

    def __init__(self) -> None:
        self.outcome: CommandOutcome | None = None
        self.came_back: dict[str, bool] = {}

    async def start(self, run: RunContext) -> Observation:
        return Observation("Shout the task.")

    async def prepare(self, run: RunContext, setup: CommandSetup) -> None:
        (setup.workdir / "repo").mkdir()
        (setup.workdir / "repo" / "task.txt").write_text("the task")
        (setup.workdir / "repo" / "agent.py").write_text(AGENT)
        setup.cwd = "repo"

    async def finish(self, run: RunContext, outcome: CommandOutcome) -> End:
        self.outcome = outcome
        repo = Path(outcome.workdir) / "repo"
        self.came_back = {
            name: (repo / name).exists() or (repo / name).is_symlink()
            for name in ("task.txt", "answer.txt", "passwd", "up", "pipe")
        }
        answer = (repo / "answer.txt").read_text() if (repo / "answer.txt").is_file() else ""
        return End("done", reward=1.0 if answer == "THE TASK" else 0.0)


async def _no_turns() -> int:
    return 0


async def test_a_command_seat_plays_on_a_command_host_and_its_folder_travels_back(
    ledger: Ledger, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def gateway(request: Request) -> JSONResponse:
        seen.append(request.url.path)
        return JSONResponse({"object": "list", "data": []})

    app = Starlette(routes=[Route("/{tail:path}", gateway, methods=["GET", "POST"])])
    kind, name = f"command#t-{uuid.uuid4().hex[:6]}", "host"
    pool = SandboxPool(ledger, SANDBOX_KEY)
    task = TravellingTask()
    context = RunContext(run="cmd-run", episode="cmd-run/0", seat=f"seat-{uuid.uuid4().hex[:6]}")
    async with (
        serving(app) as gateway_url,
        hosted_sandbox(
            ledger, kind, name, seats=1, workdir=tmp_path / "host", key=kind_key(SANDBOX_KEY, kind)
        ),
    ):
        outcome = await play_external(
            task,
            context,
            [sys.executable, "agent.py"],
            base_url=gateway_url,
            token="tok",
            timeout_s=60,
            count_turns=_no_turns,
            hosts=CommandHosts(pool, kind),
        )
        assert task.outcome is not None and task.outcome.exit_code == 0, task.outcome
        report = json.loads(task.outcome.output.strip().splitlines()[-1])
        assert json.loads(report["own"]) == {"object": "list", "data": []} and report["other"] == 403, report
        assert seen == ["/s/tok/v1/models"], "nothing but the seat's own route reached the gateway"
        assert report["cwd"] == "/sandbox/repo" and report["home"] == "/sandbox/home"
        assert outcome.reward == 1.0, "the Task's folder reached the host, and the command's answer came back"
        assert task.came_back == {
            "task.txt": True,
            "answer.txt": True,
            "passwd": False,
            "up": False,
            "pipe": False,
        }, "links leading out of the runner's folder, and a FIFO, stayed behind"
        assert await held_sandbox(ledger, kind, f"{context.run}/{context.seat}") is None, "claim released"

        # A program the host does not have fails the seat, in one line, and frees the host again.
        with pytest.raises(TaskFailed, match="cannot start"):
            await play_external(
                TravellingTask(),
                context,
                ["no-such-agent-cli"],
                base_url=gateway_url,
                token="tok",
                timeout_s=60,
                count_turns=_no_turns,
                hosts=CommandHosts(pool, kind),
            )
        assert await held_sandbox(ledger, kind, f"{context.run}/{context.seat}") is None

        # A claim that asks a command host to reach anything but its seat's gateway is refused.
        box = await pool.registered(kind)
        rogue = claimed_seat(box[0].address, kind, name, epoch=10_000, seat=0, holder="rogue")
        async with SandboxClient(rogue) as client:
            with pytest.raises(SandboxActionError, match="gateway and nothing else"):
                await client.open(network=["gateway", "10.0.0.1:5432"])


def test_a_command_host_jails_or_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(SandboxSetupError, match="bwrap"):
        CommandHost(tmp_path, 1, isolation=SandboxIsolation.none)
    with pytest.raises(ConfigError, match=r"sandbox\.command_pool"):
        load(["sandbox.command_pool=shell"])
    assert load(["sandbox.command_pool='command#big'"]).sandbox.command_pool == "command#big"


async def test_a_claim_cannot_have_a_seat_read_the_hosts_keys_or_anything_off_its_allowlist(
    tmp_path: Path,
) -> None:
    """Whoever holds a claim (a compromised runner) names the seat's `program` and `readable` paths: a command
    host refuses any outside its allowlist (the system's folders, /opt, its own Python, `readable_roots`), and
    its data directory (its key), this user's private root (other seats' workspaces) and its own folder even
    inside one, through a link too."""
    data = tmp_path / "data"
    data.mkdir()
    key = data / "sandbox-command.key"
    key.write_text("the host's key")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "agent.sh").write_text("echo agent")
    (shared / "to-data").symlink_to(data)
    host = CommandHost(tmp_path / "host", 1, readable_roots=[tmp_path], refused_roots=[data])
    (tmp_path / "workspace").mkdir()
    files = base64.b64encode(pack(tmp_path / "workspace")).decode()
    order = {"program": "true", "argv": ["true"], "timeout_s": 30, "files": files}
    gateway = "http://127.0.0.1:9/s/tok"
    refused = [
        {"readable": [str(key)]},
        {"readable": [str(data)]},
        {"readable": [str(shared / "to-data" / key.name)]},
        {"readable": ["/"]},
        {"readable": [str(Path.home())]},
        {"readable": ["/etc/shadow"]},
        {"readable": [str(private_root())]},
        {"program": str(key)},
        {"program": "/usr/../etc/passwd"},
    ]
    for rogue in refused:
        with pytest.raises(ValueError, match="does not let a seat read"):
            await host.act(0, order | rogue, gateway=gateway)
    allowed = await host.act(0, order | {"readable": [str(shared / "agent.sh")]}, gateway=gateway)
    assert allowed["exit_code"] == 0, allowed
    with pytest.raises(ConfigError, match=r"sandbox\.command_readable"):
        load(["sandbox.command_readable=[relative/folder]"])


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, data in entries:
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_an_archive_never_writes_outside_its_folder(tmp_path: Path) -> None:
    hostile = _tar(
        [
            (_entry("ok.txt"), b"fine"),
            (_entry("../escaped.txt"), b"out"),
            (_entry("/tmp/absolute.txt"), b"out"),
            (_entry("link", tarfile.SYMTYPE, "/etc"), b""),
            (_entry("link/passwd"), b"through the link"),
            (_entry("hard", tarfile.LNKTYPE, "/etc/passwd"), b""),
            (_entry("dev", tarfile.CHRTYPE), b""),
        ]
    )
    folder = tmp_path / "in"
    folder.mkdir()
    left_out = unpack(hostile, folder)
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert written == ["link", "link/passwd", "ok.txt", "tmp", "tmp/absolute.txt"], (
        "all of it inside the folder"
    )
    assert not (folder / "link").is_symlink(), (
        "the link to /etc stayed behind: `link/` is a folder of its own"
    )
    assert set(left_out) == {"../escaped.txt", "link", "hard", "dev"}
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute.txt").exists()

    bomb = _tar([(_entry(f"f{i}"), b"x" * 1000) for i in range(20)])
    with pytest.raises(ArchiveTooLarge):
        unpack(bomb, folder, limit_bytes=10_000)
    with pytest.raises(ArchiveTooLarge):
        unpack(bomb, folder, max_entries=5)
    assert not (folder / "f0").exists(), "nothing of a refused archive is written"

    (folder / "sub").mkdir()
    (folder / "sub" / "note").write_text("round trip")
    back = tmp_path / "back"
    back.mkdir()
    assert unpack(pack(folder), back) == []
    assert (back / "sub" / "note").read_text() == "round trip"
    with pytest.raises(ArchiveTooLarge):
        pack(folder, limit_bytes=10)


async def test_a_workspace_the_runner_will_not_take_back_leaves_an_empty_folder(tmp_path: Path) -> None:
    seat = RemoteSeat(
        client=cast(SandboxClient, None), program="x", readable=(), packages=(), workdir=tmp_path, base_url=""
    )
    (tmp_path / "prepared").write_text("the Task's")
    for sent in ("not base64 at all!", base64.b64encode(b"not a tar").decode()):
        await seat._take_back(sent)  # pyright: ignore[reportPrivateUsage]
        assert os.listdir(tmp_path) == [], "nothing half-written, nothing of before"
