"""placement=ray: an engine as a Ray actor on a Ray cluster (a KubeRay RayCluster, or `ray start --head` here).

Contract:
- `serve_on_ray(...)` connects to the Ray cluster at `address` (None: start a local one), creates one
  `EngineActor` asking Ray for `gpus` GPUs, one CPU and `resources` (a worker group's custom resource), waits until its engine answers, reports its URL (the
  node's address and the port), then blocks while it serves. The actor builds the engine where Ray placed it and
  serves it with its serving follower exactly as `rollout engine serve` does (rollout.engines.factory).
- The actor is owned by the driver: when `rollout engine serve --placement ray` stops (Ctrl-C, SIGTERM, or it
  dies), Ray kills the actor and its engine. A failure to build or serve the engine ends the driver with the
  actor's error (`RayEngineError`).
- Ray is an optional extra (`uv sync --extra ray`); without it `RayUnavailable` says how to install it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.engines.factory import EngineSpec, build_engine, serve_engine
from rollout.engines.follower import FollowerConfig


class RayUnavailable(RuntimeError):
    """Ray is not installed here."""


class RayEngineError(RuntimeError):
    """The engine actor failed; the message carries its error."""


@dataclass(frozen=True)
class BlobAccess:
    """How the actor opens the blob store (the same settings the driver has)."""

    url: str
    s3_endpoint: str | None
    s3_secure: bool


class EngineActor:
    """Builds and serves one engine where Ray placed it (wrapped by `ray.remote` in `serve_on_ray`)."""

    def __init__(
        self,
        spec: EngineSpec,
        port: int,
        follower: FollowerConfig | None,
        ledger_url: str,
        blobs: BlobAccess,
        cache_dir: str,
    ) -> None:
        self.spec, self.port, self.follower = spec, port, follower
        self.ledger_url, self.blobs, self.cache_dir = ledger_url, blobs, cache_dir
        self.url: str | None = None

    async def serve(self) -> None:
        import ray

        from rollout.blobs import open_store

        engine = await asyncio.to_thread(build_engine, self.spec)
        node = ray.util.get_node_ip_address()
        follower = self.follower
        if follower is not None:  # acks name the address the gateway reaches this engine at
            from dataclasses import replace

            follower = replace(follower, url=f"http://{node}:{self.port}")
        serving = asyncio.create_task(
            serve_engine(
                engine,
                host="0.0.0.0",
                port=self.port,
                follower=follower,
                ledger_url=self.ledger_url,
                store=lambda: open_store(
                    self.blobs.url, s3_endpoint=self.blobs.s3_endpoint, s3_secure=self.blobs.s3_secure
                ),
                cache_dir=Path(self.cache_dir),
            )
        )
        await asyncio.sleep(0.5)  # uvicorn binds its port
        if not serving.done():
            self.url = f"http://{node}:{self.port}"
        await serving

    async def address(self) -> str | None:
        return self.url


def serve_on_ray(
    spec: EngineSpec,
    *,
    port: int,
    gpus: float,
    address: str | None,
    follower: FollowerConfig | None,
    ledger_url: str,
    resources: dict[str, float] | None = None,
    blobs: BlobAccess,
    cache_dir: Path,
    report: Callable[[str], None],
    ready_timeout_s: float = 1800.0,
) -> None:
    """Serve `spec` as a Ray actor until interrupted (see the module contract)."""
    try:
        import ray
        from ray.exceptions import RayError
    except ImportError:
        raise RayUnavailable("placement=ray needs Ray: `uv sync --extra ray`") from None
    connect_ray(ray, address)
    try:
        actor_class: Any = ray.remote(num_cpus=1, num_gpus=gpus, resources=dict(resources or {}))(EngineActor)
        actor = actor_class.remote(spec, port, follower, ledger_url, blobs, str(cache_dir))
        serving = actor.serve.remote()
        url = _wait_for_address(ray, actor, serving, ready_timeout_s)
        report(f"{spec.describe()} serving as a Ray actor at {url} ({gpus:g} GPU)")
        try:
            ray.get(serving)
        except RayError as error:
            raise RayEngineError(f"the engine actor stopped: {error}") from error
    finally:
        ray.shutdown()


def _wait_for_address(ray: Any, actor: Any, serving: Any, timeout_s: float) -> str:
    from ray.exceptions import RayError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = ray.wait([serving], timeout=0)
        if done:
            try:
                ray.get(serving)
            except RayError as error:
                raise RayEngineError(f"the engine actor could not start: {error}") from error
            raise RayEngineError("the engine actor stopped before it served")
        url = ray.get(actor.address.remote())
        if url is not None:
            return str(url)
        time.sleep(0.5)
    raise RayEngineError(f"the engine actor did not serve within {timeout_s:.0f} s")


def connect_ray(ray: Any, address: str | None) -> None:
    """Join the Ray cluster at `address` (RAY_ADDRESS when None and set), else start a local one without its
    dashboard (Ray refuses start-up options when it joins a running cluster)."""
    import os

    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, configure_logging=False)
    else:
        ray.init(include_dashboard=False, configure_logging=False)
