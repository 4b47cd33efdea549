"""The `rollout` command line.

Every command takes Hydra overrides as trailing arguments (`rollout up services.temporal.ui_port=8300`).
Errors print one message that says what to do next and exit non-zero: 2 for a configuration error,
1 for anything else. Commands that scripts read have `--json`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from rollout import config
from rollout.ledger.errors import LedgerError
from rollout.stack.embedded import ServiceStatus, Stack
from rollout.stack.postgres import CorruptDataDirError
from rollout.stack.processes import PortTakenError

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollout.blobs import BlobStore
    from rollout.config import Settings
    from rollout.engines.follower import FollowerConfig

app = typer.Typer(
    name="rollout",
    help="rollout: reinforcement learning for language-model agents. `rollout up` starts the embedded stack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the composed configuration.", no_args_is_help=True)
ledger_app = typer.Typer(help="Look into the ledger: streams and their events.", no_args_is_help=True)
engine_app = typer.Typer(help="Run inference engines.", no_args_is_help=True)
seat_app = typer.Typer(
    help="Agent seats: the base URL and key an agent samples through.", no_args_is_help=True
)
app.add_typer(seat_app, name="seat")
app.add_typer(config_app, name="config")
app.add_typer(ledger_app, name="ledger")
app.add_typer(engine_app, name="engine")
env_app = typer.Typer(help="Environments: check one before a run plays it.", no_args_is_help=True)
worker_app = typer.Typer(
    help="Worker processes (several may run, on several machines).", no_args_is_help=True
)
run_app = typer.Typer(
    help="Runs: start one, change it while it plays, see where it is.", no_args_is_help=True
)
app.add_typer(env_app, name="env")
app.add_typer(worker_app, name="worker")
app.add_typer(run_app, name="run")
sandbox_app = typer.Typer(
    help="Sandboxes: worlds that episodes claim (a computer, a shared grid, later Minecraft).",
    no_args_is_help=True,
)
app.add_typer(sandbox_app, name="sandbox")

out = Console()
err = Console(stderr=True, soft_wrap=True)

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Config overrides, KEY=VALUE (e.g. services.postgres.port=5433 data_dir=/tmp/r).",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


async def _temporal(settings: config.Settings) -> Client:
    """A Temporal client, or a clear error saying how to start Temporal."""
    from temporalio.client import Client

    try:
        return await Client.connect(settings.temporal_address)
    except RuntimeError as error:
        fail(
            f"Temporal at {settings.temporal_address} is not answering ({error}): start it with `rollout up`"
        )


def _blob_store(settings: config.Settings) -> BlobStore:
    from rollout.blobs import open_store

    blobs = settings.services.blobs
    return open_store(settings.blob_url, s3_endpoint=blobs.s3_endpoint, s3_secure=blobs.s3_secure)


def _settings(overrides: list[str] | None) -> config.Settings:
    try:
        return config.load(overrides or [])
    except config.ConfigError as error:
        fail(f"{error}\nSee every setting with `rollout config show`.", code=2)


def _guarded[T](action: Callable[[], T]) -> T:
    """Run a stack action, turning the errors users can fix into one clear message."""
    try:
        return action()
    except (PortTakenError, CorruptDataDirError, LedgerError) as error:
        fail(str(error))
    except RuntimeError as error:
        fail(f"{error}\nLogs are under the data directory's logs/ folder; `rollout status` shows what runs.")


def _print_status(services: list[ServiceStatus], as_json: bool) -> None:
    if as_json:
        healthy = all(service.healthy for service in services)
        print(json.dumps({"healthy": healthy, "services": [s.as_json() for s in services]}, indent=2))
        return
    table = Table(title="rollout services")
    for column in ("service", "mode", "address", "health", "detail"):
        table.add_column(column, overflow="fold")
    for service in services:
        health = "[green]healthy[/]" if service.healthy else "[red]down[/]"
        table.add_row(service.name, service.mode, service.address, health, service.detail)
    out.print(table)
    for service in services:
        if service.ui_url:
            out.print(f"Temporal web UI: {service.ui_url}")


@app.command()
def up(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """Start the embedded stack (Postgres, Temporal with its web UI, the blob directory) and migrate the ledger.

    Services with a URL configured are used as they are; nothing is started for them.
    Running `up` again is harmless.
    """
    stack = Stack(_settings(overrides))
    if as_json:
        services = _guarded(stack.up)
    else:
        with err.status("starting the embedded stack…") as spinner:
            services = _guarded(lambda: stack.up(report=lambda line: spinner.update(line)))
    _print_status(services, as_json)
    if not all(service.healthy for service in services):
        raise typer.Exit(1)


@app.command()
def status(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """Report every service: address, health, and the Temporal web UI URL. Exits 1 when one is down."""
    services = _guarded(Stack(_settings(overrides)).status)
    _print_status(services, as_json)
    if not all(service.healthy for service in services):
        raise typer.Exit(1)


@app.command()
def down(overrides: Overrides = None) -> None:
    """Stop what `rollout up` started. External services are left alone; state stays in the data directory."""
    stopped = _guarded(Stack(_settings(overrides)).down)
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@config_app.command("show")
def config_show(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """Print the configuration composed from the defaults and the overrides."""
    tree = config.as_dict(_settings(overrides))
    if as_json:
        print(json.dumps(tree, indent=2))
    else:
        out.print(OmegaConf.to_yaml(tree), highlight=False)


@ledger_app.command("tail")
def ledger_tail(
    stream: Annotated[str, typer.Argument(help="The stream to read, e.g. run/my-run.")],
    overrides: Overrides = None,
    after: Annotated[int, typer.Option(help="Start after this seq.")] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events as they arrive.")
    ] = False,
) -> None:
    """Print a stream's events as JSON lines (seq, key, kind, payload)."""
    from rollout.ledger import Ledger
    from rollout.ledger.follower import Follower

    url = _settings(overrides).ledger_url

    async def run() -> None:
        if follow:  # runs until interrupted
            async for event in Follower(url, [stream], after={stream: after}).events():
                _print_event(event.seq, event.key, event.kind, dict(event.payload))
            return
        async with await Ledger.connect(url) as ledger:
            for event in await ledger.read(stream, after=after, limit=1_000_000):
                _print_event(event.seq, event.key, event.kind, dict(event.payload))

    try:
        asyncio.run(run())
    except LedgerError as error:
        fail(str(error))
    except KeyboardInterrupt:
        pass


@engine_app.command("serve")
def engine_serve(
    overrides: Overrides = None,
    model: Annotated[
        str, typer.Option(help="smollm2, tiny-qwen3, an HF model id or a local path.")
    ] = "smollm2",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8100,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when there is one).")] = None,
    served_name: Annotated[str, typer.Option(help="The name requests use for the base weights.")] = "base",
    kind: Annotated[
        str,
        typer.Option(
            help="local (transformers + peft), vllm (`vllm serve`, on a GPU), tinker (Tinker's hosted sampler) or "
            "scripted (replies from --script, for tests, tutorials and benchmarks)."
        ),
    ] = "local",
    script: Annotated[
        str | None,
        typer.Option(
            help="--kind scripted: package.module:function, mapping the prompt's text to the reply Message."
        ),
    ] = None,
    think_ms: Annotated[float, typer.Option(help="--kind scripted: how long each reply takes, in ms.")] = 0.0,
    tinker_base_model: Annotated[
        str | None, typer.Option(help="--kind tinker: the Tinker base model (default: --model).")
    ] = None,
    tinker_url: Annotated[
        str | None,
        typer.Option(help="--kind tinker: the Tinker API (default: $TINKER_BASE_URL, then Tinker's)."),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="The engine's name in serving acks (default: engine-PORT).")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            help="Run the serving follower: load each checkpoint the trainer publishes and ack it in the ledger."
        ),
    ] = True,
    gpu: Annotated[
        str | None,
        typer.Option(help="One-GPU mode: sleep while the trainer holds this GPU's lease, wake after."),
    ] = None,
) -> None:
    """Serve a model over vLLM's HTTP dialect: the local engine, a real `vllm serve`, or Tinker's sampler.

    The local engine batches concurrent requests; LoRA checkpoints load at runtime through /v1/load_lora_adapter
    (with --kind tinker, a checkpoint's path is its tinker:// sampler path). --kind tinker reads the API key
    from $TINKER_API_KEY; --model then names the tokenizer (used for the text fields only).

    Beside the engine runs its serving follower (--no-follow to run without): it loads each checkpoint the
    trainer publishes and records what the engine serves, which is how the gateway routes turns. With --kind
    vllm, run `rollout engine follow --engine-url URL` beside the vLLM server instead.
    """
    import os
    import shutil

    from rollout.engines.models import resolve
    from rollout.engines.vllm_server import ServedEngine, build_app
    from rollout.stack.processes import port_is_free

    settings = _settings(overrides)
    if kind not in ("local", "vllm", "tinker", "scripted"):
        fail(f"--kind must be local, vllm, tinker or scripted, not {kind!r}", code=2)
    if kind == "scripted" and not script:
        fail("--kind scripted needs --script package.module:function (prompt text -> reply Message)", code=2)
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT`")
    if kind == "tinker" and not os.environ.get("TINKER_API_KEY"):
        fail("--kind tinker needs a Tinker API key: export TINKER_API_KEY=tml-…")
    model_path = resolve(model, Path(settings.models_dir).expanduser())
    if kind == "vllm":
        from rollout.engines.vllm_launcher import VLLMLaunch, command

        if shutil.which("vllm") is None:
            fail("vLLM is not installed here: `uv sync --extra vllm` (it needs a CUDA GPU)")
        argv, env = command(VLLMLaunch(model_path, host=host, port=port, served_name=served_name))
        os.execvpe(argv[0], argv, {**os.environ, **env})
    engine: ServedEngine
    if kind == "tinker":
        from transformers import AutoTokenizer

        from rollout.engines.tinker import TinkerEngine

        engine = TinkerEngine(
            tinker_base_model or model,
            base_url=tinker_url,
            served_name=served_name,
            tokenizer=AutoTokenizer.from_pretrained(model_path),
        )
        where = tinker_url or os.environ.get("TINKER_BASE_URL") or "Tinker"
        err.print(
            f"Tinker engine sampling {engine.base_model} at {where} as '{served_name}' on http://{host}:{port}"
        )
    elif kind == "scripted":
        from transformers import AutoTokenizer

        from rollout.engines.scripted import ScriptedEngine, load_script
        from rollout.gateway.rendering import ModelRenderer, renderer_for_model

        try:
            reply = load_script(script or "")
        except ValueError as error:
            fail(str(error), code=2)
        renderer = ModelRenderer(AutoTokenizer.from_pretrained(model_path), renderer_for_model(model))
        engine = ScriptedEngine(renderer, reply, served_name=served_name, think_s=think_ms / 1000)
        err.print(f"scripted engine ({script}) as '{served_name}' on http://{host}:{port}")
    else:
        from rollout.engines.local import LocalEngine

        with err.status(f"loading {model}…"):
            engine = LocalEngine(model_path, device=device, served_name=served_name)
        err.print(
            f"local engine serving {model} as '{served_name}' on http://{host}:{port} ({engine.device})"
        )
    from rollout.engines.follower import FollowerConfig

    formats = {"local": ("lora",), "tinker": ("tinker",), "scripted": ("lora", "full", "tinker")}[kind]
    follower = FollowerConfig(
        engine=name or f"engine-{port}",
        url=f"http://{host}:{port}",
        base=served_name,
        formats=formats,
        gpu=gpu,
    )
    asyncio.run(_serve_engine(settings, build_app(engine), engine, host, port, follower if follow else None))


async def _serve_engine(
    settings: Settings, app: Any, engine: Any, host: str, port: int, follower: FollowerConfig | None
) -> None:
    import uvicorn

    following = asyncio.create_task(_follow_forever(settings, engine, follower)) if follower else None
    try:
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
    finally:
        if following is not None:
            following.cancel()


async def _follow_forever(settings: Settings, engine: Any, config: FollowerConfig) -> None:
    """The serving follower, reconnecting to the ledger for as long as the engine serves."""
    from rollout.engines.follower import ServingFollower
    from rollout.ledger import Ledger

    store = _blob_store(settings)
    while True:
        try:
            async with await Ledger.connect(settings.ledger_url) as ledger:
                cache = settings.data_path / "engines" / config.engine
                await ServingFollower(ledger, engine, store, config, cache).run()
        except LedgerError as error:
            err.print(f"serving follower: the ledger is unreachable ({error}); trying again in 5 s")
            await asyncio.sleep(5)


@app.command()
def gateway(
    overrides: Overrides = None,
    model: Annotated[
        str, typer.Option(help="The model the engines serve (its tokenizer and chat template).")
    ] = "smollm2",
    engine_url: Annotated[
        list[str] | None, typer.Option("--engine-url", help="An engine speaking vLLM's dialect (repeatable).")
    ] = None,
    renderer: Annotated[str, typer.Option(help="auto, chatml, qwen3, or module.Class of your own.")] = "",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    max_context: Annotated[int, typer.Option(help="The model's context length in tokens.")] = 8192,
    external: Annotated[
        list[str] | None,
        typer.Option(
            help="POLICY=MODEL or POLICY=MODEL@API_BASE: seats of POLICY use that LiteLLM model, recorded as text (repeatable)."
        ),
    ] = None,
) -> None:
    """Serve the gateway: OpenAI Chat, OpenAI Responses and Anthropic Messages, recording every turn.

    Point agents at a seat's base URL (`rollout seat new` prints one).
    """
    import uvicorn
    from transformers import AutoTokenizer

    from rollout.engines.external import ExternalModel
    from rollout.engines.models import resolve
    from rollout.engines.vllm_client import VLLMEngine
    from rollout.gateway.admission import Admission, EngineSlot
    from rollout.gateway.app import build_app
    from rollout.gateway.rendering import ModelRenderer, renderer_for_model
    from rollout.gateway.routing import Routes
    from rollout.gateway.service import Gateway
    from rollout.ledger import Ledger
    from rollout.stack.processes import port_is_free

    settings = _settings(overrides)
    if not engine_url:
        fail(
            "the gateway needs at least one engine: start one with `rollout engine serve` and pass --engine-url URL"
        )
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT`")
    model_path = resolve(model, Path(settings.models_dir).expanduser())
    model_renderer = ModelRenderer(
        AutoTokenizer.from_pretrained(model_path), renderer or renderer_for_model(model)
    )
    externals: dict[str, ExternalModel] = {}
    for spec in external or []:
        policy, _, target = spec.partition("=")
        name, _, api_base = target.partition("@")
        if not policy or not name:
            fail(
                f"--external {spec!r}: write POLICY=MODEL or POLICY=MODEL@API_BASE (e.g. judge=anthropic/claude-sonnet-4-5)"
            )
        externals[policy] = ExternalModel(name, api_base=api_base or None)

    async def serve() -> None:
        ledger = await Ledger.connect(settings.ledger_url)
        slots = [EngineSlot(VLLMEngine(url, name=f"engine{i}")) for i, url in enumerate(engine_url or [])]
        # Engines that ack what they serve are routed to at their acked URL, configured or not.
        routes = Routes(ledger, slots, connect=lambda url, name: VLLMEngine(url, name=name))
        core = Gateway(
            ledger, model_renderer, Admission(ledger, routes), max_context=max_context, externals=externals
        )
        err.print(f"gateway on http://{host}:{port} → {', '.join(engine_url or [])}")
        config = uvicorn.Config(
            build_app(core, model_names=["base"]), host=host, port=port, log_level="warning"
        )
        try:
            await uvicorn.Server(config).serve()
        finally:
            await ledger.close()

    try:
        asyncio.run(serve())
    except LedgerError as error:
        fail(str(error))


@seat_app.command("new")
def seat_new(
    overrides: Overrides = None,
    agent: Annotated[str, typer.Option(help="The agent's name.")] = "agent",
    run: Annotated[
        str | None, typer.Option(help="The run the seat belongs to (admission follows its settings).")
    ] = None,
    episode: Annotated[str | None, typer.Option(help="The episode the seat plays.")] = None,
    policy: Annotated[
        str, typer.Option(help="The policy whose newest admissible checkpoint serves it.")
    ] = "default",
    checkpoint: Annotated[str | None, typer.Option(help="Pin the seat to this checkpoint.")] = None,
    gateway_url: Annotated[
        str, typer.Option(help="The gateway the seat is used through.")
    ] = "http://127.0.0.1:8000",
    as_json: JsonFlag = False,
) -> None:
    """Open a seat by hand (to point Claude Code or Codex at a checkpoint, say): prints its base URL and key."""
    import uuid

    from rollout.gateway.seats import load_secret, open_seat
    from rollout.ledger import Ledger

    settings = _settings(overrides)

    async def make() -> tuple[str, str]:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            seat, token = await open_seat(
                ledger,
                load_secret(settings.data_path / "gateway.secret"),
                seat_id=f"manual/{uuid.uuid4().hex[:12]}",
                agent=agent,
                policy=policy,
                run=run,
                episode=episode,
                checkpoint=checkpoint,
            )
        return seat.seat_id, token

    try:
        seat_id, token = asyncio.run(make())
    except LedgerError as error:
        fail(str(error))
    base_url = f"{gateway_url.rstrip('/')}/s/{token}/v1"
    if as_json:
        print(json.dumps({"seat": seat_id, "base_url": base_url, "api_key": token}))
        return
    out.print(f"seat      {seat_id}\nbase URL  {base_url}\nAPI key   {token}", highlight=False)
    out.print(
        f"Claude Code: ANTHROPIC_BASE_URL={gateway_url.rstrip('/')}/s/{token} ANTHROPIC_API_KEY={token} claude",
        highlight=False,
    )


def _print_event(seq: int, key: str, kind: str, payload: dict[str, object]) -> None:
    print(json.dumps({"seq": seq, "key": key, "kind": kind, "payload": payload}), flush=True)


@env_app.command("check")
def env_check(
    reference: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    as_json: JsonFlag = False,
) -> None:
    """Import an environment, check its tools, and play one episode per agent against a scripted model.

    Exits non-zero, naming what is wrong and where, when anything fails. Needs no services.
    """
    from dataclasses import asdict

    from rich.table import Table

    from rollout.env_check import check_environment

    report = asyncio.run(check_environment(reference))
    if as_json:
        print(json.dumps({"ok": report.ok, **asdict(report)}))
    else:
        table = Table("agent", "turns", "reward", "tools", title=f"{reference} ({report.environment or '?'})")
        for played in report.plays:
            reward = (
                "—"
                if played.reward is None
                else f"{played.reward:g}" + (" (truncated)" if played.truncated else "")
            )
            table.add_row(played.agent, str(played.turns), reward, ", ".join(played.tools) or "—")
        if report.plays:
            out.print(table)
        for finding in report.findings:
            err.print(
                f"[bold red]✗[/] {finding.where}: {finding.problem}",
                highlight=False,
                emoji=False,
                markup=True,
            )
        if report.ok:
            out.print(
                "[bold green]✓[/] the environment loads, its tools are valid and every agent played to a reward"
            )
    if not report.ok:
        raise typer.Exit(1)


@worker_app.command("runner")
def worker_runner(
    overrides: Overrides = None,
    gateway_url: Annotated[
        str | None, typer.Option(help="The gateway agents sample through (default: services.gateway).")
    ] = None,
    task_queue: Annotated[str, typer.Option(help="The Temporal task queue to poll.")] = "rollout-runner",
    max_activities: Annotated[
        int, typer.Option(help="How many agents (and other activities) this runner plays at once.")
    ] = 64,
) -> None:
    """Run a runner worker: it plays episodes (the built-in agent loop and external agent commands)."""

    from rollout.gateway.seats import load_secret
    from rollout.ledger import Ledger
    from rollout.workers.runner import runner_worker

    settings = _settings(overrides)
    gateway = settings.services.gateway
    url = gateway_url or f"http://{gateway.host}:{gateway.port}"

    async def serve() -> None:
        client = await _temporal(settings)
        async with await Ledger.connect(settings.ledger_url) as ledger:
            worker = runner_worker(
                client,
                ledger,
                gateway_url=url,
                seat_secret=load_secret(settings.data_path / "gateway.secret"),
                task_queue=task_queue,
                max_concurrent_activities=max_activities,
            )
            err.print(f"runner worker on queue {task_queue!r}, agents sample through {url}")
            await worker.run()

    try:
        asyncio.run(serve())
    except LedgerError as error:
        fail(str(error))
    except KeyboardInterrupt:
        pass


@worker_app.command("trainer")
def worker_trainer(
    overrides: Overrides = None,
    task_queue: Annotated[str, typer.Option(help="The Temporal task queue to poll.")] = "rollout-trainer",
    holder: Annotated[
        str | None, typer.Option(help="This trainer's name in its leases (default: trainer-HOST-PID).")
    ] = None,
) -> None:
    """Run a trainer worker: it trains steps (`trainer.*` settings; `trainer.provider=tinker` trains through
    Tinker's API, with `trainer.tinker_base_model=` and TINKER_API_KEY), bridges each checkpoint for the engines
    and publishes it for serving. Runs started with training (`rollout train`) need one."""
    import os
    import socket

    from rollout.activities.bridges import BridgeActivities
    from rollout.activities.local_training import LocalTrainingActivities
    from rollout.engines.models import resolve
    from rollout.ledger import Ledger
    from rollout.training.local import LocalTrainerConfig
    from rollout.training.losses import LossConfig
    from rollout.workers.trainer import trainer_worker

    settings = _settings(overrides)
    spec = settings.trainer
    if spec.provider == "tinker":
        _tinker_trainer(settings, task_queue, holder)
        return
    with err.status(f"preparing {spec.model}…"):
        model_path = resolve(spec.model, Path(settings.models_dir).expanduser())
    trainer_config = LocalTrainerConfig(
        lora_rank=spec.lora_rank or None,
        lora_alpha=spec.lora_alpha,
        learning_rate=spec.learning_rate,
        max_grad_norm=spec.max_grad_norm,
        micro_batch_tokens=spec.micro_batch_tokens,
        device=spec.device,
    )
    loss = LossConfig(spec.loss.value, is_cap=spec.is_cap)
    store = _blob_store(settings)
    name = holder or f"trainer-{socket.gethostname()}-{os.getpid()}"
    scratch = settings.data_path / "trainer" / name

    async def serve() -> None:
        client = await _temporal(settings)
        async with await Ledger.connect(settings.ledger_url) as ledger:
            training = LocalTrainingActivities(
                ledger,
                store,
                model_path=model_path,
                config=trainer_config,
                loss=loss,
                holder=name,
                scratch=scratch,
                gpu_lease=spec.gpu_lease,
                lease_ttl_s=spec.lease_ttl_s,
            )
            bridges = BridgeActivities(ledger, store, base_model=model_path, scratch=scratch)
            worker = trainer_worker(client, training, bridges, task_queue=task_queue)
            err.print(
                f"trainer worker {name} on queue {task_queue!r}, training {spec.model} ({spec.loss.value})"
            )
            await worker.run()

    try:
        asyncio.run(serve())
    except LedgerError as error:
        fail(str(error))
    except KeyboardInterrupt:
        pass


def _tinker_trainer(settings: config.Settings, task_queue: str, holder: str | None) -> None:
    import os
    import socket

    from rollout.activities.bridges import BridgeActivities
    from rollout.activities.tinker_training import TinkerTrainerConfig, TinkerTrainingActivities
    from rollout.ledger import Ledger
    from rollout.training.losses import LossConfig
    from rollout.workers.trainer import trainer_worker

    spec = settings.trainer
    if not spec.tinker_base_model or not spec.lora_rank:
        fail(
            "trainer.provider=tinker needs trainer.tinker_base_model=NAME (Tinker's name of the model, e.g. "
            "Qwen/Qwen3-8B) and a LoRA rank (trainer.lora_rank=32): Tinker trains LoRA adapters",
            code=2,
        )
    config_ = TinkerTrainerConfig(
        base_model=spec.tinker_base_model,
        lora_rank=spec.lora_rank,
        learning_rate=spec.learning_rate,
        max_grad_norm=spec.max_grad_norm,
        base_url=spec.tinker_url,
    )
    store = _blob_store(settings)
    name = holder or f"trainer-{socket.gethostname()}-{os.getpid()}"
    scratch = settings.data_path / "trainer" / name

    async def serve() -> None:
        client = await _temporal(settings)
        async with await Ledger.connect(settings.ledger_url) as ledger:
            training = TinkerTrainingActivities(
                ledger,
                store,
                config=config_,
                loss=LossConfig(spec.loss.value),
                holder=name,
                scratch=scratch,
                lease_ttl_s=spec.lease_ttl_s,
            )
            bridges = BridgeActivities(ledger, store, base_model=None, scratch=scratch)
            worker = trainer_worker(client, training, bridges, task_queue=task_queue)
            err.print(
                f"trainer worker {name} on queue {task_queue!r}, training {spec.tinker_base_model} on Tinker"
            )
            await worker.run()

    try:
        asyncio.run(serve())
    except LedgerError as error:
        fail(str(error))
    except KeyboardInterrupt:
        pass


async def _run_update(settings: config.Settings, run: str, update: str, *args: int) -> dict[str, object]:
    from dataclasses import asdict

    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from rollout.workflows.run import run_workflow_id
    from rollout.workflows.types import RunStatus

    client = await _temporal(settings)
    handle = client.get_workflow_handle(run_workflow_id(run))
    try:
        if update == "status":
            status = await handle.query("status", result_type=RunStatus)
        else:
            status = await handle.execute_update(update, args=list(args), result_type=RunStatus)
    except WorkflowUpdateFailedError as error:
        fail(f"run {run} refused {update}: {error.cause}")
    except RPCError as error:
        fail(
            f"no run {run!r} is playing ({error.message}): see runs in the Temporal UI, or start one with `rollout run start`"
        )
    return asdict(status)


def _print_run_status(status: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(status))
        return
    out.print("  ".join(f"{key} [bold]{value}[/]" for key, value in status.items()), highlight=False)


@run_app.command("start")
def run_start(
    environment: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    overrides: Overrides = None,
    run: Annotated[str | None, typer.Option("--run", help="The run's id (default: a new one).")] = None,
    groups: Annotated[
        int | None, typer.Option(help="Stop after this many groups (default: until stopped).")
    ] = None,
    in_flight: Annotated[int, typer.Option(help="Episode groups to keep playing at once.")] = 2,
    max_lag: Annotated[
        int, typer.Option(help="How many checkpoints behind the newest a turn may sample.")
    ] = 2,
    wait: Annotated[bool, typer.Option(help="Wait for the run to end and print its status.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a run: episodes of ENVIRONMENT, played by runner workers (`rollout worker runner`)."""
    import uuid
    from dataclasses import asdict

    from temporalio.client import Client

    from rollout.workflows.run import run_workflow_id
    from rollout.workflows.types import RUNNER_QUEUE, RunInput, RunStatus

    settings = _settings(overrides)
    run_id = run or f"run-{uuid.uuid4().hex[:8]}"

    async def start() -> dict[str, object]:
        client = await Client.connect(settings.temporal_address)
        handle = await client.start_workflow(
            "RunWorkflow",
            RunInput(
                run=run_id,
                environment=environment,
                groups_in_flight=in_flight,
                max_groups=groups,
                max_lag=max_lag,
            ),
            id=run_workflow_id(run_id),
            task_queue=RUNNER_QUEUE,
            result_type=RunStatus,
        )
        if not wait:
            return {"run": run_id, "workflow": handle.id}
        return asdict(await handle.result())

    _print_run_status(asyncio.run(start()), as_json)


@app.command()
def train(
    environment: Annotated[str, typer.Argument(help="The environment, as package.module:attribute.")],
    overrides: Overrides = None,
    preset: Annotated[
        str,
        typer.Option(help="cpu-micro (a tiny random model, for CI), cpu-tiny (SmolLM2-135M + LoRA on CPU)."),
    ] = "none",
    run: Annotated[str | None, typer.Option("--run", help="The run's id (default: a new one).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Train a policy on ENVIRONMENT: starts what is missing (stack, engine, gateway, runner, trainer), starts a
    run that trains `trainer.steps` steps while episodes keep playing, and shows it live.

    Overrides after the environment: `trainer.steps=5 trainer.learning_rate=1e-4 run.max_lag=2`. Ctrl-C pauses
    the run (it stays paused across restarts) and prints how to resume it.
    """
    import time
    import uuid

    from rich.live import Live
    from temporalio.client import Client, WorkflowHandle

    from rollout.engines.models import resolve
    from rollout.environment import EnvironmentLoadError, load_environment
    from rollout.ledger import Ledger
    from rollout.train_command import TrainingProgress, run_input
    from rollout.workflows.run import run_workflow_id
    from rollout.workflows.types import RUNNER_QUEUE, RunStatus

    settings = _settings([f"preset={preset}", *(overrides or [])])
    try:
        loaded = load_environment(environment)
    except EnvironmentLoadError as error:
        fail(f"{error}\nCheck it with `rollout env check {environment}`.", code=2)
    if settings.trainer.model != settings.services.gateway.model:
        fail(
            f"trainer.model={settings.trainer.model} but the engines serve services.gateway.model="
            f"{settings.services.gateway.model}: set both to the same model"
        )
    stack = Stack(settings)
    try:
        with err.status("starting the stack…") as spinner:
            stack.up(report=lambda line: spinner.update(line))
            _check_engine_model(
                settings, resolve(settings.services.gateway.model, Path(settings.models_dir).expanduser())
            )
            spinner.update("trainer: starting")
            stack.start_trainer()
    except (RuntimeError, PortTakenError, CorruptDataDirError) as error:
        fail(str(error))
    run_id = run or f"{loaded.name}-{uuid.uuid4().hex[:6]}"
    given = run_input(settings, environment, run_id)
    policies = [a.policy for a in loaded.agents if a.checkpoint is None and a.command is None] or ["default"]
    progress = TrainingProgress(run_id, policies[0])

    async def follow() -> tuple[RunStatus, TrainingProgress]:
        client = await Client.connect(settings.temporal_address)
        handle: WorkflowHandle[Any, RunStatus] = await client.start_workflow(
            "RunWorkflow", given, id=run_workflow_id(run_id), task_queue=RUNNER_QUEUE, result_type=RunStatus
        )
        err.print(
            f"run {run_id}: training {settings.trainer.model} for {settings.trainer.steps} steps on {environment}"
        )
        started = time.monotonic()
        async with await Ledger.connect(settings.ledger_url) as ledger:
            with Live(console=err, refresh_per_second=2) as live:
                while True:
                    await progress.refresh(ledger)
                    live.update(f"[{time.monotonic() - started:5.0f}s] {progress.line()}")
                    description = await handle.describe()
                    if description.status is not None and description.status.name != "RUNNING":
                        break
                    status = await handle.query("status", result_type=RunStatus)
                    if status.pause_reason:
                        fail(
                            f"run {run_id} paused: {status.pause_reason}\nFix the cause, then `rollout run resume {run_id}`."
                        )
                    await asyncio.sleep(1.0)
            final = await handle.result()
            await progress.refresh(ledger)
        return final, progress

    try:
        status, progress = asyncio.run(follow())
    except KeyboardInterrupt:
        asyncio.run(_run_update(settings, run_id, "pause"))
        err.print(
            f"\npaused run {run_id}. Resume it with `rollout run resume {run_id}`; the stack keeps running."
        )
        raise typer.Exit(130) from None
    summary = progress.summary() | {"episodes_failed": status.episodes_failed}
    if as_json:
        print(json.dumps(summary))
        return
    out.print(
        f"run {run_id}: {summary['steps']} steps, {len(progress.served)} checkpoints served during the run, "
        f"{summary['episodes']} episodes; reward by step {summary['reward_by_step']}",
        highlight=False,
    )


@app.command()
def sft(
    dataset: Annotated[
        Path,
        typer.Argument(
            help='JSONL of conversations, {"messages": [...]}, each ending in the assistant\'s reply to learn.'
        ),
    ],
    overrides: Overrides = None,
    name: Annotated[
        str | None, typer.Option(help="The warm start's name (default: the dataset's file name).")
    ] = None,
    epochs: Annotated[float, typer.Option(help="Passes over the dataset.")] = 1.0,
    as_json: JsonFlag = False,
) -> None:
    """A supervised warm start before RL: fine-tune a LoRA adapter of `trainer.model` on DATASET with TRL and
    publish it as checkpoint `sft/NAME-step000001`. Train from it with `rollout train ENV
    trainer.warm_start=sft/NAME-step000001`. Needs the stack's ledger (`rollout up`)."""
    import os
    import socket

    from rollout.engines.models import resolve
    from rollout.ledger import Ledger
    from rollout.sft_command import WarmStartExists, warm_start
    from rollout.training.sft import ConversationError, SftConfig, read_conversations

    settings = _settings(overrides)
    spec = settings.trainer
    if not dataset.is_file():
        fail(f"{dataset} is not a file: give a JSONL file of conversations", code=2)
    try:
        rows = read_conversations(dataset)
    except ConversationError as error:
        fail(f'{error}\nEach line is {{"messages": [...]}} whose last message is the assistant\'s.', code=2)
    if not spec.lora_rank:
        fail("the warm start trains a LoRA adapter: set trainer.lora_rank= to 1 or more", code=2)
    model_path = resolve(spec.model, Path(settings.models_dir).expanduser())
    config_ = SftConfig(
        lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, learning_rate=spec.learning_rate, epochs=epochs
    )
    holder = f"sft-{socket.gethostname()}-{os.getpid()}"

    async def run() -> dict[str, Any]:
        async with await Ledger.connect(settings.ledger_url) as ledger:
            record = await warm_start(
                ledger,
                _blob_store(settings),
                name=name or dataset.stem,
                model_path=model_path,
                rows=rows,
                config=config_,
                holder=holder,
            )
        return {"checkpoint": record.name, "examples": len(rows), "metrics": record.metrics}

    err.print(f"fine-tuning {spec.model} (LoRA r={spec.lora_rank}) on {len(rows)} conversations…")
    try:
        summary = asyncio.run(run())
    except WarmStartExists as error:
        fail(str(error), code=2)
    except LedgerError as error:
        fail(str(error))
    if as_json:
        print(json.dumps(summary))
        return
    out.print(
        f"published {summary['checkpoint']}: SFT loss {summary['metrics']['sft_loss_first']:.3f} → "
        f"{summary['metrics']['sft_loss_last']:.3f}. Train from it with `rollout train ENV "
        f"trainer.warm_start={summary['checkpoint']}`",
        highlight=False,
    )


def _check_engine_model(settings: config.Settings, model_path: str) -> None:
    """The running engine must serve the model being trained (a stack started earlier may serve another)."""
    import httpx

    gateway = settings.services.gateway
    try:
        models = httpx.get(f"http://{gateway.host}:{gateway.engine_port}/v1/models", timeout=5).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return  # unreachable: `up` reported it
    roots = {entry.get("root") for entry in models}
    if model_path not in roots and "scripted" not in roots:
        fail(
            f"the running engine serves {', '.join(str(r) for r in roots)}, not {gateway.model}: stop the stack "
            "with `rollout down` (or choose another data_dir=) and train again"
        )


def _run_command(update: str, help_text: str) -> None:
    def command(
        run: Annotated[str, typer.Argument(help="The run's id.")],
        overrides: Overrides = None,
        as_json: JsonFlag = False,
    ) -> None:
        _print_run_status(asyncio.run(_run_update(_settings(overrides), run, update)), as_json)

    command.__doc__ = help_text
    run_app.command(update)(command)


_run_command("pause", "Pause a run: no new turns or episodes begin; recorded in the ledger.")
_run_command("resume", "Resume a paused run.")
_run_command("stop", "Stop a run once the episodes in flight finish.")
_run_command("status", "Where a run is: paused, max_lag, episodes finished and failed.")


@run_app.command("set")
def run_set(
    run: Annotated[str, typer.Argument(help="The run's id.")],
    setting: Annotated[str, typer.Argument(help="max_lag=N")],
    overrides: Overrides = None,
    as_json: JsonFlag = False,
) -> None:
    """Change a run's setting while it plays (max_lag=N); the gateway applies it on the next turn."""
    key, _, value = setting.partition("=")
    if key != "max_lag" or not value.strip().isdigit():
        fail(
            f"{setting!r}: the setting a run takes is max_lag=N, with N a whole number (0 = on-policy)",
            code=2,
        )
    _print_run_status(asyncio.run(_run_update(_settings(overrides), run, "set_max_lag", int(value))), as_json)


@sandbox_app.command("serve")
def sandbox_serve(
    overrides: Overrides = None,
    kind: Annotated[
        str, typer.Option(help="shell, or package.module:attribute of an environment's kind.")
    ] = "shell",
    name: Annotated[
        str, typer.Option(help="This sandbox's name in its pool (unique per kind).")
    ] = "sandbox-0",
    seats: Annotated[int, typer.Option(help="How many agents can play in it at once.")] = 4,
    host: Annotated[
        str, typer.Option(help="Address to listen on (agents on other machines reach it here).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one).")] = 0,
) -> None:
    """Serve one sandbox and register it in its pool, so episodes that need its kind can claim it."""
    import signal

    from rollout.ledger import Ledger
    from rollout.sandbox import load_kind
    from rollout.sandbox.claims import SandboxNameTaken
    from rollout.sandbox.hosting import hosted_sandbox, sandbox_workdir
    from rollout.sandbox.world import UnknownSandboxKind
    from rollout.stack.processes import free_port, port_is_free

    settings = _settings(overrides)
    if seats < 1:
        fail("--seats must be at least 1", code=2)
    try:
        load_kind(kind)
    except UnknownSandboxKind as error:
        fail(str(error), code=2)
    port = port or free_port()
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT` (or 0 for a free one)")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)  # leave the pool cleanly: release the host lease
        async with await Ledger.connect(settings.ledger_url) as ledger:
            workdir = sandbox_workdir(settings.data_path, kind, name)
            async with hosted_sandbox(
                ledger, kind, name, seats=seats, workdir=workdir, host=host, port=port
            ) as box:
                err.print(
                    f"sandbox {name!r} ({kind}, {seats} seats) on {box.address}, in the pool until stopped"
                )
                await stop.wait()

    try:
        asyncio.run(serve())
    except (LedgerError, SandboxNameTaken) as error:
        fail(str(error))


def main() -> None:
    app(prog_name="rollout")


if __name__ == "__main__":
    sys.exit(main())
