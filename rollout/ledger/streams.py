"""The names of the ledger's streams and lease resources: the one place they are spelled.

Contract:
- Every stream or lease the platform writes is named by a function (or constant) here; nothing else builds
  these strings. Recorded data depends on them: a name, once used, never changes.
- Streams hold events; leases are resources that fence writers (`Ledger.claim`). A lease name is never a
  stream name: a fenced stream records which lease fences it on its first fenced append.
- Temporal workflow ids (`run/{run}` for `RunWorkflow`, ...) look alike but are not ledger names; they live
  with their workflows.
"""

from __future__ import annotations

SERVING_TARGETS = "serving/targets"
"""`ServingTarget`s: what the trainer asks engines to serve, keyed `{policy}/{version}/{format}`."""

SERVING_ACKS = "serving/acks"
"""`ServingAck`s: each engine's whole state, keyed `{engine}/{incarnation}/{n}`."""

SERVING_REQUESTS = "serving/requests"
"""`ServingRequested` / `ServingReleased`: a checkpoint someone (an eval) needs served beyond the newest ones,
keyed `{holder}/{checkpoint}/requested` and `.../released`."""

EVAL_SUITES = "evals/suites"
PRESETS = "presets"  # presets stored with `rollout preset load`, versioned (rollout.config.presets)
"""`EvalSuiteRegistered`: each eval suite version's declaration and content hash, keyed `{name}@{version}`."""


def eval_results_stream(suite: str) -> str:
    """The `EvalResult`s of suite `suite` (every version), keyed `{version}/{checkpoint}/{environment}`."""
    return f"evals/{suite}/results"


def eval_gates_stream(suite: str) -> str:
    """The `EvalGateDecided` of suite `suite` (rollout.evals.gates), keyed `{version}/{checkpoint}`."""
    return f"evals/{suite}/gates"


def run_stream(run: str) -> str:
    """`RunCreated` and `SettingsChanged` of a run (projected into the `run` table)."""
    return f"run/{run}"


def run_episodes_stream(run: str) -> str:
    """A run's `EpisodeFinished` and `EpisodeAbandoned` (a whole episode, or one agent's attempt)."""
    return f"run/{run}/episodes"


def run_batches_stream(run: str, policy: str) -> str:
    """The `BatchAssembled` of each step of `policy` (a ledger policy, `{run}/{name}`), keyed `step/{n}`."""
    return f"run/{run}/batches/{policy}"


def policy_checkpoints_stream(policy: str) -> str:
    """A policy's `CheckpointCreated`, keyed `step/{step}`, fenced by its `trainer_lease`."""
    return f"policy/{policy}/checkpoints"


def policy_bridges_stream(policy: str) -> str:
    """A policy's checkpoints as converted for the engines, keyed `bridge/{version}/{format}`."""
    return f"policy/{policy}/bridges"


def seat_stream(seat: str) -> str:
    """A seat's `SeatOpened`, its `TurnRecorded`s (keyed `turn/{index}/{fingerprint}`) and `SeatClosed`."""
    return f"seat/{seat}"


def sandbox_pool_stream(kind: str) -> str:
    """The `SandboxRegistered` of every sandbox server of `kind` (a record; the pool is the host leases)."""
    return f"sandboxes/{kind}"


def trainer_lease(policy: str) -> str:
    """The lease a trainer holds while it trains `policy`; it fences the policy's checkpoints stream."""
    return f"trainer/{policy}"


def gpu_lease(gpu: str) -> str:
    """The lease the trainer holds while it trains on `gpu` (one-GPU mode); engines on it sleep meanwhile."""
    return f"gpu/{gpu}"


def sandbox_lease(kind: str, name: str) -> str:
    """An episode's claim on sandbox `name` of `kind` (holder `{run}/{episode}`); its epoch fences actions."""
    return sandbox_leases_prefix(kind) + name


def sandbox_leases_prefix(kind: str) -> str:
    """What the `sandbox_lease` of every sandbox of `kind` starts with."""
    return f"sandbox/{kind}/"


def sandbox_host_lease(kind: str, name: str) -> str:
    """A sandbox server's hold on its name while it serves (holder: `SEATS@ADDRESS`): live, in the pool."""
    return sandbox_host_leases_prefix(kind) + name


def sandbox_host_leases_prefix(kind: str) -> str:
    """What the `sandbox_host_lease` of every sandbox of `kind` starts with."""
    return f"sandbox-host/{kind}/"
