"""The sandboxes a run's environment claims, kept running by the embedded stack for `rollout train`.

Contract:
- `sandbox_process(settings, kind=, seats=, count=, import_path=)` is one supervised service per kind,
  `Sandboxes-KIND` (the kind's letters and digits): a `rollout sandbox serve --count COUNT` process serving
  `count` sandboxes of `kind` (`shell`, or an environment's own `package.module:attribute`), `seats` seats
  each, named `stack-0` … in their pool. Each sandbox listens on a free port (it registers its address in its
  pool); the process imports environments from where the stack's runner does.
- `sandboxes_needed`: one per episode in flight (`run.groups_in_flight` groups of the environment's
  `group_size`), as the runner claims one sandbox per episode.
- `is_sandboxes(name)` tells these services among the supervised ones: `up` keeps those `rollout train` asked
  for, `down` stops them, `status` shows each (`sandboxes_status`: its pool, its count, its isolation in
  words). Asking again for a kind with another count or seats replaces its service.
"""

from __future__ import annotations

import os
import re
import sys

from rollout.config import Settings
from rollout.isolation import SandboxIsolation, said
from rollout.stack.health import ServiceStatus
from rollout.stack.managed import ManagedProcess
from rollout.stack.supervisor import ServiceSpec

PREFIX = "Sandboxes"


def is_sandboxes(name: str) -> bool:
    return name.startswith(PREFIX)


def sandboxes_needed(settings: Settings, group_size: int) -> int:
    return max(1, settings.run.groups_in_flight * group_size)


def sandbox_process(
    settings: Settings, *, kind: str, seats: int, count: int, import_path: list[str]
) -> ManagedProcess:
    return ManagedProcess(
        name=f"{PREFIX}-{re.sub(r'[^A-Za-z0-9]+', '-', kind).strip('-')}",
        command=(
            sys.executable,
            "-m",
            "rollout.cli",
            "sandbox",
            "serve",
            "--kind",
            kind,
            "--name",
            "stack",
            "--seats",
            str(seats),
            "--count",
            str(count),
            f"data_dir={settings.data_path}",
            f"log_level={settings.log_level.value}",
            f"services.postgres.worker_url={settings.worker_ledger_url}",
            f"sandbox.isolation={settings.sandbox.isolation.value}",
        ),
        data_dir=settings.data_path,
        host="127.0.0.1",
        ports=(),
        env=(("PYTHONPATH", os.pathsep.join(import_path)),),
    )


def sandboxes_status(spec: ServiceSpec, pid: int | None) -> ServiceStatus:
    """How `rollout status` shows a sandboxes service: its pool, and how many it serves."""
    argument = {
        flag: spec.command[i + 1] for i, flag in enumerate(spec.command[:-1]) if flag.startswith("--")
    }
    chosen = next((a.split("=", 1)[1] for a in spec.command if a.startswith("sandbox.isolation=")), "bwrap")
    isolation = said(SandboxIsolation(chosen))
    return ServiceStatus(
        name=spec.name.lower(),
        mode="embedded",
        address=f"pool {argument.get('--kind', '?')}",
        healthy=pid is not None,
        detail=f"{argument.get('--count', '?')} sandbox(es) for `rollout train`; {isolation}"
        if pid
        else "not running",
        pid=pid,
    )
