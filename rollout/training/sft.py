"""A supervised warm start with TRL: fine-tune a LoRA adapter on example conversations before RL.

TRL serves here, not as a second RL loop: its `SFTTrainer` trains the adapter, and the result is a checkpoint
like any other, which a run's first step trains from (`trainer.warm_start=`).

Contract:
- Rows are conversations, `{"messages": [...]}` in chat format, whose last message is the assistant's reply
  to learn. Each becomes a prompt (the messages before it) and a completion (that reply); the loss is on the
  completion only, rendered with the model's own chat template.
- `read_conversations` rejects a row without messages or whose last message is not the assistant's, naming
  the line, before anything trains.
- `sft_warm_start` writes a peft adapter directory in the local provider's checkpoint layout (adapter files
  and `trainer.json`, no optimiser state: RL starts its optimiser fresh), so `LocalTrainer.resume` and the
  `lora` bridge read it like a checkpoint trained by rollout.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout.training.local import TRAINER_STATE, LocalTrainerConfig


class ConversationError(ValueError):
    """A row of the SFT data is not a conversation ending in an assistant reply."""


@dataclass(frozen=True)
class SftConfig:
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 2e-4
    epochs: float = 1.0
    batch_size: int = 4
    max_length: int = 1024
    seed: int = 0


def read_conversations(path: Path) -> list[dict[str, Any]]:
    """Prompt-completion rows from a JSONL file of `{"messages": [...]}` conversations."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
        except (ValueError, KeyError, TypeError) as error:
            raise ConversationError(
                f'{path}:{number}: not a JSON object with "messages" ({error})'
            ) from error
        if not isinstance(messages, list) or len(messages) < 2 or messages[-1].get("role") != "assistant":
            raise ConversationError(
                f"{path}:{number}: the last message must be the assistant's reply to learn"
            )
        rows.append({"prompt": messages[:-1], "completion": [messages[-1]]})
    if not rows:
        raise ConversationError(f"{path} holds no conversation")
    return rows


def sft_warm_start(
    model_path: str, rows: list[dict[str, Any]], directory: Path, config: SftConfig
) -> dict[str, float]:
    """Train a LoRA adapter on `rows` with TRL and save it in `directory`; the training metrics."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    torch.manual_seed(config.seed)
    local = LocalTrainerConfig(lora_rank=config.lora_rank, lora_alpha=config.lora_alpha)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    arguments = SFTConfig(
        output_dir=str(directory / "work"),
        num_train_epochs=config.epochs,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size,
        max_length=config.max_length,
        completion_only_loss=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=config.seed,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = SFTTrainer(
        model=model,
        args=arguments,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        peft_config=LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            target_modules=list(local.target_modules),
            task_type="CAUSAL_LM",
        ),
    )
    result = trainer.train()
    trained: Any = trainer.model  # the peft model
    trained.save_pretrained(directory)
    (directory / TRAINER_STATE).write_text(
        json.dumps({"steps": 0, "model_path": model_path, "config": asdict(local)})
    )
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "sft_loss_first": float(losses[0]),
        "sft_loss_last": float(losses[-1]),
        "sft_steps": float(result.global_step),
        "sft_examples": float(len(rows)),
    }
