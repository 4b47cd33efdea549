"""Temporal over mutual TLS: a client rollout makes connects with the certificate `services.temporal.tls_*`
names, and without it (or with a stranger's) gets nowhere. The test stack's dev Temporal speaks no TLS, so a
TLS front stands before it (tests/tls_front.py) as a Temporal cluster's listener would: it requires a client
certificate its CA signed."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from rollout.config import ConfigError, Settings, TemporalSettings, load
from rollout.control.connections import connect_temporal
from rollout.control.errors import ControlError, Unreachable
from rollout.stack.health import cluster_status
from tests.tls_front import make_pki, tls_front


def _through(settings: Settings, address: str, **tls: str) -> Settings:
    temporal = replace(settings.services.temporal, address=address, **tls)
    return replace(settings, services=replace(settings.services, temporal=temporal))


async def test_only_a_client_with_the_cas_certificate_reaches_temporal(
    stack_settings: Settings, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    upstream = (stack_settings.services.temporal.host, stack_settings.services.temporal.port)
    with tls_front(pki, upstream) as front:
        trusted = _through(
            stack_settings,
            front.address,
            tls_ca=str(pki.ca),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
        )
        client = await connect_temporal(trusted)
        assert await client.service_client.check_health()
        listed = await client.count_workflows()
        assert listed.count >= 0, "the namespace answers a query through the front"

        for name, attempt in {
            "no TLS at all": _through(stack_settings, front.address),
            "the CA but no client certificate": _through(stack_settings, front.address, tls_ca=str(pki.ca)),
            "a stranger's certificate": _through(
                stack_settings,
                front.address,
                tls_ca=str(pki.ca),
                tls_cert=str(pki.stranger_cert),
                tls_key=str(pki.stranger_key),
            ),
        }.items():
            with pytest.raises(Unreachable):
                async with asyncio.timeout(60):
                    await connect_temporal(attempt)
            print(f"refused: {name}")

        status = await asyncio.to_thread(cluster_status, trusted, None, None)
        temporal = next(s for s in status if s.name == "temporal")
        assert temporal.healthy, temporal.detail

    missing = _through(stack_settings, "127.0.0.1:1", tls_ca=str(tmp_path / "no-such-ca.crt"))
    with pytest.raises(ControlError, match=r"services\.temporal\.tls_ca names .*no-such-ca\.crt"):
        await connect_temporal(missing)


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ConfigError, match=r"services\.temporal\.tls_cert"):
        load(["services.temporal.tls_cert=/etc/rollout/client.crt"])
    settings = load(["services.temporal.tls_cert=/c.crt", "services.temporal.tls_key=/c.key"])
    assert isinstance(settings.services.temporal, TemporalSettings)
    assert settings.services.temporal.tls_key == "/c.key"
