"""The sandboxes a run's environment claims, kept running by the embedded stack for `rollout train`.

Contract:
- `sandboxes_role(kind, seats=, count=)` is one supervised role per kind, `Sandboxes-KIND` (the kind's
  letters and digits): a `rollout sandbox serve` process serving `count` sandboxes of `kind` (`shell`, or an
  environment's own `package.module:attribute`), `seats` seats each, named `stack-0` … in their pool. Each
  sandbox listens on a free port (it registers its address in its pool); the process imports environments
  from where the stack's runner does.
- `sandboxes_needed`: one per episode in flight (`run.groups_in_flight` groups of the environment's
  `group_size`), as the runner claims one sandbox per episode.
- `is_sandboxes(name)` tells these services among the supervised ones: `up` keeps those `rollout train` asked
  for, `down` stops them, `status` shows each (`sandboxes_status`: its pool, its count, its isolation in
  words). Asking again for a kind with another count or seats replaces its service.
"""

from __future__ import annotations

import re

from rollout.config import Settings
from rollout.config.overrides import setting_given
from rollout.security.isolation import SandboxIsolation, said
from rollout.stack.health import ServiceStatus
from rollout.stack.roles import Role, arguments, arguments_given

PREFIX = "Sandboxes"


def is_sandboxes(name: str) -> bool:
    return name.startswith(PREFIX)


def sandboxes_needed(settings: Settings, group_size: int) -> int:
    return max(1, settings.run.groups_in_flight * group_size)


def _service_name(kind: str) -> str:
    return f"{PREFIX}-{re.sub(r'[^A-Za-z0-9]+', '-', kind).strip('-')}"


def sandboxes_role(kind: str, *, seats: int, count: int) -> Role:
    """The service serving `count` sandboxes of `kind`, `seats` seats each, as the stack's runner claims
    them."""
    return Role(
        name=_service_name(kind),
        command=("sandbox", "serve", *arguments(kind=kind, name="stack", seats=seats, count=count)),
        status=sandboxes_status,
        imports_environments=True,
        on_demand=True,
    )


def sandboxes_status(settings: Settings, pid: int | None, command: tuple[str, ...]) -> ServiceStatus:
    """How `rollout status` shows a sandboxes service: its pool, and how many it serves."""
    given = arguments_given(command)
    chosen = setting_given(command, "sandbox.isolation") or settings.sandbox.isolation.value
    isolation = said(SandboxIsolation(chosen))
    kind = given.get("kind", "?")
    return ServiceStatus(
        name=_service_name(kind).lower(),
        mode="embedded",
        address=f"pool {kind}",
        healthy=pid is not None,
        detail=f"{given.get('count', '?')} sandbox(es) for `rollout train`; {isolation}"
        if pid
        else "not running",
        pid=pid,
    )
