"""The names the rollout workflows are found by: task queues, workflow ids, and the messages sent by name.

Contract:
- Every workflow id is a business key built here from run, policy, episode, group and agent, so a retried
  start finds the workflow the first attempt started, and anyone (a test, the CLI, another workflow) can
  address a workflow from the run's id alone.
- Workflows, activities and messages are otherwise called by reference (`RunWorkflow.run`,
  `runner_stubs.play_agent`, `EpisodeSupplyWorkflow.set_paused`), which carries their names and types. A
  message whose sender cannot import the receiving workflow's class (a child signalling its parent:
  `TrainingWorkflow` → `RunWorkflow`) is named here: the receiving handler's decorator and its typed stub
  (rollout.workflows.signals), which the sender calls, use the constant.
- A trained policy is named per run in the ledger (`run_policy`: `{run}/{policy}`), so two runs that both
  train "default" never share checkpoints or staleness bounds.
"""

from __future__ import annotations

RUNNER_QUEUE = "rollout-runner"  # run, supply, episode and agent workflows and the runner's activities
TRAINER_QUEUE = "rollout-trainer"  # training and bridge workflows and the trainer's activities

# Signals `TrainingWorkflow` sends its parent `RunWorkflow` (training.py cannot import run.py, which starts
# it).
TRAINING_PROGRESS = "training_progress"  # TrainingAdvanced
TRAINING_PAUSED = "training_paused"  # PauseAsked
EPISODES_FAILING = "episodes_failing"  # PauseAsked: the supply paused itself, too many episodes failed
# Signals an `EvalWorkflow` whose gate tripped sends (rollout.evals.gates).
EVAL_GATE_PAUSE = "eval_gate_pause"  # to `RunWorkflow`: GateTripped
EVAL_GATE_ROLLBACK = "eval_gate_rollback"  # to `TrainingWorkflow`: RollbackAsked


def run_policy(run: str, policy: str) -> str:
    """A policy as the ledger names it: each run trains its own lineage (`{run}/{policy}`), so two runs that
    both train "default" never share checkpoints or staleness bounds."""
    return f"{run}/{policy}"


def run_workflow_id(run: str) -> str:
    """`RunWorkflow`: the run's owner."""
    return f"run/{run}"


def supply_workflow_id(run: str) -> str:
    """`EpisodeSupplyWorkflow`: the run's episode groups."""
    return f"run/{run}/supply"


def episode_id(group: int, member: int) -> str:
    """An episode's id within its run: its group and its place in the group."""
    return f"g{group:06d}-{member}"


def episode_workflow_id(run: str, episode: str) -> str:
    """`EpisodeWorkflow`: one episode of a run."""
    return f"run/{run}/ep/{episode}"


def agent_workflow_id(run: str, episode: str, agent: str) -> str:
    """`AgentWorkflow`: one agent's seat of a multi-agent episode."""
    return f"run/{run}/ep/{episode}/agent/{agent}"


def preflight_workflow_id(run: str) -> str:
    """`EnvironmentCheckWorkflow`: a runner loads the run's environment before the run starts."""
    return f"preflight/{run}"


def training_workflow_id(run: str, policy: str) -> str:
    """`TrainingWorkflow`: the run's lineage of one policy."""
    return f"run/{run}/train/{policy}"


def bridge_workflow_id(policy: str, version: int, fmt: str) -> str:
    """`BridgeWorkflow`: one checkpoint (by version) of a policy, converted for one serving format."""
    return f"bridge/{policy}/{version}/{fmt}"


TRACKING_PREFIX = "tracking/"


def tracking_workflow_id(run: str) -> str:
    """`TrackingWorkflow`: the run's metrics fed to its tracking backends."""
    return f"{TRACKING_PREFIX}{run}"


def eval_workflow_id(suite: str, version: str, checkpoint: str) -> str:
    """`EvalWorkflow`: one suite version scored on one checkpoint (`latest:RUN/POLICY` as given)."""
    return f"eval/{suite}@{version}/{checkpoint}"


EVAL_SCHEDULES = "eval-schedule/"  # what every eval schedule's id starts with


def eval_schedule_id(suite: str, checkpoint: str) -> str:
    """The Temporal Schedule that evaluates `suite` on `checkpoint` (a reference such as
    `latest:RUN/POLICY`)."""
    return f"{EVAL_SCHEDULES}{suite}/{checkpoint}"


def eval_run(suite: str, version: str, checkpoint: str, environment: str) -> str:
    """The run an eval's episodes of one environment play under (its turns are never trained: no training run
    reads them). The same suite version, checkpoint and environment always play under the same run, so a
    retried or repeated eval replays what was recorded instead of playing again."""
    import hashlib

    digest = hashlib.sha256(f"{suite}@{version}/{checkpoint}/{environment}".encode()).hexdigest()[:10]
    return f"eval-{suite}-{version}-{environment}-{digest}"
