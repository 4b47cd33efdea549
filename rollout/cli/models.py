"""`rollout models list` and `rollout models pull NAME`: the catalog's models, fetched where a network
exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rollout.cli.common import JsonFlag, Overrides, err, fail, load_settings, out
from rollout.control.connections import local_model

app = typer.Typer(help="List and fetch the models presets name.", no_args_is_help=True)


@app.command("list")
def list_models(overrides: Overrides = None, as_json: JsonFlag = False) -> None:
    """The catalog's models: where each comes from, its download size, and whether it is pulled here."""
    from rollout.config.catalog import CATALOG, model_dir, pulled

    models_dir = Path(load_settings(overrides).models_dir).expanduser()
    rows = [
        {
            "name": model.name,
            "repo": model.repo,
            "download_gib": model.download_gib,
            "pulled": pulled(model.name, models_dir),
            "path": str(model_dir(model.name, models_dir)),
            "about": model.about,
        }
        for model in CATALOG.values()
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        state = "pulled" if row["pulled"] else f"not pulled ({row['download_gib']:.1f} GiB)"
        out.print(f"{row['name']:<12} {row['repo']:<20} {state}\n  {row['about']}", highlight=False)


@app.command("pull")
def pull(
    name: Annotated[str, typer.Argument(help="A catalog model (`rollout models list`).")],
    overrides: Overrides = None,
) -> None:
    """Download a catalog model into models_dir, from Hugging Face (or $HF_ENDPOINT), once.

    Nothing else downloads models: a preset that names one refuses to start until it is pulled. A partial
    download resumes where it stopped; a model already pulled is left as it is.
    """
    from rollout.config.catalog import CATALOG, PullError, pull_model
    from rollout.engines.models import BUILTIN

    # A built-in model is built from the packages installed here: nothing to download (a chart's pods pull
    # any).
    if name in BUILTIN:
        out.print(f"{name}: built in, at {local_model(name, load_settings(overrides))}", highlight=False)
        return
    if name not in CATALOG:
        fail(
            f"no model {name!r} in the catalog; `rollout models list` shows them ({', '.join(CATALOG)})",
            code=2,
        )
    models_dir = Path(load_settings(overrides).models_dir).expanduser()
    model = CATALOG[name]
    err.print(f"pulling {model.repo} ({model.download_gib:.1f} GiB) into {models_dir / name}")
    try:
        path = pull_model(model, models_dir)
    except PullError as error:
        fail(str(error))
    out.print(f"{name}: {path}", highlight=False)
