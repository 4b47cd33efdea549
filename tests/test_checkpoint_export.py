"""Checkpoints out (rollout.control.checkpoints, `rollout checkpoint list|export`): a checkpoint the session's
trained run served, exported as a peft adapter folder, gives in transformers + peft the logprobs the engine
recorded for the turns it sampled; merged, it loads with no peft; vLLM's own LoRA checks accept the folder;
bad requests are one paragraph and leave nothing behind."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout.config import Settings
from rollout.control.checkpoints import export_checkpoint, list_checkpoints
from rollout.control.errors import ControlError, NotFound
from rollout.ledger import Ledger
from rollout.ledger.payloads import SampledTurn
from rollout.ledger.queries import run_turns

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def settings(monitor_settings: Settings, trained_run_tracking: Path, trained_run: str) -> Settings:
    """The session stack, with the blob store `trained_run` published its checkpoints into."""
    chosen = copy.deepcopy(monitor_settings)
    chosen.services.blobs.url = (trained_run_tracking.parent / "blobs").as_uri()
    return chosen


@pytest.fixture(scope="module")
def served_turns(stack_settings: Settings, trained_run: str) -> list[SampledTurn]:
    """The run's turns sampled on a checkpoint (not the base model), each the first of its conversation."""
    import asyncio

    async def read() -> list[SampledTurn]:
        async with await Ledger.connect(stack_settings.ledger_url) as ledger:
            turns = []
            for event in await run_turns(ledger, trained_run):
                try:
                    turn = SampledTurn.from_payload(event.payload)
                except (TypeError, ValueError):  # not a turn sampled on an engine
                    continue
                if turn.checkpoint_version > 0 and turn.prompt_prefix_len == 0:
                    turns.append(turn)
            return turns

    turns = asyncio.run(read())
    assert turns, "the trained run sampled no turn on a checkpoint of its own"
    return turns


def _logprobs(model: Callable[..., Any], turn: SampledTurn) -> list[float]:
    import torch

    ids = torch.tensor([[*turn.prompt_ids_delta, *turn.completion_ids]])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    start = len(turn.prompt_ids_delta)
    logprobs = torch.log_softmax(logits[start - 1 : -1], dim=-1)
    return [float(logprobs[i, token]) for i, token in enumerate(turn.completion_ids)]


def test_a_run_lists_its_checkpoints_and_what_each_is(settings: Settings, trained_run: str) -> None:
    listed = list_checkpoints(settings, trained_run)
    assert [c.version for c in listed] == [1, 2]
    assert all(c.kind == "lora" and c.exportable for c in listed)
    assert listed[0].parent is None and listed[1].parent == listed[0].name
    with pytest.raises(NotFound, match="no run 'no-such-run'"):
        list_checkpoints(settings, "no-such-run")


def test_an_exported_adapter_gives_the_logprobs_the_engine_served_and_merged_loads_without_peft(
    settings: Settings, served_turns: list[SampledTurn], tiny_qwen3: str, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    turn = served_turns[0]
    adapter = export_checkpoint(settings, turn.checkpoint, tmp_path / "adapter")
    assert adapter.kind == "lora" and {
        "adapter_config.json",
        "adapter_model.safetensors",
        "README.md",
    } <= set(adapter.files)
    assert (
        "optimizer.pt" not in adapter.files
        and turn.checkpoint in (tmp_path / "adapter" / "README.md").read_text()
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3, torch_dtype="float32")
    with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    on_base = _logprobs(AutoModelForCausalLM.from_pretrained(tiny_qwen3, torch_dtype="float32").eval(), turn)
    for served in served_turns[:3]:
        if served.checkpoint == turn.checkpoint:
            assert _logprobs(with_adapter, served) == pytest.approx(
                list(served.completion_logprobs), abs=2e-3
            )
    # The adapter changes the model (so the match above says something).
    assert max(abs(a - b) for a, b in zip(on_base, turn.completion_logprobs, strict=True)) > 2e-3

    merged = export_checkpoint(settings, turn.checkpoint, tmp_path / "merged", merge=True)
    assert merged.kind == "merged" and merged.base_model == tiny_qwen3
    assert "model.safetensors" in merged.files and "adapter_config.json" not in merged.files
    alone = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", torch_dtype="float32").eval()
    assert _logprobs(alone, turn) == pytest.approx(list(turn.completion_logprobs), abs=2e-3)
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").chat_template  # the template travels with it


def test_vllms_own_lora_checks_accept_the_exported_adapter(
    settings: Settings, served_turns: list[SampledTurn], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's runtime LoRA loading reads the folder with `PEFTHelper`, checks it against its `LoRAConfig`
    and loads the tensors by module name (`LoRAModel`): all three, vLLM's own classes, on CPU."""
    import vllm.lora.lora_model as lora_model
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    folder = tmp_path / "adapter"
    export_checkpoint(settings, served_turns[0].checkpoint, folder, base_model="Qwen/Qwen3-0.6B")
    assert (
        json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "Qwen/Qwen3-0.6B"
    )
    helper = PEFTHelper.from_local_dir(str(folder), max_position_embeddings=None)
    helper.validate_legal(LoRAConfig(max_lora_rank=settings.services.engine.vllm_max_lora_rank))  # pyright: ignore[reportArgumentType]
    monkeypatch.setattr(
        lora_model, "PIN_MEMORY", False
    )  # pinning needs a GPU driver; the checks before it do not
    loaded = lora_model.LoRAModel.from_local_checkpoint(
        str(folder),
        {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
        helper,
        device="cpu",
    )
    assert loaded.loras and all(lora.rank == helper.r for lora in loaded.loras.values())


def test_bad_exports_say_why_in_one_paragraph_and_leave_nothing(
    settings: Settings,
    served_turns: list[SampledTurn],
    stack_settings: Settings,
    models_dir: Path,
    tmp_path: Path,
) -> None:
    with pytest.raises(NotFound, match="no checkpoint 'nobody-step000001'"):
        export_checkpoint(settings, "nobody-step000001", tmp_path / "nothing")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep me")
    with pytest.raises(ControlError, match="already holds files"):
        export_checkpoint(settings, served_turns[0].checkpoint, occupied)
    assert [p.name for p in occupied.iterdir()] == ["mine.txt"]
    assert not (tmp_path / "nothing").exists() and not list(tmp_path.glob(".*partial*"))

    # The command line, offline: the export is written, the push says why it was not, in one paragraph.
    from rollout_testing.stacks import monitor_overrides

    overrides = [*monitor_overrides(stack_settings, models_dir), f"services.blobs.url={settings.blob_url}"]
    target = tmp_path / "to-push"
    command = [sys.executable, "-m", "rollout.cli", "checkpoint", "export", served_turns[0].checkpoint]
    command += ["--to", str(target), "--push-to-hub", "someone/some-adapter", *overrides]
    done = subprocess.run(
        command, capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=180
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert (
        "did not take" in done.stderr
        and "offline" in done.stderr
        and (target / "adapter_config.json").is_file()
    )
