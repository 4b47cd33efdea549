"""`rollout checkpoint list RUN` and `rollout checkpoint export NAME --to DIR [--merge] [--push-to-hub REPO]`:
a run's checkpoints, and one of them out in the formats transformers, peft and vLLM load
(rollout.control.checkpoints does the work)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.cluster import ClusterFlag, cluster_overrides
from rollout.cli.common import JsonFlag, Overrides, load_settings, out

app = typer.Typer(help="A run's checkpoints, and exporting one to load elsewhere.", no_args_is_help=True)


@app.command("list")
def list_(
    run: Annotated[str, typer.Argument(help="The run's id (`rollout run list` shows them).")],
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """The run's checkpoints, oldest first: each one's name, policy, step, what it is (a LoRA adapter, full
    weights, or Tinker's, which stays in Tinker) and its parent."""
    from rollout.control.checkpoints import list_checkpoints

    checkpoints = list_checkpoints(load_settings(cluster_overrides(cluster, overrides)), run)
    if as_json:
        rows = [
            asdict(c) | {"recorded_at": c.recorded_at.isoformat(), "exportable": c.exportable}
            for c in checkpoints
        ]
        print(json.dumps(rows, indent=2))
        return
    if not checkpoints:
        out.print(f"run {run} has no checkpoints yet", highlight=False)
    for c in checkpoints:
        note = "" if c.exportable else "  (lives in Tinker: not exportable)"
        parent = c.parent or "the base model"
        out.print(
            f"{c.name:<28} {c.policy:<12} step {c.version:<5} {c.kind:<6} from {parent}{note}",
            highlight=False,
        )


@app.command("export")
def export(
    name: Annotated[str, typer.Argument(help="The checkpoint (`rollout checkpoint list RUN` names them).")],
    to: Annotated[Path, typer.Option("--to", help="A new (or empty) folder to write it into.")],
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Merge a LoRA adapter into its base model: full weights, tokenizer and chat template.",
        ),
    ] = False,
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model",
            help="The base model (a Hugging Face id or a folder): what a merge merges into, and what the adapter "
            "names. Default: the folder the adapter was trained on, where it is on this machine.",
        ),
    ] = None,
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            help="Then upload the folder to this Hugging Face repository (made private if missing); the token "
            "comes from HF_TOKEN or `hf auth login`, never the command line.",
        ),
    ] = None,
    overrides: Overrides = None,
    cluster: ClusterFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a checkpoint into a folder that transformers with peft, and vLLM's LoRA loader, load: its adapter
    (or, with --merge, full weights in safetensors with the tokenizer and chat template), and a README."""
    from rollout.control.checkpoints import export_checkpoint
    from rollout.control.checkpoints import push_to_hub as push

    settings = load_settings(cluster_overrides(cluster, overrides))
    exported = export_checkpoint(settings, name, to, merge=merge, base_model=base_model)
    pushed = push(exported.directory, push_to_hub) if push_to_hub else None
    if as_json:
        print(json.dumps(asdict(exported) | {"directory": str(exported.directory), "pushed_to": pushed}))
        return
    what = {"lora": "a LoRA adapter", "merged": "merged full weights", "full": "full weights"}[exported.kind]
    out.print(f"{name} → {exported.directory} ({what}, {len(exported.files)} files)", highlight=False)
    if pushed:
        out.print(f"pushed to {pushed}", highlight=False)
