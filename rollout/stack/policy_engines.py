"""The engines of a run's other base models (policies on models of their own), kept running by the embedded
stack for `rollout train`.

Contract:
- `policy_engine_role(model)` is one supervised role per base model, `Engine-MODEL` (the model's letters and
  digits): the stack's engine (`rollout engine serve`: the same kind, device and GPU lease) serving `model`
  on a port of its own. Its follower acks `model`, so the gateway routes the turns of that model's policies to
  it, renders them with its tokenizer, and it loads only that model's checkpoints.
- `policy_engine_settings(settings, model, port)` are the settings it runs with: the stack's, with
  `services.gateway.model` and `engine_port` its own; `policy_engine_port` picks that port: the one it already
  runs on, else the first free one above the stack's engine replicas' (rollout.stack.replicas) that no other
  such engine was given.
- `is_policy_engine(name)` tells these services among the supervised ones: `up` keeps those `rollout train`
  asked for, `down` stops them, `status` shows each (`policy_engine_status`: its model, its address, what it
  serves).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from rollout.config import Settings
from rollout.config.overrides import setting_given
from rollout.net import port_is_free
from rollout.serving.keys import known_engine_api_key
from rollout.stack.health import ServiceStatus, engine_opponents, engine_serves, engine_status
from rollout.stack.replicas import replica_ports
from rollout.stack.roles import ENGINE, Role

PREFIX = "Engine-"
MODEL = "services.gateway.model"
PORT = "services.gateway.engine_port"


def is_policy_engine(name: str) -> bool:
    return name.startswith(PREFIX)


def _service_name(model: str) -> str:
    return PREFIX + re.sub(r"[^A-Za-z0-9]+", "-", model).strip("-")


def policy_engine_role(model: str) -> Role:
    return replace(ENGINE, name=_service_name(model), status=policy_engine_status, on_demand=True)


def policy_engine_settings(settings: Settings, model: str, port: int) -> Settings:
    gateway = replace(settings.services.gateway, model=model, engine_port=port)
    return replace(settings, services=replace(settings.services, gateway=gateway))


def policy_engine_port(settings: Settings, model: str, running: Iterable[tuple[str, tuple[str, ...]]]) -> int:
    """The port `model`'s engine listens on: the one it was given (`running`: each supervised service's name
    and command), else the first free one above the stack's engines' that no other was given."""
    taken: set[int] = set()
    for name, command in running:
        port = setting_given(command, PORT)
        if not is_policy_engine(name) or port is None:
            continue
        if name == _service_name(model):
            return int(port)
        taken.add(int(port))
    gateway = settings.services.gateway
    port = replica_ports(settings)[-1] + 1
    while port in taken or not port_is_free(gateway.engine_host, port):
        port += 1
    return port


def policy_engine_status(settings: Settings, pid: int | None, command: tuple[str, ...]) -> ServiceStatus:
    model = setting_given(command, MODEL) or "?"
    host = setting_given(command, "services.gateway.engine_host") or settings.services.gateway.engine_host
    url = f"http://{host}:{setting_given(command, PORT)}"
    key = known_engine_api_key(settings.data_path)
    detail = f"{model} for its policies; {engine_serves(url, key)}{engine_opponents(settings, url)}"
    return engine_status(_service_name(model).lower(), pid, url, detail, key)
