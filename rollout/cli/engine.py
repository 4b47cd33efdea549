"""`rollout engine serve`: an inference engine over vLLM's HTTP dialect, with its serving follower.
`rollout engine follow`: the serving follower alone, beside an engine started elsewhere (a `vllm serve`).
`rollout engine api-key`: the key every engine route but /health asks for (rollout.serving.engine_api_key)."""

from __future__ import annotations

import asyncio
import shutil
from typing import TYPE_CHECKING, Annotated

import typer

from rollout.cli.common import Overrides, as_service, err, fail, load_settings
from rollout.cli.placement import (
    GpusOption,
    PlacementOption,
    RayAddressOption,
    RayGroupOption,
    check_placement,
    rerun_on_ray,
)
from rollout.control.connections import blob_store, local_model

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.engines.follower import FollowerConfig

app = typer.Typer(help="Run inference engines.", no_args_is_help=True)


@app.command("serve")
def serve(
    overrides: Overrides = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="smollm2, tiny-qwen3, an HF model id or a local path (default: services.gateway.model)."
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default: services.gateway.engine_host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (default: services.gateway.engine_port).")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="cpu or cuda (default: services.engine.device, else cuda when there is one)."),
    ] = None,
    served_name: Annotated[str, typer.Option(help="The name requests use for the base weights.")] = "base",
    kind: Annotated[
        str | None,
        typer.Option(
            help="local (transformers + peft), vllm (`vllm serve`, on a GPU), tinker (Tinker's hosted sampler) or "
            "scripted (replies from --script, for tests, tutorials and benchmarks). Default: services.engine.kind "
            "(auto: tinker when trainer.provider=tinker, else local)."
        ),
    ] = None,
    script: Annotated[
        str | None,
        typer.Option(
            help="--kind scripted: package.module:function, mapping the prompt's text to the reply Message."
        ),
    ] = None,
    think_ms: Annotated[float, typer.Option(help="--kind scripted: how long each reply takes, in ms.")] = 0.0,
    tinker_base_model: Annotated[
        str | None,
        typer.Option(
            help="--kind tinker: the Tinker base model (default: trainer.tinker_base_model, else --model)."
        ),
    ] = None,
    tinker_url: Annotated[
        str | None,
        typer.Option(
            help="--kind tinker: the Tinker API (default: trainer.tinker_url, $TINKER_BASE_URL, then Tinker's)."
        ),
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
        typer.Option(
            help="One-GPU mode: sleep while the trainer holds this GPU's lease, wake after (default: the lease "
            "of gpu.mode=shared or trainer.gpu_lease)."
        ),
    ] = None,
    placement: PlacementOption = "here",
    ray_address: RayAddressOption = None,
    gpus: GpusOption = 0.0,
    ray_group: RayGroupOption = None,
) -> None:
    """Serve a model over vLLM's HTTP dialect: the local engine, a real `vllm serve`, or Tinker's sampler.

    The local engine batches concurrent requests; LoRA checkpoints load at runtime through
    /v1/load_lora_adapter (with --kind tinker, a checkpoint's path is its tinker:// sampler path). --kind
    tinker reads the API key from $TINKER_API_KEY; --model then names the tokenizer (used for the text fields
    only).

    Beside the engine runs its serving follower (--no-follow to run without): it loads each checkpoint the
    trainer publishes and records what the engine serves, which is how the gateway routes turns. --kind vllm
    starts `vllm serve` as a child process (runtime LoRA loading and sleep mode on; services.engine.vllm_*
    shape its command line) and runs the follower beside it; stopping this command stops vLLM. For a `vllm
    serve` you started yourself, run `rollout engine follow --engine-url URL --kind vllm` beside it instead.

    Every route but /health needs the engine API key (`rollout engine api-key`, derived from
    DATA_DIR/engine.key, which the gateway shares); vLLM gets it in its environment (VLLM_API_KEY), never on
    its command line, and checks it on its /v1 routes only (docs/serving.md).
    """
    from rollout.config import LedgerWriter
    from rollout.engines.factory import (
        SERVED_FORMATS,
        EngineSetupError,
        EngineSpec,
        build_engine,
        check_engine_options,
        serve_engine,
    )
    from rollout.engines.follower import FollowerConfig
    from rollout.net import port_is_free, reachable_host
    from rollout.serving import engine_api_key, load_engine_key

    settings = load_settings(overrides)
    engine_key = load_engine_key(settings.data_path)
    api_key = engine_api_key(engine_key)
    as_service(settings, api_key)
    # What is not given is read from the settings: the embedded stack starts this command with its own.
    gateway, trainer = settings.services.gateway, settings.trainer
    kind = kind or settings.engine_kind.value
    model = model or gateway.model
    host = host or gateway.engine_host
    port = port or gateway.engine_port
    device = device or settings.services.engine.device
    tinker_base_model = tinker_base_model or trainer.tinker_base_model
    tinker_url = tinker_url or trainer.tinker_url
    if kind not in (*SERVED_FORMATS, "vllm"):
        fail(f"--kind must be local, vllm, tinker or scripted, not {kind!r}", code=2)
    check_placement(placement)
    if placement == "ray":  # the whole command runs where Ray places it: it resolves its model and port there
        if gpus <= 0 and kind == "vllm":
            fail("vLLM needs a GPU: give the engine one with `--gpus 1`", code=2)
        rerun_on_ray(f"{kind} engine", gpus=gpus, address=ray_address, group=ray_group)
        return
    if kind != "vllm":
        try:
            check_engine_options(kind, script=script)
        except EngineSetupError as error:
            fail(str(error), code=2)
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT`")
    model_path = local_model(model, settings)
    follower = FollowerConfig(
        engine=name or f"engine-{port}",
        url=f"http://{reachable_host(host)}:{port}",  # where the gateway reaches it, read from its acks
        base=served_name,
        model=model,
        formats=SERVED_FORMATS[kind],
        opponent_adapters=settings.services.engine.opponent_adapters,
        gpu=gpu or settings.gpu_lease,  # gpu.mode=shared gives way to the stack's GPU lease
        ack_key=engine_key,
    )
    if kind == "vllm":
        if shutil.which("vllm") is None:
            fail("vLLM is not installed here: `uv sync --extra vllm` (it needs a CUDA GPU)")
        _serve_vllm(settings, model_path, host, port, served_name, api_key, follower if follow else None)
        return
    spec = EngineSpec(
        kind=kind,
        model=model,
        model_path=model_path,
        served_name=served_name,
        device=device,
        prefix_cache_mb=settings.services.engine.prefix_cache_mb,
        script=script,
        think_s=think_ms / 1000,
        tinker_base_model=tinker_base_model,
        tinker_url=tinker_url,
    )
    try:
        with err.status(f"loading {model}…"):
            engine = build_engine(spec)
    except EngineSetupError as error:
        fail(str(error), code=2)
    err.print(f"{spec.describe()} as '{served_name}' on http://{host}:{port}")
    if (no_cache := getattr(engine, "prefix_cache_off", None)) is not None:
        err.print(f"no prefix cache: {no_cache}")
    asyncio.run(
        serve_engine(
            engine,
            host=host,
            port=port,
            api_key=api_key,
            follower=follower if follow else None,
            ledger_url=settings.writer_ledger_url(LedgerWriter.serving),
            store=lambda: blob_store(settings),
            cache_dir=settings.data_path / "engines",
            report=err.print,
        )
    )


def _serve_vllm(
    settings: Settings,
    model_path: str,
    host: str,
    port: int,
    served_name: str,
    api_key: str,
    follower: FollowerConfig | None,
) -> None:
    from rollout.config import LedgerWriter
    from rollout.engines.vllm_launcher import launch_for
    from rollout.engines.vllm_process import VLLMStartError, serve_vllm

    launch = launch_for(settings, model_path, host=host, port=port, served_name=served_name, api_key=api_key)
    log_path = settings.data_path / "logs" / f"vllm-{port}.log"
    err.print(f"starting vllm serve {model_path} on http://{host}:{port} (its output: {log_path})")
    try:
        status = asyncio.run(
            serve_vllm(
                launch,
                follower=follower,
                ledger_url=settings.writer_ledger_url(LedgerWriter.serving),
                store=lambda: blob_store(settings),
                cache_dir=settings.data_path / "engines",
                log_path=log_path,
                report=err.print,
            )
        )
    except VLLMStartError as error:
        fail(str(error))
    except asyncio.CancelledError:  # stopped (SIGTERM, Ctrl-C): vLLM was stopped with it
        err.print("stopped vllm serve")
        return
    if status != 0:
        fail(f"vllm serve exited with status {status}; its output is in {log_path}", code=status)


@app.command("follow")
def follow(
    overrides: Overrides = None,
    engine_url: Annotated[
        str, typer.Option(help="The engine to follow, speaking vLLM's HTTP API (e.g. http://127.0.0.1:8100).")
    ] = "http://127.0.0.1:8100",
    kind: Annotated[
        str, typer.Option(help="What it is: vllm, local or tinker (which checkpoint formats it loads).")
    ] = "vllm",
    name: Annotated[
        str | None, typer.Option(help="The engine's name in serving acks (default: engine-PORT).")
    ] = None,
    served_name: Annotated[str, typer.Option(help="The name its base weights are served under.")] = "base",
    model: Annotated[
        str | None,
        typer.Option(
            help="The base model it serves (default: services.gateway.model): it loads only that model's "
            "checkpoints, and turns of policies on that model are routed to it."
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="One-GPU mode: put it to sleep while the trainer holds this GPU's lease, wake it after."
        ),
    ] = None,
    run: Annotated[
        list[str] | None,
        typer.Option(help="Serve only this run's checkpoints (repeat for several; default: every run's)."),
    ] = None,
) -> None:
    """Run the serving follower beside an engine started elsewhere (a `vllm serve` you started, say).

    It reads the checkpoints the trainer publishes from the ledger, fetches their files from the blob store
    (the engine must read the same filesystem: run it on the engine's machine), loads them into the engine
    through vLLM's runtime LoRA endpoints, unloads those no admissible turn can use, and acks what the engine
    serves, which is how the gateway routes turns to it. Stop it with Ctrl-C; the engine keeps serving.
    It sends the engine API key of DATA_DIR/engine.key: start your `vllm serve` with it in its environment,
    `VLLM_API_KEY="$(rollout engine api-key)" vllm serve …`, not among its arguments.
    """
    from urllib.parse import urlsplit

    from rollout.config import LedgerWriter
    from rollout.engines.factory import SERVED_FORMATS, follow_forever
    from rollout.engines.follower import FollowerConfig
    from rollout.engines.vllm_client import VLLMEngine
    from rollout.serving import engine_api_key, load_engine_key

    settings = load_settings(overrides)
    engine_key = load_engine_key(settings.data_path)
    api_key = engine_api_key(engine_key)
    as_service(settings, api_key)
    if kind not in SERVED_FORMATS or kind == "scripted":
        fail(f"--kind must be vllm, local or tinker, not {kind!r}", code=2)
    address = urlsplit(engine_url)
    if address.scheme not in ("http", "https") or not address.hostname:
        fail(f"--engine-url must be an http(s) URL such as http://127.0.0.1:8100, not {engine_url!r}", code=2)
    engine_name = name or f"engine-{address.port or 80}"
    engine = VLLMEngine(engine_url, api_key=api_key, name=engine_name)
    config = FollowerConfig(
        engine=engine_name,
        url=engine_url.rstrip("/"),
        base=served_name,
        model=model or settings.services.gateway.model,
        formats=SERVED_FORMATS[kind],
        opponent_adapters=settings.services.engine.opponent_adapters,
        gpu=gpu,
        runs=tuple(run or ()),
        ack_key=engine_key,
    )
    err.print(f"following {engine_url} as {engine_name!r} ({kind}: loads {', '.join(config.formats)})")

    async def follow_engine() -> None:
        try:
            await follow_forever(
                engine,
                config,
                settings.writer_ledger_url(LedgerWriter.serving),
                blob_store(settings),
                settings.data_path / "engines",
                err.print,
            )
        finally:
            await engine.close()

    asyncio.run(follow_engine())


@app.command("api-key")
def api_key(overrides: Overrides = None) -> None:
    """Print the engine API key: what every engine route but /health asks for as `Authorization: Bearer`.

    It is derived from DATA_DIR/engine.key (made if there is none), which the gateway, the engines and their
    followers share. Give it to a `vllm serve` of your own in its environment, never among its arguments
    (`ps` shows those to every user): `VLLM_API_KEY="$(rollout engine api-key)" vllm serve …`.
    """
    from rollout.serving import load_engine_api_key

    typer.echo(load_engine_api_key(load_settings(overrides).data_path))
