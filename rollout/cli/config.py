"""`rollout config show`: the configuration as composed from the defaults, a preset and the overrides."""

from __future__ import annotations

import json

import typer
from omegaconf import OmegaConf

from rollout import config
from rollout.cli.common import JsonFlag, Overrides, load_settings, out

app = typer.Typer(help="Inspect the composed configuration.", no_args_is_help=True)


@app.command("show")
def show(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """Print the configuration composed from the defaults and the overrides."""
    tree = config.as_dict(load_settings(overrides))
    if as_json:
        print(json.dumps(tree, indent=2))
    else:
        out.print(OmegaConf.to_yaml(tree), highlight=False)
