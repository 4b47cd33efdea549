"""`rollout engine serve`: an inference engine over vLLM's HTTP dialect, with its serving follower.
`rollout engine follow`: the serving follower alone, beside an engine started elsewhere (a `vllm serve`).
`rollout engine api-key`: the key every engine route but /health asks for
(rollout.serving.keys.engine_api_key)."""

from __future__ import annotations

import asyncio
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
from rollout.control.connections import blob_store

if TYPE_CHECKING:
    from rollout.config import Settings
    from rollout.engines.startup import EnginePlan

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
    from rollout.config.catalog import ModelNotPulled
    from rollout.engines.factory import EngineSetupError, build_engine
    from rollout.engines.startup import (
        EngineAsked,
        EnginePortTaken,
        engine_kind,
        plan_engine,
        serve_planned,
    )

    settings = load_settings(overrides)
    asked = EngineAsked(
        kind=kind,
        model=model,
        host=host,
        port=port,
        device=device,
        served_name=served_name,
        script=script,
        think_ms=think_ms,
        tinker_base_model=tinker_base_model,
        tinker_url=tinker_url,
        name=name,
        follow=follow,
        gpu=gpu,
    )
    try:
        chosen = engine_kind(settings, asked)
    except EngineSetupError as error:
        fail(str(error), code=2)
    check_placement(placement)
    if placement == "ray":  # the whole command runs where Ray places it: it resolves its model and port there
        if gpus <= 0 and chosen == "vllm":
            fail("vLLM needs a GPU: give the engine one with `--gpus 1`", code=2)
        rerun_on_ray(f"{chosen} engine", gpus=gpus, address=ray_address, group=ray_group)
        return
    try:
        plan = plan_engine(settings, asked)
    except EngineSetupError as error:
        fail(str(error), code=2)
    except (EnginePortTaken, ModelNotPulled) as error:
        fail(str(error))
    as_service(settings, plan.api_key)
    if plan.kind == "vllm":
        _serve_vllm(plan, settings)
        return
    try:
        with err.status(f"loading {plan.spec.model}…"):
            engine = build_engine(plan.spec)
    except EngineSetupError as error:
        fail(str(error), code=2)
    err.print(f"{plan.spec.describe()} as '{plan.spec.served_name}' on http://{plan.host}:{plan.port}")
    if (no_cache := getattr(engine, "prefix_cache_off", None)) is not None:
        err.print(f"no prefix cache: {no_cache}")
    asyncio.run(serve_planned(plan, engine, lambda: blob_store(settings), err.print))


def _serve_vllm(plan: EnginePlan, settings: Settings) -> None:
    from rollout.engines.startup import serve_planned_vllm, vllm_log
    from rollout.engines.vllm_process import VLLMStartError

    log_path = vllm_log(plan)
    err.print(
        f"starting vllm serve {plan.spec.model_path} on http://{plan.host}:{plan.port} (its output: {log_path})"
    )
    try:
        status = asyncio.run(serve_planned_vllm(plan, lambda: blob_store(settings), err.print))
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
    from rollout.engines.factory import EngineSetupError
    from rollout.engines.startup import FollowAsked, follow_planned, plan_follower

    settings = load_settings(overrides)
    asked = FollowAsked(
        engine_url=engine_url,
        kind=kind,
        name=name,
        served_name=served_name,
        model=model,
        gpu=gpu,
        runs=tuple(run or ()),
    )
    try:
        plan = plan_follower(settings, asked)
    except EngineSetupError as error:
        fail(str(error), code=2)
    as_service(settings, plan.api_key)
    err.print(
        f"following {engine_url} as {plan.config.engine!r} ({kind}: loads {', '.join(plan.config.formats)})"
    )
    asyncio.run(follow_planned(plan, lambda: blob_store(settings), err.print))


@app.command("api-key")
def api_key(overrides: Overrides = None) -> None:
    """Print the engine API key: what every engine route but /health asks for as `Authorization: Bearer`.

    It is derived from DATA_DIR/engine.key (made if there is none), which the gateway, the engines and their
    followers share. Give it to a `vllm serve` of your own in its environment, never among its arguments
    (`ps` shows those to every user): `VLLM_API_KEY="$(rollout engine api-key)" vllm serve …`.
    """
    from rollout.serving.keys import load_engine_api_key

    typer.echo(load_engine_api_key(load_settings(overrides).data_path))
