"""The supervised warm start: TRL's SFTTrainer fine-tunes a LoRA adapter (tiny-qwen3, CPU), published as a
checkpoint a run's first step trains from."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from rollout.blobs import FileBlobStore
from rollout.control.warm_start import WarmStartExists, warm_start, warm_start_name
from rollout.ledger import Ledger
from rollout.rl.losses import LossConfig
from rollout.training.checkpoints import fetch_checkpoint, find_checkpoint
from rollout.training.local import LocalTrainer, LocalTrainerConfig
from rollout.training.sft import ConversationError, SftConfig, read_conversations
from rollout.workflows.names import run_policy
from tests.test_cli_stack import rollout


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _conversation(question: str, answer: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def test_rows_must_be_conversations_ending_in_the_assistants_reply(tmp_path: Path) -> None:
    good = read_conversations(_write(tmp_path / "good.jsonl", [_conversation("What is 2 + 2?", "4")]))
    assert good == [
        {
            "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
            "completion": [{"role": "assistant", "content": "4"}],
        }
    ]
    with pytest.raises(ConversationError, match=r"bad\.jsonl:2: the last message must be the assistant's"):
        read_conversations(
            _write(
                tmp_path / "bad.jsonl",
                [_conversation("a", "b"), {"messages": [{"role": "user", "content": "a"}]}],
            )
        )
    with pytest.raises(ConversationError, match=r"worse\.jsonl:1: not a JSON object"):
        read_conversations(_write(tmp_path / "worse.jsonl", [["not", "an", "object"]]))
    done = rollout("sft", str(tmp_path / "bad.jsonl"))
    assert done.returncode == 2 and "bad.jsonl:2" in done.stderr and "assistant" in done.stderr


async def test_a_warm_start_is_published_once_and_resumes_as_a_checkpoint(
    ledger: Ledger, tiny_qwen3: str, tmp_path: Path
) -> None:
    rows = read_conversations(
        _write(
            tmp_path / "arith.jsonl",
            [
                _conversation(f"What is {a} + {b}? Answer with the number only.", str(a + b))
                for a in range(4)
                for b in range(2)
            ],
        )
    )
    store = FileBlobStore(tmp_path / "blobs")
    name = f"arith-{uuid.uuid4().hex[:6]}"
    config = SftConfig(lora_rank=4, lora_alpha=8, learning_rate=5e-3, epochs=3, batch_size=4)
    record = await warm_start(
        ledger,
        store,
        name=name,
        model_path=tiny_qwen3,
        rows=rows,
        config=config,
        holder="sft-test",
        scratch=tmp_path,
    )
    assert record.name == warm_start_name(name) == f"sft/{name}-step000001"
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer.json"} <= set(record.files)
    assert record.metrics["sft_examples"] == 8 and record.metrics["sft_steps"] == 6
    assert record.metrics["sft_loss_last"] < record.metrics["sft_loss_first"], (
        "supervised fine-tuning learned"
    )
    with pytest.raises(WarmStartExists, match="exists"):
        await warm_start(
            ledger, store, name=name, model_path=tiny_qwen3, rows=rows, config=config, holder="sft-test"
        )

    # A run's first step names it as its parent: found from the run's own lineage, resumed like a checkpoint.
    found = await find_checkpoint(ledger, run_policy("some-run", "default"), record.name)
    assert found == record
    directory = fetch_checkpoint(store, record, tmp_path / "fetched")
    trainer = LocalTrainer.resume(directory, LocalTrainerConfig(lora_rank=4, lora_alpha=8), LossConfig())
    base = LocalTrainer(tiny_qwen3, LocalTrainerConfig(lora_rank=4, lora_alpha=8), LossConfig())
    tokens = torch.tensor([[151644, 872, 198, 17, 151645]])
    with torch.no_grad():
        moved = not torch.allclose(
            trainer.model(input_ids=tokens).logits, base.model(input_ids=tokens).logits
        )
    assert moved and trainer.steps == 0, (
        "the adapter carries the fine-tuned weights; RL's optimiser starts fresh"
    )
