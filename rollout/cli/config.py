"""`rollout config show`: the configuration as composed from the defaults, a preset and the overrides.
`rollout config budget`: whether that configuration's engine and trainer fit one GPU's memory."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from rollout.cli.common import JsonFlag, Overrides, fail, load_settings, out

app = typer.Typer(help="Inspect the composed configuration.", no_args_is_help=True)


@app.command("show")
def show(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """Print the configuration composed from the defaults and the overrides."""
    from omegaconf import OmegaConf

    from rollout import config

    tree = config.as_dict(load_settings(overrides))
    if as_json:
        print(json.dumps(tree, indent=2))
    else:
        out.print(OmegaConf.to_yaml(tree), highlight=False)


@app.command("budget")
def budget(
    overrides: Overrides = None,
    preset: Annotated[
        str | None, typer.Option(help="Compose this preset first (e.g. minecraft-one-gpu).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check that a configuration's engine and trainer fit one GPU's memory (gpu.mode=shared).

    Prints each phase's estimate from the model's shape: serving (the engine awake: weights, KV cache, LoRA
    slots) and training (the engine asleep: the quantized base, the adapter with its Adam state, activations
    and logits of one micro-batch). Exits 1 when the peak does not fit gpu.memory_gib, saying what to change.
    """
    from rollout.config.catalog import BudgetUnknown, settings_budget

    settings = load_settings([*([f"preset={preset}"] if preset else []), *(overrides or [])])
    try:
        estimate = settings_budget(settings)
    except BudgetUnknown as error:
        fail(str(error), code=2)
    if as_json:
        print(
            json.dumps(
                {
                    "fits": estimate.fits,
                    "device_gib": estimate.device_gib,
                    "peak_gib": round(estimate.peak_gib, 3),
                    "serving": {item.name: round(item.gib, 3) for item in estimate.serving},
                    "training": {item.name: round(item.gib, 3) for item in estimate.training},
                }
            )
        )
    else:
        out.print(estimate.table(), highlight=False)
    if not estimate.fits:
        fail(
            "this configuration does not fit the GPU: lower trainer.micro_batch_tokens, gpu.sequences or "
            "services.gateway.max_context, or use a device with more memory (gpu.memory_gib)"
        )
