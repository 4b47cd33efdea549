"""`rollout cluster connect|use|show`: cluster contexts, and the `--cluster` option other commands take.

Contract:
- A context names a deployed rollout's services: the ledger's Postgres URL, Temporal's address, the blob store
  (and its S3 endpoint), the gateway's and the dashboard's URLs, and the kubeconfig context it lives in. It is
  kept as `{config home}/clusters/NAME.json` (config home: $ROLLOUT_CONFIG_HOME, else ~/.config/rollout), mode
  600 (its URLs may carry a password), and `connect` makes it the current one (`current`).
- `cluster_overrides(name=None)` are the settings a command run with `--cluster` composes on top of its own,
  so it talks to the cluster instead of the embedded stack; no current context is one clear error saying how
  to make one. `cluster_settings(preset, overrides)` also composes `preset` as the cluster's ledger stores it
  (`rollout preset load DIR --cluster`; `NAME@VERSION` picks a version, `NAME` the newest), else the built-in
  preset of that name.
- A context may keep the gateway's operator key (`--operator-key-file`): `seat new --cluster` opens seats
  through the gateway's operator route with it (since the seat secret stays in the cluster), and refuses to
  without one: every operator route needs the key, wherever the gateway listens.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollout.cli.common import JsonFlag, err, fail, load_settings, out

if TYPE_CHECKING:
    from rollout.config import Settings

app = typer.Typer(help="Cluster contexts: where a deployed rollout's services are.", no_args_is_help=True)

ClusterFlag = Annotated[
    bool,
    typer.Option(
        "--cluster",
        help="Talk to the current cluster context (`rollout cluster connect`) instead of the embedded stack.",
    ),
]


@dataclass(frozen=True)
class ClusterContext:
    name: str
    postgres_url: str
    temporal_address: str
    blobs_url: str
    s3_endpoint: str | None = None
    s3_secure: bool = True
    gateway_url: str | None = None
    monitor_url: str | None = None
    kube_context: str | None = None
    operator_key: str | None = None

    def overrides(self) -> list[str]:
        from rollout.config.overrides import hydra_quote

        settings = [
            f"services.postgres.url={hydra_quote(self.postgres_url)}",
            f"services.postgres.worker_url={hydra_quote(self.postgres_url)}",
            f"services.temporal.address={hydra_quote(self.temporal_address)}",
            f"services.blobs.url={hydra_quote(self.blobs_url)}",
            f"services.blobs.s3_secure={self.s3_secure}",
        ]
        if self.s3_endpoint:
            settings.append(f"services.blobs.s3_endpoint={hydra_quote(self.s3_endpoint)}")
        return settings


def config_home() -> Path:
    return Path(os.environ.get("ROLLOUT_CONFIG_HOME") or Path.home() / ".config" / "rollout")


def save_context(context: ClusterContext) -> Path:
    folder = config_home() / "clusters"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{context.name}.json"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(asdict(context), handle, indent=2)
    (folder / "current").write_text(context.name)
    return path


def load_context(name: str | None = None) -> ClusterContext:
    folder = config_home() / "clusters"
    current = folder / "current"
    chosen = name or (current.read_text().strip() if current.is_file() else None)
    if not chosen:
        fail(
            "no cluster context: make one with `rollout cluster connect NAME --postgres-url URL --temporal ADDRESS "
            "--blobs-url s3://BUCKET/` (the chart's NOTES print them)"
        )
    path = folder / f"{chosen}.json"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.json"))
        fail(
            f"no cluster context {chosen!r} (known: {', '.join(known) or 'none'}); `rollout cluster connect`"
        )
    return ClusterContext(**json.loads(path.read_text()))


def cluster_overrides(use_cluster: bool, overrides: list[str] | None) -> list[str]:
    """The command's overrides, on top of the current cluster context's settings when `--cluster` was
    given."""
    return [*(load_context().overrides() if use_cluster else []), *(overrides or [])]


def cluster_settings(preset: str, overrides: list[str] | None) -> Settings:
    """The settings of a command run with --cluster: the context's services, `preset` as the cluster's ledger
    stores it (else the built-in one of that name), then `overrides`."""
    import tempfile

    from rollout.config import ConfigError, load
    from rollout.config.presets import UnknownPreset, newest, write_presets
    from rollout.control.connections import ledger_session
    from rollout.records.presets import PresetVersion

    base = cluster_overrides(True, overrides)
    if preset == "none":
        return load_settings(base)
    name, _, version = preset.partition("@")
    if version and not version.isdigit():
        fail(
            f"--preset {preset}: a version is a whole number (NAME@3), or leave it out for the newest", code=2
        )
    reach = load_settings(base)

    async def find() -> PresetVersion:
        async with ledger_session(reach) as ledger:
            return await newest(ledger, name, int(version) if version else None)

    try:
        found = asyncio.run(find())
    except UnknownPreset as error:
        if version or not (Path(__file__).parents[1] / "conf" / "preset" / f"{name}.yaml").is_file():
            fail(str(error), code=2)
        return load_settings([f"preset={name}", *base])
    # Under a name of its own: a stored preset named like a built-in one must not lose to it.
    chosen = PresetVersion(f"stored-{found.name}-v{found.version}", found.version, found.sha256, found.text)
    with tempfile.TemporaryDirectory() as scratch:
        write_presets([chosen], Path(scratch))
        try:
            return load([f"preset={chosen.name}", *base], preset_dirs=[Path(scratch)])
        except ConfigError as error:
            fail(f"preset {found.ref} from the cluster's ledger does not compose: {error}", code=2)


@app.command("connect")
def connect(
    name: Annotated[str, typer.Argument(help="A name for this cluster.")],
    postgres_url: Annotated[
        str | None, typer.Option(help="The ledger: postgresql://USER:PASSWORD@HOST:5432/rollout.")
    ] = None,
    temporal: Annotated[str | None, typer.Option(help="Temporal's frontend, host:port.")] = None,
    blobs_url: Annotated[
        str | None, typer.Option(help="The blob store: s3://BUCKET/PREFIX or file:///path.")
    ] = None,
    s3_endpoint: Annotated[str | None, typer.Option(help="The S3 API, host:port (MinIO, AWS).")] = None,
    s3_secure: Annotated[bool | None, typer.Option(help="Reach the S3 API over TLS (default: yes).")] = None,
    gateway_url: Annotated[str | None, typer.Option(help="The gateway, for agents and `seat new`.")] = None,
    monitor_url: Annotated[str | None, typer.Option(help="The dashboard, for `monitor --cluster`.")] = None,
    kube_context: Annotated[
        str | None, typer.Option(help="The kubeconfig context the release is in.")
    ] = None,
    operator_key_file: Annotated[
        Path | None,
        typer.Option(
            help="The gateway's operator key (the chart's Secret, key operatorKey), for `seat new`."
        ),
    ] = None,
    values: Annotated[
        Path | None,
        typer.Option(
            help="The chart's values file the release was installed with: the services' addresses it names "
            "fill the options not given (the database password: $PGPASSWORD, or in --postgres-url)."
        ),
    ] = None,
) -> None:
    """Record where a deployed rollout's services are, and make it the current cluster (`--cluster` uses
    it)."""
    if operator_key_file is not None and not operator_key_file.is_file():
        fail(f"--operator-key-file {operator_key_file}: no such file", code=2)
    given = _from_values(values) if values is not None else {}
    postgres_url, temporal = postgres_url or given.get("postgres_url"), temporal or given.get("temporal")
    blobs_url, s3_endpoint = blobs_url or given.get("blobs_url"), s3_endpoint or given.get("s3_endpoint")
    missing = [
        f"--{n}"
        for n, v in (("postgres-url", postgres_url), ("temporal", temporal), ("blobs-url", blobs_url))
        if not v
    ]
    if missing:
        fail(
            f"cluster {name}: give {', '.join(missing)} (a values file names them only for services outside the "
            "release: services.postgres.url, services.temporal.address, services.blobs.url)",
            code=2,
        )
    assert postgres_url and temporal and blobs_url
    secure = s3_secure if s3_secure is not None else given.get("s3_secure", "true") == "true"
    context = ClusterContext(
        name=name,
        postgres_url=postgres_url,
        temporal_address=temporal,
        blobs_url=blobs_url,
        s3_endpoint=s3_endpoint,
        s3_secure=secure,
        gateway_url=gateway_url,
        monitor_url=monitor_url,
        kube_context=kube_context,
        operator_key=operator_key_file.read_text().strip() if operator_key_file else None,
    )
    path = save_context(context)
    err.print(f"cluster {name} saved in {path}; commands given --cluster now use it")


def _from_values(path: Path) -> dict[str, str]:
    """The services' addresses a chart values file names (only those outside the release have one)."""
    import yaml

    try:
        tree = yaml.safe_load(path.read_text()) or {}
        services = tree.get("services", {}) if isinstance(tree, dict) else {}
    except (OSError, yaml.YAMLError) as error:
        fail(f"--values {path}: {error}", code=2)
    postgres, temporal, blobs = (services.get(k) or {} for k in ("postgres", "temporal", "blobs"))
    found = {
        "postgres_url": postgres.get("url"),
        "temporal": temporal.get("address"),
        "blobs_url": blobs.get("url"),
        "s3_endpoint": blobs.get("s3_endpoint"),
    }
    if blobs.get("s3_secure") is not None:
        found["s3_secure"] = str(blobs["s3_secure"]).lower()
    return {key: str(value) for key, value in found.items() if value not in (None, "")}


@app.command("use")
def use(
    name: Annotated[str, typer.Argument(help="A cluster context made by `rollout cluster connect`.")],
) -> None:
    """Make another saved cluster context the current one."""
    context = load_context(name)
    (config_home() / "clusters" / "current").write_text(context.name)
    err.print(f"--cluster now means {context.name}")


@app.command("show")
def show(as_json: JsonFlag = False) -> None:
    """The current cluster context (its database URL's password hidden)."""
    context = asdict(load_context())
    url = str(context["postgres_url"])
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        user = url.split("//", 1)[-1].split(":", 1)[0]
        context["postgres_url"] = f"{url.split('//', 1)[0]}//{user}:***@{url.split('@', 1)[1]}"
    if context["operator_key"]:
        context["operator_key"] = "***"
    if as_json:
        print(json.dumps(context, indent=2))
    else:
        for key, value in context.items():
            out.print(f"{key:<18} {value}", highlight=False)
