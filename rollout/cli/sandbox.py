"""`rollout sandbox serve`: sandboxes served and registered in their pool, for episodes to claim (one by
default; `--count N` serves N from one process, named NAME-0 … NAME-(N-1), each on a port of its own).
`rollout sandbox install minecraft`: install what the `minecraft` kind runs, ahead of its first use."""

from __future__ import annotations

import asyncio
import contextlib
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
    from rollout.net import free_port, port_is_free
    from rollout.sandbox import load_kind
    from rollout.sandbox.claims import SandboxNameTaken
    from rollout.sandbox.hosting import hosted_sandbox, sandbox_workdir, stack_endpoints
    from rollout.sandbox.world import SandboxSetupError, UnknownSandboxKind, jailed

    settings = load_settings(overrides)
    as_service(settings)
    _use_data_directory(settings.data_path)
    if seats < 1 or count < 1:
        fail("--seats and --count must be at least 1", code=2)
    if count > 1 and port:
        fail("--count serves each sandbox on a free port of its own: leave out --port", code=2)
    try:
        factory = load_kind(kind)
    except UnknownSandboxKind as error:
        fail(str(error), code=2)
    if jailed(factory):
        refuse_without_jail(settings, f"the {kind!r} sandbox runs what its agents drive")
    if kind.partition("#")[0] in INSTALLABLE:
        # Before the event loop: the first install (npm) takes a while, and Ctrl-C must still stop it.
        from rollout.sandbox.minecraft.install import ensure_installed, minecraft_home

        try:
            ensure_installed(minecraft_home(settings.data_path))
        except SandboxSetupError as error:
            fail(str(error))
    from rollout.redaction import register_secret
    from rollout.sandbox.keys import SandboxKeyMissing, load_host_key

    try:
        # Beyond loopback the key must be the runners' own: a fresh one would authenticate no claim.
        key = load_host_key(settings.data_path, kind, create=host in ("127.0.0.1", "localhost", "::1"))
    except SandboxKeyMissing as error:
        fail(str(error))
    register_secret(key)
    port = port or free_port()
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT` (or 0 for a free one)")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)  # leave the pool cleanly: release the host lease
        names = [name] if count == 1 else [f"{name}-{i}" for i in range(count)]
        async with (
            ledger_session(settings, url=settings.sandbox_ledger_url) as ledger,
            contextlib.AsyncExitStack() as boxes,
        ):
            for each in names:
                box = await boxes.enter_async_context(
                    hosted_sandbox(
                        ledger,
                        kind,
                        each,
                        seats=seats,
                        workdir=sandbox_workdir(settings.data_path, kind, each),
                        key=key,
                        host=host,
                        port=port if count == 1 else free_port(),
                        isolation=settings.sandbox.isolation,
                        refused_endpoints=stack_endpoints(settings),
                        readable_roots=[Path(folder) for folder in settings.sandbox.command_readable],
                        refused_roots=[settings.data_path],
                    )
                )
                err.print(
                    f"sandbox {each!r} ({kind}, {seats} seats) on {box.address}, in the pool until stopped"
                )
            await stop.wait()

    try:
        asyncio.run(serve())
    except (SandboxNameTaken, SandboxSetupError) as error:
        fail(str(error))


def _use_data_directory(data_path: Path) -> None:
    """Kinds that install what they run keep it under the data directory (unless told otherwise)."""
    from rollout.sandbox.minecraft.install import HOME_VARIABLE, minecraft_home

    os.environ.setdefault(HOME_VARIABLE, str(minecraft_home(data_path)))


INSTALLABLE = ("minecraft",)


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
