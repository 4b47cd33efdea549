"""Which checkpoint an eval scores: `base`, a checkpoint's name, or `latest:RUN/POLICY`.

Contract:
- `resolve(ledger, reference)` returns the `ChosenCheckpoint`: `base` is the base model (version 0, served by
  every engine); a name (`RUN/POLICY-step000004`, `sft/NAME-step000001`) must be a recorded checkpoint;
  `latest:RUN/POLICY` is that policy's newest checkpoint when it is resolved (a schedule resolves it each time
  it fires). A reference that names nothing raises `UnknownCheckpoint` naming the closest recorded ones.
- `needs_serving` is False only for the base model: any other checkpoint must be requested from the engines
  (rollout.records.serving.ServingRequest) and needs a `ServingTarget` in some format (`formats`; none yet
  for an SFT adapter, which an eval bridges first).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout.ledger.queries import (
    checkpoint_names,
    checkpoint_payload,
    newest_checkpoint_version,
    serving_target_formats,
)
from rollout.records.checkpoints import CheckpointRecord
from rollout.records.serving import BASE_CHECKPOINT
from rollout.training.checkpoints import checkpoint_name

if TYPE_CHECKING:
    from rollout.ledger import Ledger

LATEST = "latest:"


class UnknownCheckpoint(LookupError):
    """The reference names no recorded checkpoint."""


@dataclass(frozen=True)
class ChosenCheckpoint:
    name: str
    policy: str | None  # None for the base model
    version: int
    formats: tuple[str, ...] = ()  # the formats it has a serving target in
    run: str = ""  # the run that made it (the base model: none)

    @property
    def needs_serving(self) -> bool:
        return self.name != BASE_CHECKPOINT


def policy_of(name: str) -> str | None:
    """The ledger policy of a checkpoint name (`{policy}-step{NNNNNN}`), or None when it is not one."""
    policy, _, step = name.rpartition("-step")
    return policy if policy and step.isdigit() else None


async def resolve(ledger: Ledger, reference: str) -> ChosenCheckpoint:
    if reference == BASE_CHECKPOINT:
        return ChosenCheckpoint(BASE_CHECKPOINT, None, 0)
    if reference.startswith(LATEST):
        policy = reference.removeprefix(LATEST)
        version = await newest_checkpoint_version(ledger, policy)
        if version == 0:
            raise UnknownCheckpoint(
                f"{reference}: policy {policy!r} has no checkpoint yet"
                + await _closest(ledger, policy, "policies", policies=True)
            )
        return await resolve(ledger, checkpoint_name(policy, version))
    policy = policy_of(reference)
    payload = await checkpoint_payload(ledger, policy, reference) if policy else None
    try:
        record = None if payload is None else CheckpointRecord.from_payload(payload)
    except ValueError:
        record = None  # what no trainer of ours recorded names no checkpoint
    if record is None:
        raise UnknownCheckpoint(
            f"no checkpoint {reference!r} is recorded" + await _closest(ledger, reference, "checkpoints")
        )
    formats = tuple(await serving_target_formats(ledger, reference))
    return ChosenCheckpoint(reference, record.policy, record.version, formats, record.run)


async def _closest(ledger: Ledger, wanted: str, what: str, *, policies: bool = False) -> str:
    names = await checkpoint_names(ledger)
    known = sorted({p for n in names if (p := policy_of(n))}) if policies else names
    close = difflib.get_close_matches(wanted, known, n=3, cutoff=0.4)
    if close:
        return f"; the closest recorded {what}: {', '.join(close)}"
    if known:
        return f"; recorded {what} include {', '.join(known[-3:])} (also `base`, the base model)"
    return "; none is recorded yet (`base` is the base model)"
