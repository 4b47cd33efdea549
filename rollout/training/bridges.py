"""Bridges: a published checkpoint in the form an engine loads.

Contract:
- `lora`: the peft adapter files of a LoRA checkpoint (`adapter_config.json`, `adapter_model.safetensors`),
  for the local engine and vLLM's runtime LoRA loading. Nothing is copied: the bridge names the checkpoint's
  own blobs.
- `full`: the weights and config of a full-weights checkpoint (no optimiser state), for an engine reload.
- `merged`: a LoRA checkpoint merged into its base model and saved as safetensors, for an engine that reloads
  full weights; the merged files are uploaded under `bridges/{policy}/{name}/merged/`.
- `tinker`: a checkpoint trained by Tinker is its `tinker.json` (the state and sampler paths); engines sample
  its sampler path (`bridge_location`), so no weights move.
- A bridge is a pure function of the checkpoint (and the base model), so running one twice gives the same
  files: `BridgeWorkflow` records it once per (checkpoint, format) as `CheckpointConverted`.
- Asking for a format the checkpoint cannot give (`lora` of full weights) raises `BridgeError` with the
  reason.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from rollout.blobs import BlobStore
from rollout.records.checkpoints import ADAPTER_FILES, TINKER_FILE, CheckpointFile, CheckpointRecord
from rollout.training.checkpoints import download_files
from rollout.training.local import OPTIMIZER_STATE, TRAINER_STATE

BRIDGE_FORMATS = ("lora", "full", "merged", "tinker")


class BridgeError(ValueError):
    """The checkpoint cannot be given in the format asked for."""


def bridge_files(
    record: CheckpointRecord,
    fmt: str,
    store: BlobStore,
    base_model: str | None = None,
    scratch: Path | None = None,
) -> dict[str, CheckpointFile]:
    """The files of `record` in format `fmt` (relative path -> blob)."""
    if fmt == "tinker":
        if TINKER_FILE not in record.files:
            raise BridgeError(f"{record.name} was not trained by Tinker: it has no sampler path to serve")
        return {TINKER_FILE: record.files[TINKER_FILE]}
    if TINKER_FILE in record.files:
        raise BridgeError(f"{record.name} lives in Tinker: serve it as 'tinker'")
    if fmt == "lora":
        if record.kind != "lora":
            raise BridgeError(f"{record.name} holds full weights, not a LoRA adapter: serve it as 'full'")
        return {name: record.files[name] for name in ADAPTER_FILES}
    if fmt == "full":
        if record.kind == "lora":
            raise BridgeError(f"{record.name} is a LoRA adapter: serve it as 'lora' or 'merged'")
        return {name: f for name, f in record.files.items() if name not in (OPTIMIZER_STATE, TRAINER_STATE)}
    if fmt == "merged":
        if record.kind != "lora":
            return bridge_files(record, "full", store)
        if base_model is None:
            raise BridgeError("merging a LoRA adapter needs the base model it was trained on")
        return _merged(record, store, base_model, scratch)
    raise BridgeError(f"unknown bridge format {fmt!r}: one of {', '.join(BRIDGE_FORMATS)}")


def bridge_location(record: CheckpointRecord, fmt: str, store: BlobStore) -> str | None:
    """Where an engine finds the checkpoint when the format is not files: Tinker's sampler path."""
    if fmt != "tinker":
        return None
    file = bridge_files(record, fmt, store)[TINKER_FILE]
    return str(json.loads(store.get(file.key, expected=file.ref))["sampler"])


def merge_adapter(adapter: Path, base_model: str, out: Path) -> None:
    """Merge the peft adapter folder `adapter` into `base_model` and save the result in `out`: full weights
    as safetensors, with the base model's tokenizer and chat template, loadable with no peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_model)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base_model).save_pretrained(out)


def _merged(
    record: CheckpointRecord, store: BlobStore, base_model: str, scratch: Path | None
) -> dict[str, CheckpointFile]:
    with tempfile.TemporaryDirectory(dir=scratch) as work:
        adapter = download_files(store, {n: record.files[n] for n in ADAPTER_FILES}, Path(work) / "adapter")
        out = Path(work) / "merged"
        merge_adapter(adapter, base_model, out)
        files: dict[str, CheckpointFile] = {}
        for path in sorted(out.rglob("*")):
            if path.is_file():
                relative = path.relative_to(out).as_posix()
                key = f"bridges/{record.policy}/{record.name}/merged/{relative}"
                files[relative] = CheckpointFile.stored(key, store.put(key, path.read_bytes()))
        return files
