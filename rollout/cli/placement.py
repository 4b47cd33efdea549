"""`--placement ray` for the commands that run a GPU role (`engine serve`, `worker trainer`).

Contract:
- The options are shared: `--placement here|ray`, `--ray-address` (default RAY_ADDRESS, else a local Ray),
  `--gpus` (what the role asks Ray for) and `--ray-group` (a worker group of the chart's RayCluster: the role
  asks for one unit of the custom resource `rollout-GROUP` that group's workers advertise, so Ray places it on
  that group).
- `rerun_on_ray(role, ...)` runs this very command, less its placement options, as the child of a Ray actor
  (rollout.stack.ray_command): the role resolves its model and binds its port where Ray placed it, with the
  GPUs Ray gave. This process is its driver: stopping it stops the role. It returns when the role exits,
  failing with one line when the role failed or Ray is missing.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rollout.cli.common import err, fail

PlacementOption = Annotated[
    str,
    typer.Option(
        help="here (this process), or ray: run on the Ray cluster, placed by a Ray actor with the --gpus it asks "
        "for (this command stays as its driver: stopping it stops the role)."
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        help="--placement ray: the Ray cluster, ray://HOST:10001 (default: RAY_ADDRESS, else a local one)."
    ),
]
GpusOption = Annotated[float, typer.Option(help="--placement ray: the GPUs this role asks Ray for.")]
RayGroupOption = Annotated[
    str | None,
    typer.Option(
        help="--placement ray: the RayCluster worker group to run on (the chart's ray.workerGroups)."
    ),
]

PLACEMENT_OPTIONS = ("--placement", "--ray-address", "--gpus", "--ray-group")


def check_placement(placement: str) -> None:
    if placement not in ("here", "ray"):
        fail(f"--placement must be here or ray, not {placement!r}", code=2)


def without_placement(arguments: list[str]) -> list[str]:
    """`arguments` less the placement options and their values (`--gpus 1` and `--gpus=1` alike)."""
    kept: list[str] = []
    skip_value = False
    for argument in arguments:
        if skip_value:
            skip_value = False
            continue
        name = argument.split("=", 1)[0]
        if name in PLACEMENT_OPTIONS:
            skip_value = "=" not in argument
            continue
        kept.append(argument)
    return kept


def rerun_on_ray(role: str, *, gpus: float, address: str | None, group: str | None) -> None:
    """Run this command (less its placement options) on the Ray cluster; see the module contract."""
    from rollout.stack.ray_command import RayUnavailable, RoleStopped, run_on_ray

    command = [sys.executable, "-m", "rollout.cli", *without_placement(sys.argv[1:])]
    where = f" in worker group {group}" if group else ""
    err.print(f"{role}: placing it on the Ray cluster{where} with {gpus:g} GPU")
    try:
        code = run_on_ray(command, gpus=gpus, address=address, resources=ray_resources(group))
    except (RayUnavailable, RoleStopped) as error:
        fail(f"the {role}: {error}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None  # Ray ends the actor, and the role with it
    if code != 0:
        fail(f"the {role} on the Ray cluster exited with status {code} (its output is above)")


def ray_resources(group: str | None) -> dict[str, float]:
    """The custom resource that places a role on a worker group (the chart's workers advertise it)."""
    return {f"rollout-{group}": 1.0} if group else {}
