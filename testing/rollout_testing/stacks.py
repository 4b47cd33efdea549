"""Helpers for tests and benchmarks that start their own embedded stack on free ports in a temporary
directory."""

from __future__ import annotations

from pathlib import Path

from rollout import config
from rollout.net import free_port


def isolated_overrides(data_dir: Path, *, gateway: bool = False, monitor: bool = False) -> list[str]:
    """Overrides that put a whole stack in `data_dir` on ports nothing else uses (the gateway and the
    dashboard off unless asked)."""
    return [
        f"services.gateway.enabled={str(gateway).lower()}",
        f"services.monitor.enabled={str(monitor).lower()}",
        f"services.monitor.port={free_port()}",
        f"data_dir={data_dir}",
        f"services.postgres.port={free_port()}",
        f"services.temporal.port={free_port()}",
        f"services.temporal.ui_port={free_port()}",
        f"services.gateway.port={free_port()}",
        f"services.gateway.engine_port={free_port()}",
    ]


def isolated_settings(data_dir: Path) -> config.Settings:
    return config.load(isolated_overrides(data_dir))


def monitor_overrides(settings: config.Settings, models_dir: Path) -> list[str]:
    """A stack's settings as its dashboard gets them (rollout.stack.roles), with the tiny model's tokenizer
    for the transcripts."""
    from rollout.stack.roles import MONITOR, STACK_SECTIONS, service_overrides

    given = service_overrides(settings, *STACK_SECTIONS, *MONITOR.reads)
    return [*given, f"models_dir={models_dir}", "services.gateway.model=tiny-qwen3"]
