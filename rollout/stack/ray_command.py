"""placement=ray for the GPU roles: a role's command run by a Ray actor, where Ray placed it, with the GPUs
Ray gave (an engine, the trainer worker).

Contract:
- `run_on_ray(command, gpus=, address=, env=, resources=)` connects to the Ray cluster at `address` (None:
  RAY_ADDRESS, else a local one), creates one `CommandActor` asking Ray for `gpus` GPUs, one CPU and
  `resources` (custom resources: a worker group's), and has it run `command` as its child (`rollout engine
  serve …`: the node's rollout installation runs it, resolving its model and binding its port there). The
  child inherits the actor's environment, so it sees exactly the GPUs Ray assigned (CUDA_VISIBLE_DEVICES),
  with `env` on top. Its output reaches the driver's stderr line by line (Ray forwards actor output to its
  driver). It returns the child's exit code once the child exits; `RoleStopped` when the actor dies first (its
  node went away).
- The child is owned by the driver: when the driver stops (Ctrl-C, SIGTERM, or it dies) Ray kills the actor,
  and the child is told to exit when its actor dies (PR_SET_PDEATHSIG): no worker outlives the command that
  placed it.
- `connect_ray` joins the cluster, waiting a while for a head that is still starting; a cluster that never
  answers is `RayUnavailable`, as is Ray not being installed (`uv sync --extra ray`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rollout.engines.vllm_process import exit_with_parent


class RayUnavailable(RuntimeError):
    """Ray is not installed here, or its cluster does not answer."""


class RoleStopped(RuntimeError):
    """The actor running a role died before the role exited."""


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
    # The role runs with the node's own rollout installation, not a copy of this folder that Ray would build
    # for each actor when this process was started by `uv run` (read when Ray is imported).
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        import ray
    except ImportError:
        raise RayUnavailable("placement=ray needs Ray: `uv sync --extra ray`") from None
    from ray.exceptions import RayError

    connect_ray(ray, address)
    try:
        actor_class: Any = ray.remote(num_cpus=1, num_gpus=gpus, resources=dict(resources or {}))(
            CommandActor
        )
        actor = actor_class.remote()
        return int(ray.get(actor.run.remote(list(command), dict(env or {}))))
    except RayError as error:
        raise RoleStopped(f"the actor running it stopped: {error}") from error
    finally:
        ray.shutdown()


def connect_ray(ray: Any, address: str | None, *, wait_s: float = 120.0) -> None:
    """Join the Ray cluster at `address` (RAY_ADDRESS when None and set), else start a local one without its
    dashboard (Ray refuses start-up options when it joins a running cluster). A cluster that does not answer
    yet (a RayCluster's head still starting beside its drivers) is tried again for `wait_s`; then
    `RayUnavailable`."""
    import os

    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        ray.init(include_dashboard=False, configure_logging=False)
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ray.init(address=address, configure_logging=False)
            return
        except (ConnectionError, TimeoutError, RuntimeError) as error:
            if time.monotonic() > deadline:
                raise RayUnavailable(
                    f"the Ray cluster at {address} did not answer within {wait_s:.0f} s ({error}); check --ray-address "
                    "(ray://HEAD:10001 from outside the cluster) and that its head runs"
                ) from None
            time.sleep(2.0)
