"""How each service of a stack is doing, probed from outside: one `ServiceStatus` per service.

Contract: a probe never changes anything and never raises; an unreachable service is `healthy=False` with the
reason in `detail`. Addresses are reported without passwords.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx

from rollout.blobs import open_store
from rollout.config import Settings, TemporalSettings
from rollout.ledger.errors import redact
from rollout.serving.engine_load import fetch_engine_load

Mode = Literal["embedded", "external"]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    mode: Mode
    address: str
    healthy: bool
    detail: str
    pid: int | None = None
    ui_url: str | None = None
    restarts: int = 0  # times the supervisor started it again after it died
    last_exit: str | None = None  # how it last ended, e.g. "killed by SIGKILL"
    # An engine's: the share of prompt tokens its prefix cache held since it started, and its requests in
    # flight (running and waiting), as its /metrics says (rollout.serving.engine_load).
    prefix_cache_hit_rate: float | None = None
    in_flight: int | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def http_status(
    name: str, pid: int | None, url: str, detail: str, *, health: str = "/health"
) -> ServiceStatus:
    try:
        healthy = httpx.get(f"{url}{health}", timeout=3).status_code == 200
    except httpx.HTTPError as error:
        healthy, detail = False, f"unreachable: {type(error).__name__}"
    return ServiceStatus(name=name, mode="embedded", address=url, healthy=healthy, detail=detail, pid=pid)


def postgres_status(url: str, pid: int | None, mode: Mode) -> ServiceStatus:
    from rollout.ledger.errors import LedgerUnreachableError
    from rollout.ledger.migrate import server_and_revision

    try:
        version, revision = server_and_revision(url)
    except LedgerUnreachableError as error:
        detail = f"unreachable: {error.reason}"
        return ServiceStatus(
            name="postgres", mode=mode, address=redact(url), healthy=False, detail=detail, pid=pid
        )
    schema = f"schema {revision}" if revision else "schema not migrated (run `rollout up`)"
    return ServiceStatus(
        name="postgres",
        mode=mode,
        address=redact(url),
        healthy=revision is not None,
        detail=f"PostgreSQL {version}, {schema}",
        pid=pid,
    )


def temporal_status(
    address: str,
    ui_url: str | None,
    namespace: str,
    pid: int | None,
    mode: Mode,
    tls: TemporalSettings | None = None,
) -> ServiceStatus:
    """`tls`: the settings whose `tls_*` files a Temporal of the user's own is reached with."""
    ok, detail = asyncio.run(_check_temporal(address, namespace, tls))
    if ok and ui_url:
        try:
            ui_ok = httpx.get(ui_url, timeout=3).status_code < 500
        except httpx.HTTPError as error:
            ui_ok, detail = False, f"web UI unreachable at {ui_url}: {error}"
        if not ui_ok:
            ok = False
    return ServiceStatus(
        name="temporal", mode=mode, address=address, healthy=ok, detail=detail, pid=pid, ui_url=ui_url
    )


def blobs_status(settings: Settings) -> ServiceStatus:
    url = settings.blob_url
    if url.startswith("file://"):
        root = Path(url.removeprefix("file://"))
        healthy = root.is_dir() and os.access(root, os.W_OK)
        detail = "writable directory" if healthy else "missing or not writable (run `rollout up`)"
        return ServiceStatus(name="blobs", mode="embedded", address=url, healthy=healthy, detail=detail)
    try:
        store = open_store(
            url,
            s3_endpoint=settings.services.blobs.s3_endpoint,
            s3_secure=settings.services.blobs.s3_secure,
        )
        store.exists("__health__")
        return ServiceStatus(
            name="blobs", mode="external", address=url, healthy=True, detail="bucket reachable"
        )
    except Exception as error:  # any client or network failure is an unhealthy store, reported as such
        return ServiceStatus(
            name="blobs", mode="external", address=url, healthy=False, detail=f"unreachable: {error}"
        )


def engine_serves(url: str, api_key: str | None) -> str:
    """What an engine really serves, from its own /v1/models (asked with the engine API key): the base model's
    folder and the checkpoints loaded."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    try:
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=3).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return "not answering /v1/models"
    bases = sorted({Path(str(m.get("root", m["id"]))).name for m in models if m.get("parent") is None})
    loaded = [str(m["id"]) for m in models if m.get("parent") is not None]
    more = f" + {len(loaded)} checkpoint(s): {', '.join(loaded[:3])}{' …' if len(loaded) > 3 else ''}"
    return f"serving {', '.join(bases) or '?'}{more if loaded else ''}"


def engine_status(name: str, pid: int | None, url: str, detail: str, api_key: str | None) -> ServiceStatus:
    """An engine's status: its health, `detail`, and what its /metrics says of its prefix cache and load."""
    status = http_status(name, pid, url, detail)
    load = fetch_engine_load(url, api_key) if status.healthy else None
    if load is None:
        return status
    return replace(
        status,
        detail=f"{detail} · {load.describe()}",
        prefix_cache_hit_rate=load.hit_rate,
        in_flight=load.in_flight,
    )


def engine_opponents(settings: Settings, url: str) -> str:
    """What the engine at `url` says in its newest ack it holds beyond each policy's newest checkpoints (its
    self-play opponents) and its budget for them, as "(opponents held: …; budget N)"; "" when the ledger has
    no ack from it or cannot be read."""
    from rollout.ledger import Ledger
    from rollout.ledger.views import engines

    async def newest() -> list[Any]:
        async with await Ledger.connect(settings.reader_ledger_url) as ledger:
            return await engines(ledger)

    try:
        rows = asyncio.run(asyncio.wait_for(newest(), 5))
    except Exception:  # a probe never raises: the ledger down or unmigrated leaves the line without it
        return ""
    for row in rows:
        if row.url == url:
            held = ", ".join(row.opponents) or "none"
            return f" (opponents held: {held}; budget {row.opponent_budget})"
    return ""


async def _check_temporal(address: str, namespace: str, tls: TemporalSettings | None) -> tuple[bool, str]:
    from temporalio.client import Client

    from rollout.security.temporal_tls import temporal_tls

    try:
        async with asyncio.timeout(5):
            secured = temporal_tls(tls) if tls is not None else False
            client = await Client.connect(address, namespace=namespace, tls=secured)
            healthy = await client.service_client.check_health()
    except Exception as error:  # connection refused, timeout, TLS: all mean "not reachable"
        text = str(error).strip() or type(error).__name__
        return (
            False,
            "unreachable: connection refused" if "ConnectionRefused" in text else f"unreachable: {text}",
        )
    return healthy, f"namespace {namespace}" if healthy else "health check failed"


def cluster_status(
    settings: Settings, gateway_url: str | None, monitor_url: str | None
) -> list[ServiceStatus]:
    """A deployed rollout's services, probed from here: the ledger, Temporal, the blob store, and the gateway
    and dashboard when their URLs are known."""
    services = [
        postgres_status(settings.ledger_url, None, "external"),
        temporal_status(
            settings.temporal_address,
            None,
            settings.services.temporal.namespace,
            None,
            "external",
            tls=settings.services.temporal,
        ),
        blobs_status(settings),
    ]
    if gateway_url:
        services.append(replace(http_status("gateway", None, gateway_url, "answering"), mode="external"))
    if monitor_url:
        dashboard = http_status("monitor", None, monitor_url, "answering", health="/_stcore/health")
        services.append(replace(dashboard, mode="external"))
    return services
