"""`uv run python -m benchmarks minecraft`: how fast a Minecraft world starts, how fast its bots answer with
four of them acting at once, and whether a long session leaks (the soak).

A minecraft sandbox is served over HTTP, as in a run. Each of `STARTS` claims starts a fresh world: the
server's start (listening) and the world's readiness (four bots spawned) are timed. Then four seats act at
once, each in a loop of the tools an agent uses (observe, wait 0 s, look, chat, place and dig next to itself),
for 10 minutes (the soak; `--quick`, which checks that it works, starts 2 worlds and soaks 20 s): every round
trip through the sandbox's HTTP API is timed, and the world's memory and processes are sampled as it goes.
The baseline, in the same run, is the same tools sent to the world's sidecar directly, without HTTP: the
difference is what the sandbox server adds. `move_to` is timed apart: a walk takes game time (about 4 blocks a
second), not round-trip time.

Targets (issue 17): server start ≤ 3 s; tool round trip p50 ≤ 50 ms with 4 bots acting. The soak's bound: the
world's memory grows less than 120 MB from the end of warm-up to the end, and it runs one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollout.harness import SandboxSeat
from rollout.net import serving
from rollout.sandbox import SandboxClient
from rollout.sandbox.client import SandboxActionError
from rollout.sandbox.keys import claim_secret, kind_key
from rollout.sandbox.minecraft import MinecraftWorld
from rollout.sandbox.server import build_sandbox_app

SEATS = 4
STARTS = 5
QUICK_STARTS, QUICK_SOAK_S = 2, 20.0
SERVER_START_TARGET_S = 3.0
ROUND_TRIP_TARGET_MS = 50.0
RSS_GROWTH_BOUND_MB = 120.0


def rss_mb(pid: int) -> float:
    """A process's resident memory, in MB (0 once it is gone)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def session_of(pid: int) -> int:
    """The session a process is in (a jailed world's: the one its jail made for it)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def processes_in_session(pid: int) -> int:
    """How many processes run in the session `pid` leads (a world's sidecar runs in a session of its own)."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == pid:
                count += 1
        except (OSError, IndexError, ValueError):
            continue
    return count


def _action(rng: random.Random, here: list[float], ground: int) -> dict[str, Any]:
    x, z = int(here[0]) + rng.choice((-2, 2)), int(here[2]) + rng.choice((-2, 2))
    return rng.choice(
        [
            {"op": "observe"},
            {"op": "wait", "seconds": 0},
            {"op": "look", "x": x, "y": ground, "z": z},
            {"op": "chat", "text": f"at {x},{z}"},
            {"op": "place", "x": x, "y": ground + 1, "z": z},
            {"op": "dig", "x": x, "y": ground + 1, "z": z},
        ]
    )


async def _act_for(send: Any, seat: int, ground: int, until: float, times: dict[str, list[float]]) -> None:
    rng = random.Random(seat)
    here = (await send(seat, {"op": "observe"}))["position"]
    while time.monotonic() < until:
        action = _action(rng, here, ground)
        started = time.perf_counter()
        with contextlib.suppress(SandboxActionError, ValueError):  # a refusal is a round trip too
            await send(seat, action)
        times.setdefault(action["op"], []).append((time.perf_counter() - started) * 1000)


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


async def run(soak_s: float, starts_wanted: int = STARTS) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="rollout-bench-minecraft-"))
    world = MinecraftWorld(workdir, SEATS)
    epoch = 0
    try:
        key = secrets.token_bytes(32)
        async with serving(
            build_sandbox_app(
                world, kind="minecraft", name="bench", seats=SEATS, key=kind_key(key, "minecraft")
            )
        ) as url:

            def clients(epoch: int) -> list[SandboxClient]:
                return [
                    SandboxClient(
                        SandboxSeat(
                            address=url,
                            kind="minecraft",
                            name="bench",
                            epoch=epoch,
                            seat=s,
                            holder="bench",
                            secret=claim_secret(key, "minecraft", "bench", epoch, "bench"),
                        )
                    )
                    for s in range(SEATS)
                ]

            starts, readies, resets = [], [], []
            for _ in range(starts_wanted):
                epoch += 1
                began = time.monotonic()
                seats = clients(epoch)
                await seats[0].open()
                resets.append(time.monotonic() - began)
                assert world.sidecar is not None and world.sidecar.ready is not None
                starts.append(world.sidecar.ready.listening_ms / 1000)
                readies.append(world.sidecar.ready.ready_ms / 1000)
                for seat in seats:
                    await seat.aclose()
            print(
                json.dumps({"phase": "starts", "server_start_s": starts, "world_ready_s": readies}),
                flush=True,
            )

            seats = clients(epoch)
            sidecar = world.sidecar
            assert sidecar is not None and sidecar.ready is not None
            ground = sidecar.ready.ground_y
            for seat, client in enumerate(seats):
                await client.act(
                    {
                        "op": "setup",
                        "start": [seat * 6, ground + 1, 0],
                        "items": [{"name": "stone", "count": 64}],
                    }
                )

            async def over_http(seat: int, action: dict[str, Any]) -> Any:
                return await seats[seat].act(action)

            async def direct(seat: int, action: dict[str, Any]) -> Any:
                op = action["op"]
                return await sidecar.request(seat, op, {k: v for k, v in action.items() if k != "op"})

            baseline: dict[str, list[float]] = {}
            until = time.monotonic() + min(20.0, soak_s / 3)
            await asyncio.gather(*(_act_for(direct, s, ground, until, baseline) for s in range(SEATS)))
            node = sidecar.world_pid()
            warm_rss = rss_mb(node)

            walks: list[float] = []
            for seat in range(SEATS):
                here = (await seats[seat].act({"op": "observe"}))["position"]
                began = time.monotonic()
                moved = await seats[seat].act({"op": "move_to", "x": int(here[0]) + 8, "z": int(here[2])})
                walks.append((time.monotonic() - began) / max(abs(moved["position"][0] - here[0]), 1))

            times: dict[str, list[float]] = {}
            samples = []
            until = time.monotonic() + soak_s

            async def sample() -> None:
                while time.monotonic() < until:
                    samples.append(
                        {
                            "t_s": round(soak_s - (until - time.monotonic())),
                            "rss_mb": round(rss_mb(node)),
                        }
                    )
                    await asyncio.sleep(min(30.0, soak_s / 10))

            await asyncio.gather(
                sample(), *(_act_for(over_http, s, ground, until, times) for s in range(SEATS))
            )
            final_rss, processes = rss_mb(node), processes_in_session(session_of(node))
            for seat in seats:
                await seat.aclose()
    finally:
        await world.close()
    every = [t for values in times.values() for t in values]
    base = [t for values in baseline.values() for t in values]
    summary = {
        "benchmark": "minecraft",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "server_start_s_p50": round(statistics.median(starts), 3),
        "server_start_s_max": round(max(starts), 3),
        "world_ready_s_p50": round(statistics.median(readies), 3),
        "claim_open_s_p50": round(statistics.median(resets), 3),
        "round_trip_ms_p50": _p50(every),
        "round_trip_ms_p90": round(statistics.quantiles(every, n=10)[-1], 2) if len(every) > 10 else None,
        "round_trip_ms_p50_by_op": {op: _p50(values) for op, values in sorted(times.items())},
        "baseline_direct_ms_p50": _p50(base),
        "actions": len(every),
        "walk_s_per_block": round(statistics.median(walks), 3),
        "soak_s": soak_s,
        "rss_mb_warm": round(warm_rss),
        "rss_mb_end": round(final_rss),
        "rss_samples": samples,
        "world_processes": processes,
        "targets": {
            "server_start_s": SERVER_START_TARGET_S,
            "round_trip_ms_p50": ROUND_TRIP_TARGET_MS,
            "rss_growth_mb": RSS_GROWTH_BOUND_MB,
        },
    }
    summary["met"] = (
        summary["server_start_s_max"] <= SERVER_START_TARGET_S
        and summary["round_trip_ms_p50"] <= ROUND_TRIP_TARGET_MS
        and final_rss - warm_rss < RSS_GROWTH_BOUND_MB
        and processes <= 2  # Node, and the jail's init in the session the jail made for it
    )
    return summary


def main(*, quick: bool = False) -> int:
    summary = asyncio.run(run(QUICK_SOAK_S, QUICK_STARTS) if quick else run(600.0))
    print(json.dumps(summary))
    return 0 if summary["met"] else 1
