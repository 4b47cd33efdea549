"""`rollout train`: start what is missing, start a run that trains, and show it live until it is done.

Contract:
- `run_input` turns settings (a preset plus overrides) into the run: the environment, `run.*` (groups in flight,
  max_lag, max_tokens, recorded as the run's settings) and `trainer.*` (steps, groups per batch, advantages).
- `TrainingProgress` reads where a run is from the ledger alone (checkpoints with their metrics, which of them
  an engine has served, episodes finished), so the display shows what is durable, and a reader can come and go.
- Nothing here decides anything a workflow decides: stopping at `trainer.steps` is `RunWorkflow`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollout.config import Settings
from rollout.ledger import Kind, Ledger
from rollout.serving import ACKS_STREAM, ServingAck
from rollout.training.checkpoints import checkpoints_stream
from rollout.workflows.types import RunInput, TrainingSpec, run_policy


def run_input(settings: Settings, environment: str, run: str) -> RunInput:
    trainer = settings.trainer
    formats = ["tinker"] if trainer.provider == "tinker" else ["lora"] if trainer.lora_rank else ["merged"]
    training = TrainingSpec(
        trainer.steps,
        trainer.groups_per_batch,
        trainer.advantage.value,
        serve_formats=formats,
        warm_start=trainer.warm_start,
    )
    return RunInput(
        run,
        environment,
        groups_in_flight=settings.run.groups_in_flight,
        max_lag=settings.run.max_lag,
        settings={"max_tokens": settings.run.max_tokens},
        training=training,
    )


@dataclass
class Step:
    version: int
    name: str
    metrics: dict[str, float]


@dataclass
class TrainingProgress:
    run: str
    policy: str
    steps: list[Step] = field(default_factory=list[Step])
    served: set[str] = field(default_factory=set[str])
    episodes: int = 0
    _acks_cursor: int = 0

    @property
    def ledger_policy(self) -> str:
        return run_policy(self.run, self.policy)

    async def refresh(self, ledger: Ledger) -> None:
        created = await ledger.read(checkpoints_stream(self.ledger_policy), limit=100000)
        self.steps = [
            Step(int(e.payload["version"]), str(e.payload["name"]), dict(e.payload.get("metrics", {})))
            for e in created
            if e.kind == Kind.CHECKPOINT_CREATED
        ]
        while events := await ledger.read(ACKS_STREAM, after=self._acks_cursor):
            self._acks_cursor = events[-1].seq
            for event in events:
                ack = ServingAck.from_payload(dict(event.payload))
                self.served |= {s.checkpoint for s in ack.serving if s.policy == self.ledger_policy}
        row = await ledger.fetch_one(
            "SELECT count(*) AS n FROM event WHERE stream_id = %s AND kind = 'EpisodeFinished'",
            f"run/{self.run}/episodes",
        )
        self.episodes = int(row["n"]) if row else 0

    @property
    def newest(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def line(self) -> str:
        """One line for the live display: step, reward, staleness, KL, served."""
        newest = self.newest
        if newest is None:
            return f"waiting for the first batch · {self.episodes} episodes played"
        m = newest.metrics
        return (
            f"step {newest.version} · reward {m.get('reward_mean', float('nan')):.3f} · staleness "
            f"{m.get('staleness_mean', 0.0):.2f} · KL {m.get('kl_k3', 0.0):.4f} · served "
            f"{len(self.served)}/{len(self.steps)} · {self.episodes} episodes"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "policy": self.ledger_policy,
            "steps": len(self.steps),
            "checkpoints": [s.name for s in self.steps],
            "served": sorted(self.served),
            "episodes": self.episodes,
            "reward_by_step": [round(s.metrics.get("reward_mean", float("nan")), 4) for s in self.steps],
        }
