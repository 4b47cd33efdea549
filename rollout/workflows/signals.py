"""Typed stubs of the signals a workflow sends to one whose class it cannot import: a child to its parent
(`TrainingWorkflow` and `EpisodeSupplyWorkflow` → `RunWorkflow`, which starts them), an eval to the run and
the training it gates. `handle.signal(RunSignals.training_paused, PauseAsked(reason))` carries the signal's
name and its one record, as `runner_stubs` does for activities.

Contract: each stub's name and input are its handler's (the handler's decorator uses the same constant from
rollout.workflows.names; tests/test_temporal_stubs.py checks both); the stubs are never run.
"""

from __future__ import annotations

from temporalio import workflow

from rollout.workflows.names import (
    EPISODES_FAILING,
    EVAL_GATE_PAUSE,
    EVAL_GATE_ROLLBACK,
    TRAINING_PAUSED,
    TRAINING_PROGRESS,
)
from rollout.workflows.run_types import GateTripped, PauseAsked, TrainingAdvanced
from rollout.workflows.training_types import RollbackAsked


class RunSignals:
    """`RunWorkflow`'s signals from the workflows it starts and from evals."""

    @workflow.signal(name=TRAINING_PROGRESS)
    async def training_progress(self, advanced: TrainingAdvanced) -> None: ...

    @workflow.signal(name=TRAINING_PAUSED)
    async def training_paused(self, asked: PauseAsked) -> None: ...

    @workflow.signal(name=EPISODES_FAILING)
    async def episodes_failing(self, asked: PauseAsked) -> None: ...

    @workflow.signal(name=EVAL_GATE_PAUSE)
    async def eval_gate_pause(self, tripped: GateTripped) -> None: ...


class TrainingSignals:
    """`TrainingWorkflow`'s signal from an eval's gate."""

    @workflow.signal(name=EVAL_GATE_ROLLBACK)
    def eval_gate_rollback(self, asked: RollbackAsked) -> None: ...
