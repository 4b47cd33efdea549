"""Gateway throughput and added latency, against the engine called directly and against LiteLLM's proxy.

Three paths to one scripted engine (benchmarks.scripted_backend), each server its own process on this machine:
- direct: the client calls the engine's chat endpoint itself (the baseline for added latency);
- rollout: the client calls `rollout gateway` through a seat; the gateway renders, admits, samples over vLLM's
  dialect and records every turn in Postgres before answering (recording on);
- litellm: the client calls LiteLLM's proxy, which forwards to the engine's chat endpoint.
At concurrency 1, 16 and 64, every request is a new conversation (no replay shortcut). Reported: turns/s and
p50/p99 latency per path, added p50 over direct at concurrency 1, and rollout's throughput over LiteLLM's.
Targets (issue 20): >= 3x LiteLLM's throughput at concurrency 64; added p50 <= 3 ms at concurrency 1.
Streaming (issue 16): the same engine streams one token every 10 ms; one streaming request at a time, direct
and through the gateway, each a new conversation. Reported: p50 time to the first content delta the client
reads, and the gateway's added p50 over direct (target <= 5 ms).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import httpx

from rollout.net import free_port
from rollout.stack.processes import terminate, wait_for_http

CONCURRENCY = (1, 16, 64)
ROLLOUT = str(Path(sys.executable).parent / "rollout")
LITELLM = str(Path(sys.executable).parent / "litellm")


async def _load(url: str, headers: list[dict[str, str]], concurrency: int, requests: int) -> dict[str, float]:
    """`requests` new conversations from `concurrency` workers, each with a connection of its own. The client
    is aiohttp's: at concurrency 64 httpx's pool cost the client most of a core (the direct path fell from
    1,162 turns/s at c=16 to 253 at c=64), which on two cores the servers under test then lacked."""
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)

    async def post(
        session: aiohttp.ClientSession, body: dict[str, Any], seat_headers: dict[str, str]
    ) -> None:
        async with session.post(url, json=body, headers=seat_headers) as response:
            text = await response.text()
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}: {text[:200]}")

    async def worker(session: aiohttp.ClientSession, seat_headers: dict[str, str]) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            body = {
                "model": "base",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question {n} {uuid.uuid4().hex[:8]}"}],
            }
            started = time.perf_counter()
            await post(session, body, seat_headers)
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        # One request per worker, at once, before the clock starts: every connection is open and every server
        # pool has grown (at concurrency 64 that first wave took a few hundred ms of a one-second phase).
        warm = {"model": "base", "max_tokens": 4, "messages": [{"role": "user", "content": "warm"}]}
        await asyncio.gather(*[post(session, warm, headers[i % len(headers)]) for i in range(concurrency)])
        started = time.perf_counter()
        await asyncio.gather(*[worker(session, headers[i % len(headers)]) for i in range(concurrency)])
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "turns_per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def _has_content(data: str) -> bool:
    choices = json.loads(data).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


async def _first_token(url: str, headers: dict[str, str], requests: int) -> dict[str, float]:
    """Stream one request at a time; the time to the first content delta and to the end of the stream."""
    firsts: list[float] = []
    totals: list[float] = []
    async with httpx.AsyncClient(timeout=60) as client:
        for n in range(requests + 1):  # the first opens the connection and is not counted
            body = {
                "model": "base",
                "stream": True,
                "messages": [{"role": "user", "content": f"stream {n} {uuid.uuid4().hex[:8]}"}],
            }
            started = time.perf_counter()
            first: float | None = None
            async with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"{url} answered {response.status_code}")
                async for line in response.aiter_lines():
                    if first is None and line.startswith("data: {") and _has_content(line[6:]):
                        first = time.perf_counter() - started
            if n and first is not None:
                firsts.append(first)
                totals.append(time.perf_counter() - started)
    return {
        "ttft_p50_ms": 1000 * statistics.median(firsts),
        "ttft_p90_ms": 1000 * sorted(firsts)[int(0.9 * (len(firsts) - 1))],
        "total_p50_ms": 1000 * statistics.median(totals),
    }


@dataclass(frozen=True)
class GatewayUnderTest:
    backend: str  # the scripted engine's base URL
    gateway: str  # the gateway's base URL
    seats: list[dict[str, str]]  # the headers of 4 seats


def start_gateway(
    overrides: list[str], log: BinaryIO, processes: list[subprocess.Popen[bytes]]
) -> GatewayUnderTest:
    """A scripted engine and `rollout gateway` in front of it, on the stack `overrides` name, with 4 seats;
    their processes are appended to `processes` (the caller stops them)."""
    from transformers import AutoTokenizer

    from rollout.engines.models import TINY_QWEN3, resolve

    models_dir = Path(
        os.environ.get("ROLLOUT_TEST_MODELS_DIR", Path.home() / ".cache" / "rollout-tests" / "models")
    )
    tokenizer = AutoTokenizer.from_pretrained(resolve(TINY_QWEN3, models_dir))
    ids = [
        *tokenizer.encode("Hello from the script.", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]
    backend_port, gateway_port = free_port(), free_port()
    processes.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.scripted_backend",
                "--port",
                str(backend_port),
                "--ids",
                ",".join(map(str, ids)),
            ],
            stdout=log,
            stderr=log,
        )
    )
    backend = f"http://127.0.0.1:{backend_port}"
    processes.append(
        subprocess.Popen(
            [
                ROLLOUT,
                "gateway",
                "--model",
                "tiny-qwen3",
                "--port",
                str(gateway_port),
                "--engine-url",
                backend,
                f"models_dir={models_dir}",
                *overrides,
                # 64 workers share 4 seats: the load is the throughput, not one seat's fairness.
                "services.gateway.max_turns_in_flight_per_seat=64",
            ],
            stdout=log,
            stderr=log,
        )
    )
    wait_for_http(f"{backend}/health", processes[-2])
    wait_for_http(f"http://127.0.0.1:{gateway_port}/health", processes[-1])
    seats = [
        json.loads(
            subprocess.run(
                [ROLLOUT, "seat", "new", "--json", *overrides], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(4)
    ]
    return GatewayUnderTest(
        backend,
        f"http://127.0.0.1:{gateway_port}",
        [{"authorization": f"Bearer {s['api_key']}"} for s in seats],
    )


def main(quick: bool = False) -> int:
    from benchmarks.stack import bench_stack

    requests_for = {1: 200, 16: 640, 64: 1280} if not quick else {1: 10, 16: 32, 64: 64}
    processes: list[subprocess.Popen[bytes]] = []
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-gw-") as scratch,
        open(Path(scratch) / "servers.log", "wb") as log,
        bench_stack(Path(scratch)) as bench,
    ):
        try:
            served = start_gateway(bench.overrides, log, processes)
            backend = served.backend
            litellm_port = free_port()
            master_key = f"sk-{uuid.uuid4().hex}{uuid.uuid4().hex}"
            config = Path(scratch) / "litellm.yaml"
            config.write_text(
                json.dumps(
                    {
                        "model_list": [
                            {
                                "model_name": "base",
                                "litellm_params": {
                                    "model": "openai/base",
                                    "api_base": f"{backend}/v1",
                                    "api_key": "none",
                                },
                            }
                        ]
                    }
                )
            )
            processes.append(
                subprocess.Popen(
                    [LITELLM, "--config", str(config), "--port", str(litellm_port), "--num_workers", "1"],
                    stdout=log,
                    stderr=log,
                    env={**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": master_key},
                )
            )
            wait_for_http(f"http://127.0.0.1:{litellm_port}/health/liveliness", processes[-1])
            paths = {
                "direct": (f"{backend}/v1/chat/completions", [{}]),
                "rollout": (f"{served.gateway}/v1/chat/completions", served.seats),
                "litellm": (
                    f"http://127.0.0.1:{litellm_port}/v1/chat/completions",
                    [{"authorization": f"Bearer {master_key}"}],
                ),
            }
            results: dict[str, dict[int, dict[str, float]]] = {name: {} for name in paths}
            for concurrency in CONCURRENCY:
                for name, (url, headers) in paths.items():
                    results[name][concurrency] = asyncio.run(
                        _load(url, headers, concurrency, requests_for[concurrency])
                    )
                    r = results[name][concurrency]
                    print(
                        f"{name:>8} c={concurrency:<3} {r['turns_per_s']:8.1f} turns/s  p50 {r['p50_ms']:7.2f} ms"
                        f"  p99 {r['p99_ms']:7.2f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
            streaming: dict[str, dict[str, float]] = {}
            for name in ("direct", "rollout"):
                url, headers = paths[name]
                streaming[name] = asyncio.run(_first_token(url, headers[0], 20 if quick else 100))
                r = streaming[name]
                print(
                    f"{name:>8} streaming  first token p50 {r['ttft_p50_ms']:7.2f} ms  p90 {r['ttft_p90_ms']:7.2f} ms"
                    f"  whole reply p50 {r['total_p50_ms']:7.2f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for process in processes:
                terminate(process.pid)
    summary: dict[str, Any] = {
        "benchmark": "gateway",
        "machine": f"{os.uname().machine} {os.cpu_count()} cpus",
    }
    for name, by_c in results.items():
        for c, r in by_c.items():
            summary[f"{name}_c{c}_turns_per_s"] = round(r["turns_per_s"], 1)
            summary[f"{name}_c{c}_p50_ms"] = round(r["p50_ms"], 2)
            summary[f"{name}_c{c}_p99_ms"] = round(r["p99_ms"], 2)
    summary["rollout_added_p50_ms_c1"] = round(
        results["rollout"][1]["p50_ms"] - results["direct"][1]["p50_ms"], 2
    )
    summary["litellm_added_p50_ms_c1"] = round(
        results["litellm"][1]["p50_ms"] - results["direct"][1]["p50_ms"], 2
    )
    summary["rollout_over_litellm_c64"] = round(
        results["rollout"][64]["turns_per_s"] / results["litellm"][64]["turns_per_s"], 2
    )
    for name, r in streaming.items():
        summary[f"{name}_stream_ttft_p50_ms"] = round(r["ttft_p50_ms"], 2)
        summary[f"{name}_stream_ttft_p90_ms"] = round(r["ttft_p90_ms"], 2)
        summary[f"{name}_stream_total_p50_ms"] = round(r["total_p50_ms"], 2)
    summary["rollout_added_ttft_p50_ms"] = round(
        streaming["rollout"]["ttft_p50_ms"] - streaming["direct"]["ttft_p50_ms"], 2
    )
    summary["target_added_ttft_5ms_met"] = summary["rollout_added_ttft_p50_ms"] <= 5
    summary["target_3x_litellm_met"] = summary["rollout_over_litellm_c64"] >= 3
    summary["target_added_p50_3ms_met"] = summary["rollout_added_p50_ms_c1"] <= 3
    print(json.dumps(summary))
    return 0
