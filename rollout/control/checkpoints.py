"""`rollout checkpoint list` and `rollout checkpoint export`: a run's checkpoints, and one of them out of the
blob store in the formats everyone loads.

Contract:
- `list_checkpoints(settings, run)` is the run's checkpoints, oldest first (`CheckpointSummary`: its name,
  policy, version, parent, metrics, when it was recorded, and its `kind`: `lora` (a peft adapter), `full`
  (full weights) or `tinker` (it lives in Tinker's service and cannot be exported). A run the ledger does
  not hold is `NotFound`.
- `export_checkpoint(settings, name, directory, merge=False, base_model=None)` (blocking) writes the
  checkpoint into `directory`, which must not exist yet or be empty:
  - a LoRA checkpoint: its peft adapter folder (`adapter_config.json`, `adapter_model.safetensors`), which
    transformers with peft, and vLLM's LoRA loader, load; with `merge`, the adapter merged into its base
    model instead: full weights in safetensors with the base model's tokenizer and chat template, which
    transformers loads with no peft;
  - a full-weights checkpoint: its weights and config, without the trainer's optimiser state (`merge`
    changes nothing);
  - and a `README.md` saying what it is: the run, policy, step, parent, metrics and base model.
  The base model a merge needs is `base_model` where given (a Hugging Face id or a folder), else the one the
  adapter names when that folder is on this machine; otherwise a `ControlError` asks for `--base-model`. A
  given `base_model` is also what the exported adapter names, so a folder pushed to the Hub names its base
  by its Hub id. Every file is checked against the hash the ledger recorded. The folder appears whole or
  not at all (written beside it, then renamed). A checkpoint the ledger does not hold is `NotFound`; a Tinker
  one, or a target that holds files, is a `ControlError` saying what to do.
- `push_to_hub(directory, repo, private=True)` uploads an exported folder with `huggingface_hub`, creating
  the repository if needed, with the token `huggingface_hub` finds itself (`HF_TOKEN`, or `hf auth login`):
  never one on the command line. Offline, or refused, it is a `ControlError` with the hub's reason; nothing
  is sent when `HF_HUB_OFFLINE` is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.control.connections import blob_store, ledger_session
from rollout.control.errors import ControlError, NotFound

if TYPE_CHECKING:
    from rollout.blobs import BlobStore
    from rollout.config import Settings
    from rollout.records.checkpoints import CheckpointKind, CheckpointRecord

NO_SUCH_CHECKPOINT = (
    "the ledger has no checkpoint {name!r}: `rollout checkpoint list RUN` shows a run's checkpoints"
)


@dataclass(frozen=True)
class CheckpointSummary:
    """One checkpoint of a run, as `rollout checkpoint list` shows it."""

    name: str
    policy: str
    version: int  # the training step that made it
    parent: str | None  # the checkpoint it was trained from (None: the base model)
    kind: CheckpointKind
    recorded_at: datetime
    metrics: dict[str, float] = field(default_factory=dict[str, float])

    @property
    def exportable(self) -> bool:
        return self.kind != "tinker"


@dataclass(frozen=True)
class ExportedCheckpoint:
    """What `export_checkpoint` wrote."""

    name: str
    directory: Path
    kind: str  # lora (an adapter folder), merged (full weights from an adapter) or full
    files: list[str]  # relative paths, sorted
    base_model: str | None  # the base model the adapter applies to, or was merged into (None: unknown)


def list_checkpoints(settings: Settings, run: str) -> list[CheckpointSummary]:
    return asyncio.run(_list(settings, run))


async def _list(settings: Settings, run: str) -> list[CheckpointSummary]:
    from rollout.control.runs import NO_SUCH_RUN
    from rollout.ledger.queries import checkpoint_payload, find_run
    from rollout.ledger.views import checkpoint_tree
    from rollout.records.checkpoints import CheckpointRecord

    async with ledger_session(settings) as ledger:
        if await find_run(ledger, run) is None:
            raise NotFound(NO_SUCH_RUN.format(run=run))
        summaries = []
        for node in await checkpoint_tree(ledger, run=run):
            payload = await checkpoint_payload(ledger, node.policy, node.name)
            if payload is None:
                continue
            record = CheckpointRecord.from_payload(payload)
            summaries.append(
                CheckpointSummary(
                    node.name,
                    node.policy,
                    node.version,
                    node.parent,
                    record.kind,
                    node.recorded_at,
                    node.metrics,
                )
            )
        return summaries


def export_checkpoint(
    settings: Settings, name: str, directory: Path, *, merge: bool = False, base_model: str | None = None
) -> ExportedCheckpoint:
    record = asyncio.run(_find(settings, name))
    kind = record.kind
    if kind == "tinker":
        raise ControlError(
            f"{name} was trained by Tinker and lives in its service, not in this blob store: download it with "
            "Tinker's own tools (its sampler path is in the checkpoint's tinker.json)"
        )
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ControlError(
            f"{directory} already holds files: export into a new or empty folder (choose another --to)",
            usage=True,
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    store = blob_store(settings)
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=f".{directory.name}.partial-") as work:
        staged = Path(work) / "export"
        staged.mkdir()
        written_base = _write(record, kind, store, staged, Path(work), merge=merge, base_model=base_model)
        exported_kind = "merged" if kind == "lora" and merge else kind
        (staged / "README.md").write_text(_model_card(record, exported_kind, written_base))
        if directory.exists():
            directory.rmdir()  # empty, as checked: the rename below needs its name free
        os.replace(staged, directory)
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return ExportedCheckpoint(name, directory, exported_kind, files, written_base)


async def _find(settings: Settings, name: str) -> CheckpointRecord:
    from rollout.training.checkpoints import find_checkpoint, policy_of

    async with ledger_session(settings) as ledger:
        record = await find_checkpoint(ledger, policy_of(name), name)
    if record is None:
        raise NotFound(NO_SUCH_CHECKPOINT.format(name=name))
    return record


def _write(
    record: CheckpointRecord,
    kind: CheckpointKind,
    store: BlobStore,
    staged: Path,
    work: Path,
    *,
    merge: bool,
    base_model: str | None,
) -> str | None:
    """Write the checkpoint's export into `staged`; the base model it names or was merged into."""
    from rollout.blobs import BlobIntegrityError
    from rollout.training.bridges import bridge_files, merge_adapter
    from rollout.training.checkpoints import download_files

    wanted = bridge_files(record, kind, store)  # the adapter, or the weights without the optimiser's state
    adapter = staged if kind == "lora" and not merge else work / "adapter"
    try:
        download_files(store, wanted, adapter if kind == "lora" else staged)
    except (BlobIntegrityError, FileNotFoundError, KeyError) as error:
        raise ControlError(f"the blob store cannot give {record.name}'s files whole: {error}") from error
    if kind != "lora":
        return None
    config_path = adapter / "adapter_config.json"
    config = json.loads(config_path.read_text())
    named = config.get("base_model_name_or_path")
    base = base_model or (named if isinstance(named, str) and Path(named).is_dir() else None)
    if base_model:
        config["base_model_name_or_path"] = base_model  # what a reader of the folder (the Hub's) can find
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    if not merge:
        return base or (named if isinstance(named, str) else None)
    if base is None:
        raise ControlError(
            f"merging {record.name} needs its base model, and the one its adapter names ({named}) is not on "
            "this machine: give it with --base-model (a Hugging Face id or a folder)",
            usage=True,
        )
    try:
        merge_adapter(adapter, base, staged)
    except (OSError, ValueError) as error:
        raise ControlError(
            f"merging {record.name} into {base} failed: {' '.join(str(error).split())}"
        ) from error
    return base


def _model_card(record: CheckpointRecord, kind: str, base_model: str | None) -> str:
    what = {
        "lora": "a LoRA adapter (peft): load it with `PeftModel.from_pretrained(base, THIS_FOLDER)`, or serve it "
        "with vLLM's `--lora-modules NAME=THIS_FOLDER`",
        "merged": "full weights (a LoRA adapter merged into its base model), with the tokenizer and chat "
        "template: load it with `AutoModelForCausalLM.from_pretrained(THIS_FOLDER)`",
        "full": "full weights, without the trainer's optimiser state",
    }[kind]
    metrics = "".join(f"| {key} | {value:g} |\n" for key, value in sorted(record.metrics.items()))
    return (
        f"# {record.name}\n\n"
        f"Trained with rollout: run `{record.run}`, policy `{record.policy}`, step {record.version}, from "
        f"{f'`{record.parent}`' if record.parent else 'the base model'}. This folder is {what}.\n\n"
        f"Base model: {f'`{base_model}`' if base_model else 'not recorded'}.\n"
        + (f"\n| metric at this step | value |\n|---|---|\n{metrics}" if metrics else "")
    )


def push_to_hub(directory: Path, repo: str, *, private: bool = True) -> str:
    """Upload an exported folder to the Hub repository `repo` (made if missing); its URL."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError as error:
        raise ControlError(
            "pushing to the Hub needs huggingface_hub: `uv add huggingface_hub` (or rollout[trainers])"
        ) from error
    api = HfApi()
    try:
        url = api.create_repo(repo, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(directory), repo_id=repo, commit_message="rollout export")
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise ControlError(
            f"the Hugging Face Hub did not take {directory} into {repo}: {' '.join(str(error).split())} (the "
            "folder is exported; push it again once the hub is reachable and you are logged in: `hf auth "
            "login`, or HF_TOKEN in the environment)"
        ) from error
    return str(url)
