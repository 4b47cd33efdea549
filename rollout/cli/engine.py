"""`rollout engine serve`: an inference engine over vLLM's HTTP dialect, with its serving follower."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.common import Overrides, as_service, blob_store, err, fail, load_settings

app = typer.Typer(help="Run inference engines.", no_args_is_help=True)


@app.command("serve")
def serve(
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
    trainer publishes and records what the engine serves, which is how the gateway routes turns. --kind vllm
    replaces this process with `vllm serve` and runs no follower: that engine serves the base model only, and
    the gateway reaches it through `rollout gateway --engine-url URL`.
    """
    from rollout.engines.factory import (
        SERVED_FORMATS,
        EngineSetupError,
        EngineSpec,
        build_engine,
        check_engine_options,
        serve_engine,
    )
    from rollout.engines.follower import FollowerConfig
    from rollout.engines.models import resolve
    from rollout.net import port_is_free

    settings = load_settings(overrides)
    as_service(settings)
    if kind not in (*SERVED_FORMATS, "vllm"):
        fail(f"--kind must be local, vllm, tinker or scripted, not {kind!r}", code=2)
    if kind != "vllm":
        try:
            check_engine_options(kind, script=script)
        except EngineSetupError as error:
            fail(str(error), code=2)
    if not port_is_free(host, port):
        fail(f"port {port} on {host} is taken: choose another with `--port PORT`")
    model_path = resolve(model, Path(settings.models_dir).expanduser())
    if kind == "vllm":
        from rollout.engines.vllm_launcher import VLLMLaunch, command

        if shutil.which("vllm") is None:
            fail("vLLM is not installed here: `uv sync --extra vllm` (it needs a CUDA GPU)")
        argv, env = command(VLLMLaunch(model_path, host=host, port=port, served_name=served_name))
        os.execvpe(argv[0], argv, {**os.environ, **env})
    spec = EngineSpec(
        kind=kind,
        model=model,
        model_path=model_path,
        served_name=served_name,
        device=device,
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
    follower = FollowerConfig(
        engine=name or f"engine-{port}",
        url=f"http://{host}:{port}",
        base=served_name,
        formats=SERVED_FORMATS[kind],
        gpu=gpu,
    )
    asyncio.run(
        serve_engine(
            engine,
            host=host,
            port=port,
            follower=follower if follow else None,
            ledger_url=settings.worker_ledger_url,
            store=lambda: blob_store(settings),
            cache_dir=settings.data_path / "engines",
            report=err.print,
        )
    )
