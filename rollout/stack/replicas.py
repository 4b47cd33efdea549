"""Engine replicas: `services.engine.replicas` engines serving the stack's model on one machine.

Contract:
- `replica_roles(settings)` are the roles of replicas 2..N (`Engine2`, `Engine3`, …), each with the settings
  it runs with: the stack's engine (`rollout engine serve`: the same kind, model, device and GPU lease) on
  port `services.gateway.engine_port + k - 1`, under its own follower's name (`engine-PORT`). The first is
  the stack's `Engine` role itself. Each acks what it serves in the ledger, signed with the stack's engine
  key, so the gateway routes to every replica it finds (rollout.gateway.routing) and spreads conversations
  over them (rollout.gateway.affinity).
- `is_replica(name)` tells those services among the supervised ones: `up` stops the ones beyond N (fewer
  replicas than before), `down` stops them all.
- `replica_ports(settings)` are the ports the replicas take: other engines of the stack (those of policies on
  models of their own, rollout.stack.policy_engines) are given ports above them.
"""

from __future__ import annotations

from dataclasses import replace

from rollout.config import Settings
from rollout.stack.roles import ENGINE, Role


def is_replica(name: str) -> bool:
    """Whether a supervised service is a replica beyond the first (`Engine2`, …)."""
    return name.startswith(ENGINE.name) and name[len(ENGINE.name) :].isdigit()


def replica_ports(settings: Settings) -> range:
    first = settings.services.gateway.engine_port
    return range(first, first + settings.services.engine.replicas)


def replica_roles(settings: Settings) -> list[tuple[Role, Settings]]:
    roles = []
    for k, port in enumerate(replica_ports(settings), start=1):
        if k == 1:
            continue  # the stack's own Engine role
        gateway = replace(settings.services.gateway, engine_port=port)
        told = replace(settings, services=replace(settings.services, gateway=gateway))
        roles.append((replace(ENGINE, name=f"{ENGINE.name}{k}"), told))
    return roles
