"""The minecraft sandbox kind: a real flying-squid world and real mineflayer bots (the pinned npm packages,
installed once per machine), served over HTTP as a sandbox.

What must hold: every bot sees the other three and stays where a task's setup put it; a claim's epoch gets a
fresh world and an older epoch can neither act nor reopen; a world whose process is killed answers "lost"
until the next claim brings a fresh one; placing is decided by the server (two bots placing into one cell: one
wins, the other is told) and chat cannot run the server's commands; the install fails with a clear next step
without npm or a reachable registry; and 4 bots acting for a while leak neither processes nor memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchmarks.minecraft import processes_in_session, rss_mb, session_of
from rollout.net import serving
from rollout.sandbox import SandboxClient, SandboxSuperseded
from rollout.sandbox.client import SandboxActionError, SandboxLost
from rollout.sandbox.keys import kind_key
from rollout.sandbox.minecraft import BOT_NAMES, MinecraftWorld
from rollout.sandbox.minecraft.install import MinecraftInstallError, ensure_installed
from rollout.sandbox.server import build_sandbox_app
from tests.sandboxutil import SANDBOX_KEY, claimed_seat

SEATS = 4
# The soak's length: 30 s here (CI), ten minutes with ROLLOUT_MINECRAFT_SOAK_S=600 (benchmarks/RESULTS.md).
SOAK_S = float(os.environ.get("ROLLOUT_MINECRAFT_SOAK_S", "30"))
SOAK_RSS_GROWTH_MB = 120  # the bound: the world's memory after the soak, over its memory after warming up


@contextlib.asynccontextmanager
async def served_world(workdir: Path) -> AsyncIterator[tuple[MinecraftWorld, str]]:
    world = MinecraftWorld(workdir, SEATS)
    try:
        async with serving(
            build_sandbox_app(
                world, kind="minecraft", name="mc", seats=SEATS, key=kind_key(SANDBOX_KEY, "minecraft")
            )
        ) as url:
            yield world, url
    finally:
        await world.close()


def seats(url: str, epoch: int) -> list[SandboxClient]:
    return [
        SandboxClient(claimed_seat(url, "minecraft", "mc", epoch=epoch, seat=s, holder=f"ep{epoch}"))
        for s in range(SEATS)
    ]


async def test_bots_see_each_other_and_each_claim_gets_a_fresh_world(
    tmp_path: Path, minecraft_home: Path
) -> None:
    async with served_world(tmp_path / "world") as (world, url):
        first = seats(url, 1)
        await first[0].open()
        views = await asyncio.gather(*(seat.act({"op": "observe"}) for seat in first))
        for seat, view in enumerate(views):
            assert view["name"] == BOT_NAMES[seat]
            others = {player["name"] for player in view["players"]}
            assert others == set(BOT_NAMES[:SEATS]) - {BOT_NAMES[seat]}, f"{view['name']} sees {others}"
        assert world.sidecar is not None
        node = world.sidecar.world_pid()
        for namespace in ("pid", "net", "mnt"):
            assert os.readlink(f"/proc/{node}/ns/{namespace}") != os.readlink(f"/proc/self/ns/{namespace}"), (
                f"the world's Node process runs in a {namespace} namespace of its own (its jail)"
            )
        mountinfo = await asyncio.to_thread(Path(f"/proc/{node}/mountinfo").read_text)
        mounts = {line.split()[4]: line.split()[5] for line in mountinfo.splitlines()}
        assert mounts[str(minecraft_home)].startswith("ro"), "the world reads its packages, read-only"
        ground = views[0]["ground_y"]
        gold, above = [0, ground + 1, 0], [0, ground + 2, 0]
        await first[0].act({"op": "setup", "blocks": [{"name": "gold_block", "at": gold}]})
        starts = {
            0: [0, ground + 1, 3],
            1: [2, ground + 1, 0],
            2: [-2, ground + 1, 0],
            3: [0, ground + 1, -3],
        }
        for seat, start in starts.items():
            await first[seat].act(
                {"op": "setup", "start": start, "items": [{"name": "red_wool", "count": 2}]}
            )
        # A bot moved just after the world came up stays there (flying-squid once sent it back to its spawn).
        settled = await asyncio.gather(*(first[s].act({"op": "wait", "seconds": 1.5}) for s in starts))
        for seat, view in zip(starts, settled, strict=True):
            x, _, z = view["position"]
            assert [round(x - 0.5), round(z - 0.5)] == starts[seat][::2], (
                f"{view['name']} is at {view['position']}"
            )
        # Two bots place into one cell at once: the server decides, one is told the other got there first.
        placing = [first[s].act({"op": "place", "x": above[0], "y": above[1], "z": above[2]}) for s in (1, 2)]
        outcomes = await asyncio.gather(*placing, return_exceptions=True)
        won = [o for o in outcomes if isinstance(o, dict)]
        lost = [o for o in outcomes if isinstance(o, SandboxActionError)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert "got there first" in str(lost[0]) or "already holds" in str(lost[0])
        column = (await first[0].act({"op": "blocks", "cells": [gold, above]}))["blocks"]
        assert [b["name"] for b in column] == ["gold_block", "red_wool"]
        assert column[1]["placed_by"] in (1, 2) and column[0]["placed_by"] is None
        winner = first[1] if isinstance(outcomes[0], dict) else first[2]
        assert (await winner.act({"op": "dig", "x": above[0], "y": above[1], "z": above[2]}))[
            "dug"
        ] == "red_wool"
        [dug] = (await first[0].act({"op": "blocks", "cells": [above]}))["blocks"]
        assert dug == {"name": "air", "at": above, "placed_by": None}, "a dug block is nobody's any more"
        with pytest.raises(SandboxActionError, match="commands are not allowed"):
            await first[0].act({"op": "chat", "text": "/stop"})  # a model must not run the server's commands
        far = [int(v) + 12 for v in settled[3]["position"]]
        with pytest.raises(SandboxActionError, match="move within"):
            await first[3].act({"op": "dig", "x": far[0], "y": ground, "z": far[2]})
        pid = world.sidecar.pid if world.sidecar else None

        second = seats(url, 2)
        await second[0].open()
        assert world.sidecar is not None and world.sidecar.pid != pid, "a new claim runs a new world"
        column = (await second[0].act({"op": "blocks", "cells": [gold, above]}))["blocks"]
        assert [b["name"] for b in column] == ["air", "air"], "the new world kept the last claim's blocks"
        with pytest.raises(SandboxSuperseded):
            await first[1].act({"op": "observe"})  # a zombie of the older claim cannot act …
        with pytest.raises(SandboxSuperseded):
            await first[1].open()  # … nor reopen the world
        assert (await second[1].act({"op": "observe"}))["name"] == BOT_NAMES[1]
        for seat in first + second:
            await seat.aclose()


async def test_a_killed_world_is_lost_until_the_next_claim(tmp_path: Path, minecraft_home: Path) -> None:
    async with served_world(tmp_path / "world") as (world, url):
        first = seats(url, 1)
        await first[0].open()
        pid = int((tmp_path / "world" / "world.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        for _ in range(100):  # the world notices its process ended within moments
            if world.sidecar is None or world.sidecar.lost:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(SandboxLost, match="lost"):
            await first[2].act({"op": "observe"})
        second = seats(url, 2)
        await second[0].open()
        assert (await second[2].act({"op": "observe"}))["name"] == BOT_NAMES[2]
        for seat in first + second:
            await seat.aclose()


def test_installing_without_npm_or_a_registry_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MinecraftInstallError, match="npm is not on PATH"):
        ensure_installed(tmp_path / "no-npm")
    monkeypatch.undo()
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    with pytest.raises(MinecraftInstallError, match="reaches the npm registry"):
        ensure_installed(tmp_path / "no-registry")


def test_rollout_sandbox_install_installs_minecraft_and_nothing_else(minecraft_home: Path) -> None:
    rollout = [sys.executable, "-m", "rollout.cli", "sandbox", "install"]
    done = subprocess.run([*rollout, "minecraft"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and f"installed in {minecraft_home}" in done.stderr, done.stderr
    done = subprocess.run([*rollout, "shell"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "needs no installing" in done.stderr and "Traceback" not in done.stderr


async def _act_randomly(
    seat: int, client: SandboxClient, ground: int, until: float, counts: list[int]
) -> None:
    rng = random.Random(seat)
    while time.monotonic() < until:
        x, z = rng.randint(-6, 6), rng.randint(-6, 6)
        action = rng.choice(
            [
                {"op": "observe"},
                {"op": "move_to", "x": x, "z": z},
                {"op": "place", "x": x, "y": ground + 1, "z": z},
                {"op": "dig", "x": x, "y": ground + 1, "z": z},
                {"op": "look", "x": x, "y": ground, "z": z},
                {"op": "chat", "text": f"{seat} at {x},{z}"},
            ]
        )
        with contextlib.suppress(SandboxActionError):
            await client.act(action)
        counts[seat] += 1


@pytest.mark.timeout(SOAK_S + 180)
async def test_four_bots_acting_for_a_while_leak_no_processes_or_memory(
    tmp_path: Path, minecraft_home: Path
) -> None:
    async with served_world(tmp_path / "world") as (world, url):
        clients = seats(url, 1)
        await clients[0].open()
        assert world.sidecar is not None
        pid = world.sidecar.world_pid()  # the Node process, in its jail
        assert pid != world.sidecar.pid, "the world runs in a jail, below its own processes"
        ground = (await clients[0].act({"op": "observe"}))["ground_y"]
        for seat, client in enumerate(clients):
            await client.act(
                {"op": "setup", "items": [{"name": "stone", "count": 64}], "start": [seat * 2, ground + 1, 0]}
            )
        counts = [0] * SEATS
        warm = time.monotonic() + min(15.0, SOAK_S / 3)
        await asyncio.gather(*(_act_randomly(s, c, ground, warm, counts) for s, c in enumerate(clients)))
        warmed_rss, processes = rss_mb(pid), processes_in_session(session_of(pid))
        end = time.monotonic() + SOAK_S
        await asyncio.gather(*(_act_randomly(s, c, ground, end, counts) for s, c in enumerate(clients)))
        final_rss = rss_mb(pid)
        assert min(counts) > 10, f"the bots barely acted: {counts}"
        # Node, and at most the jail's own init beside it in the session the jail made.
        assert processes_in_session(session_of(pid)) == processes <= 2, (
            "the world runs one process, spawns none"
        )
        assert final_rss - warmed_rss < SOAK_RSS_GROWTH_MB, (
            f"the world grew {final_rss - warmed_rss:.0f} MB in {SOAK_S:g}s ({warmed_rss:.0f} → {final_rss:.0f})"
        )
        for client in clients:
            await client.aclose()
