"""`rollout sft`: a supervised warm start, published as a checkpoint a run trains from."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rollout.cli.common import JsonFlag, Overrides, err, fail, load_settings, out
from rollout.control.connections import blob_store, local_model


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

    from rollout.control.connections import ledger_session
    from rollout.control.warm_start import WarmStartExists, warm_start
    from rollout.training.sft import ConversationError, SftConfig, read_conversations

    settings = load_settings(overrides)
    spec = settings.trainer
    if not dataset.is_file():
        fail(f"{dataset} is not a file: give a JSONL file of conversations", code=2)
    try:
        rows = read_conversations(dataset)
    except ConversationError as error:
        fail(f'{error}\nEach line is {{"messages": [...]}} whose last message is the assistant\'s.', code=2)
    if not spec.lora_rank:
        fail("the warm start trains a LoRA adapter: set trainer.lora_rank= to 1 or more", code=2)
    model_path = local_model(spec.model, settings)
    config_ = SftConfig(
        lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, learning_rate=spec.learning_rate, epochs=epochs
    )
    holder = f"sft-{socket.gethostname()}-{os.getpid()}"

    async def run() -> dict[str, Any]:
        async with ledger_session(settings) as ledger:
            record = await warm_start(
                ledger,
                blob_store(settings),
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
    if as_json:
        print(json.dumps(summary))
        return
    out.print(
        f"published {summary['checkpoint']}: SFT loss {summary['metrics']['sft_loss_first']:.3f} → "
        f"{summary['metrics']['sft_loss_last']:.3f}. Train from it with `rollout train ENV "
        f"trainer.warm_start={summary['checkpoint']}`",
        highlight=False,
    )
