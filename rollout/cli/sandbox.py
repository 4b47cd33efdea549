"""`rollout sandbox serve`: sandboxes served and registered in their pool, for episodes to claim (one by
default; `--count N` serves N from one process, named NAME-0 … NAME-(N-1), each on a port of its own).
`rollout sandbox install minecraft`: install what the `minecraft` kind runs, ahead of its first use."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.common import Overrides, as_service, err, fail, load_settings
from rollout.control.connections import refuse_without_jail

app = typer.Typer(
    help="Sandboxes: worlds that episodes claim (a computer, a Minecraft world, a shared grid, a kind of your own).",
    no_args_is_help=True,
)


@app.command("serve")
def serve(
    overrides: Overrides = None,
    kind: Annotated[
        str,
        typer.Option(
            help="shell, minecraft, command (a host for command seats), or package.module:attribute of an environment's kind."
        ),
    ] = "shell",
    name: Annotated[
        str, typer.Option(help="This sandbox's name in its pool (unique per kind).")
    ] = "sandbox-0",
    seats: Annotated[int, typer.Option(help="How many agents can play in it at once.")] = 4,
    host: Annotated[
        str, typer.Option(help="Address to listen on (agents on other machines reach it here).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one).")] = 0,
    count: Annotated[
        int, typer.Option(help="How many sandboxes to serve (more than one: NAME-0, NAME-1, …, free ports).")
    ] = 1,
) -> None:
    """Serve a sandbox (or --count of them) and register it in its pool, so episodes that need its kind can
    claim it."""
    import signal

    from rollout.control.connections import ledger_session
    from rollout.sandbox.claims import SandboxNameTaken
    from rollout.sandbox.keys import SandboxKeyMissing
    from rollout.sandbox.startup import (
        SandboxAsked,
        SandboxOptionError,
        SandboxPortTaken,
        hosted_sandboxes,
        plan_sandboxes,
    )
    from rollout.sandbox.world import SandboxSetupError
    from rollout.security.redaction import register_secret

    settings = load_settings(overrides)
    as_service(settings)
    _use_data_directory(settings.data_path)
    try:
        plan = plan_sandboxes(
            settings, SandboxAsked(kind=kind, name=name, seats=seats, host=host, port=port, count=count)
        )
    except SandboxOptionError as error:
        fail(str(error), code=2)
    except (SandboxKeyMissing, SandboxPortTaken) as error:
        fail(str(error))
    register_secret(plan.key)
    if plan.jailed:
        refuse_without_jail(settings, f"the {kind!r} sandbox runs what its agents drive")
    if plan.installable:
        # Before the event loop: the first install (npm) takes a while, and Ctrl-C must still stop it.
        from rollout.sandbox.minecraft.install import ensure_installed, minecraft_home

        try:
            ensure_installed(minecraft_home(settings.data_path))
        except SandboxSetupError as error:
            fail(str(error))

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)  # leave the pool cleanly: release the host lease
        async with (
            ledger_session(settings, url=settings.sandbox_ledger_url) as ledger,
            hosted_sandboxes(plan, ledger, err.print),
        ):
            await stop.wait()

    try:
        asyncio.run(serve())
    except (SandboxNameTaken, SandboxSetupError) as error:
        fail(str(error))


def _use_data_directory(data_path: Path) -> None:
    """Kinds that install what they run keep it under the data directory (unless told otherwise)."""
    from rollout.sandbox.minecraft.install import HOME_VARIABLE, minecraft_home

    os.environ.setdefault(HOME_VARIABLE, str(minecraft_home(data_path)))


@app.command("install")
def install(
    kind: Annotated[str, typer.Argument(help="The kind to install: minecraft.")],
    overrides: Overrides = None,
) -> None:
    """Install what a sandbox kind runs, ahead of its first use: for minecraft, the pinned Minecraft server
    and bots (npm packages, ~750 MB, and Node 22 when the machine's Node is older) under the data directory.
    Sandboxes install it themselves on first use; this does it now, with progress, and says where."""
    import logging
    import time

    from rollout.sandbox.minecraft.install import MinecraftInstallError, ensure_installed, minecraft_home
    from rollout.sandbox.startup import INSTALLABLE

    if kind not in INSTALLABLE:
        fail(f"{kind!r} needs no installing: only {', '.join(INSTALLABLE)} does", code=2)
    settings = load_settings(overrides)
    _use_data_directory(settings.data_path)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    try:
        installed = ensure_installed(minecraft_home(settings.data_path))
    except MinecraftInstallError as error:
        fail(str(error))
    err.print(
        f"minecraft: installed in {installed.home} (Node {installed.node}), {time.monotonic() - started:.0f}s",
        highlight=False,
    )
