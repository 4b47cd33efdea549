"""Helpers for tests and benchmarks that start their own embedded stack on free ports in a temporary directory."""

from __future__ import annotations

from pathlib import Path

from rollout import config
from rollout.net import free_port


def isolated_overrides(data_dir: Path, *, gateway: bool = False) -> list[str]:
    """Overrides that put a whole stack in `data_dir` on ports nothing else uses (the gateway off unless asked)."""
    return [
        f"services.gateway.enabled={str(gateway).lower()}",
        f"data_dir={data_dir}",
        f"services.postgres.port={free_port()}",
        f"services.temporal.port={free_port()}",
        f"services.temporal.ui_port={free_port()}",
        f"services.gateway.port={free_port()}",
        f"services.gateway.engine_port={free_port()}",
    ]


def isolated_settings(data_dir: Path) -> config.Settings:
    return config.load(isolated_overrides(data_dir))
