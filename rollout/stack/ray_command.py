"""placement=ray for a worker process: a command run by a Ray actor, where Ray placed it, with the GPUs Ray gave.

Contract:
- `run_on_ray(command, gpus=, address=, env=, resources=)` connects to the Ray cluster at `address` (None:
  RAY_ADDRESS, else a local one), creates one `CommandActor` asking Ray for `gpus` GPUs, one CPU and `resources`
  (custom resources: a worker group's), and has it run `command` as its
  child (`rollout worker trainer …`: the node's rollout installation runs it). The child inherits the actor's
  environment, so it sees exactly the GPUs Ray assigned (CUDA_VISIBLE_DEVICES), with `env` on top. Its output
  reaches the driver's stderr line by line (Ray forwards actor output to its driver). It returns the child's exit
  code once the child exits.
- The child is owned by the driver: when the driver stops (Ctrl-C, SIGTERM, or it dies) Ray kills the actor, and
  the child is told to exit when its actor dies (PR_SET_PDEATHSIG): no worker outlives the command that placed it.
- Ray is an optional extra (`uv sync --extra ray`); without it `RayUnavailable` says how to install it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from rollout.engines.vllm_process import exit_with_parent
from rollout.stack.ray_actors import RayUnavailable, connect_ray


class CommandActor:
    """Runs one command as its child (wrapped by `ray.remote` in `run_on_ray`)."""

    def run(self, command: list[str], env: dict[str, str]) -> int:
        child = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,  # its output goes where the actor's goes: Ray forwards it to the driver
            preexec_fn=exit_with_parent,
        )
        return child.wait()


def run_on_ray(
    command: Sequence[str],
    *,
    gpus: float,
    address: str | None,
    env: Mapping[str, str] | None = None,
    resources: Mapping[str, float] | None = None,
) -> int:
    """Run `command` on the Ray cluster until it exits (see the module contract); its exit code."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("placement=ray needs Ray: `uv sync --extra ray`") from None
    connect_ray(ray, address)
    try:
        actor_class: Any = ray.remote(num_cpus=1, num_gpus=gpus, resources=dict(resources or {}))(
            CommandActor
        )
        actor = actor_class.remote()
        return int(ray.get(actor.run.remote(list(command), dict(env or {}))))
    finally:
        ray.shutdown()
