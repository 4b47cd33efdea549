"""A step's batch from the ledger: assembling it once, and loading its training data (for the training
activities, rollout.activities.training).

Contract:
- `record_batch` is idempotent by (run, policy, step): the first attempt picks the oldest whole groups no
  earlier step consumed (rollout.rl.selection; with `refill_max`, tied groups are replaced by fresh ones,
  judged by the rewards of `agents`) and records `BatchAssembled` under `step/{step}` on
  `run/{run}/batches/{policy}`, listing exactly the episodes it trains on (the whole groups it keeps) and the
  tied groups it consumed without training (`replaced_groups`), with the groups drawn, kept and replaced; a
  retry returns that record, so a retried step trains on the same data and no episode is used twice. Nothing
  ready → None (the step waits). Its reward is over every group drawn, replaced ones included: the reward
  curve measures the policy, not refill's choice.
- `look_for_batch` is the `assemble_batch` activity's answer: the batch (or None) and how many groups this
  policy's steps have replaced so far, a waiting step's set-aside ones included (the episode supply starts as
  many more: rollout.rl.selection.supply_allowance).
- `load_batch` rebuilds the recorded batch's training data from the seats' recorded turns
  (rollout.rl.segments) and the episodes' rewards (rollout.rl.batches): the same batch every time.
  Every segment of a seat trains (a command's rewrites and side conversations included) except those its
  episode's record lists as untrained (the environment's `trains` said no). A seat opened pinned to a
  checkpoint (its `SeatOpened` names one: a fixed pin or a self-play pin, rollout.run.pins) trains nothing,
  also when a trained seat of the episode plays the same policy (self-play).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rollout.ledger import KeyConflictError, Kind, Ledger, NewEvent, RecordedEvent
from rollout.ledger.payloads import EpisodeEnded, SampledTurn, episode_ended, turn_recorded
from rollout.ledger.queries import read_all
from rollout.ledger.records import records_of
from rollout.ledger.streams import run_batches_stream, run_episodes_stream, seat_stream
from rollout.records.batches import BatchInfo
from rollout.records.seats import SeatOpened
from rollout.rl.batches import AgentEpisode, Batch, assemble_batch
from rollout.rl.segments import segments_from_turns
from rollout.rl.selection import EpisodeRecordView, select_groups
from rollout.workflows.training_types import AssembleInput, BatchLookup


def _episode_records(events: Sequence[RecordedEvent]) -> dict[str, EpisodeEnded]:
    """The episodes recorded for good (finished, or failed as a whole), by episode id."""
    return {ended.episode: ended for event in events if (ended := episode_ended(event)) is not None}


async def _agent_episodes(ledger: Ledger, records: Sequence[EpisodeEnded]) -> list[AgentEpisode]:
    played = []
    for record in records:
        if not record.finished:
            continue  # consumed with its group, never trained
        for agent, seat in sorted(record.seats.items()):
            events = await read_all(ledger, seat_stream(seat))
            if any(opened.checkpoint for opened in records_of(events, SeatOpened)):
                continue  # a pinned seat (a fixed checkpoint or a self-play pin) never trains its policy
            turns = [turn_recorded(e.payload) for e in events if e.kind == Kind.TURN_RECORDED]
            policy = next((t.policy for t in turns if t.policy), "default")
            untrained = set(record.untrained.get(agent, ()))
            sampled = [t for t in turns if isinstance(t, SampledTurn) and t.segment_id not in untrained]
            played.append(
                AgentEpisode(
                    episode=record.episode,
                    group=record.group,
                    agent=agent,
                    policy=policy,
                    reward=record.rewards[agent],
                    segments=tuple(segments_from_turns(sampled)),
                )
            )
    return played


async def record_batch(ledger: Ledger, given: AssembleInput) -> BatchInfo | None:
    """The batch of step (run, policy, step), recorded by the first attempt; None while no whole batch is
    ready."""
    return (await look_for_batch(ledger, given)).batch


def _view(record: EpisodeEnded, agents: Sequence[str] | None) -> EpisodeRecordView:
    rewards = (
        {a: r for a, r in record.rewards.items() if agents is None or a in agents} if record.finished else {}
    )
    return EpisodeRecordView(record.episode, record.group, record.finished, rewards)


async def look_for_batch(ledger: Ledger, given: AssembleInput) -> BatchLookup:
    """Step (run, policy, step)'s batch, recorded by the first attempt (None while it is not whole), and the
    groups the policy's steps have replaced so far."""
    stream = run_batches_stream(given.run, given.policy)
    key = f"step/{given.step}"
    events = [e for e in await read_all(ledger, stream) if e.kind == Kind.BATCH_ASSEMBLED]
    batches = [BatchInfo.from_payload(e.payload) for e in events]
    replaced_before = sum(len(b.replaced_groups) for b in batches)
    for event, batch in zip(events, batches, strict=True):
        if event.key == key:
            return BatchLookup(batch, replaced_before)
    consumed = {group for b in batches for group in (*b.groups, *b.replaced_groups)}
    records = _episode_records(await read_all(ledger, run_episodes_stream(given.run)))
    selection = select_groups(
        [_view(r, given.agents) for r in records.values()],
        group_size=given.group_size,
        consumed=consumed,
        groups_per_batch=given.groups_per_batch,
        refill_max=given.refill_max,
    )
    if not selection.whole:
        return BatchLookup(None, replaced_before + selection.set_aside)
    groups, replaced = set(selection.groups), set(selection.replaced)
    taken = [r for r in records.values() if r.group in groups]
    played = await _agent_episodes(ledger, taken)
    batch = assemble_batch(played, given.policy, given.advantage)
    segments = [s for agent in played if agent.policy == given.policy for s in agent.segments]
    # The reward over every group drawn: the kept groups' trained seats, and the replaced groups' agents.
    rewards = [p.reward for p in played if p.policy == given.policy] + [
        reward
        for r in records.values()
        if r.group in replaced
        for reward in _view(r, given.agents).rewards.values()
    ]
    info = BatchInfo(
        run=given.run,
        policy=given.policy,
        step=given.step,
        groups=selection.groups,
        episodes=sorted(r.episode for r in taken),
        trained_episodes=sorted({w.episode for w in batch.segments}),
        skipped_groups=batch.skipped_groups,
        sampled_tokens=batch.sampled_tokens,
        reward_mean=statistics.fmean(rewards) if rewards else 0.0,
        reward_std=statistics.pstdev(rewards) if rewards else 0.0,
        prompt_tokens=sum(s.prompt_tokens for s in segments),
        cached_tokens=sum(s.cached_tokens for s in segments),
        replaced_groups=selection.replaced,
        groups_drawn=len(groups) + len(replaced),
        groups_kept=len(groups),
        groups_replaced=len(replaced),
    )
    try:
        await ledger.append_one(stream, NewEvent(key, Kind.BATCH_ASSEMBLED, info.to_payload()))
    except KeyConflictError:
        # Another attempt recorded this step first (with what it saw then): that record is the step's
        # batch.
        existing = await ledger.find(stream, key)
        assert existing is not None
        info = BatchInfo.from_payload(existing.payload)
    return BatchLookup(info, replaced_before + len(info.replaced_groups))


async def load_batch(ledger: Ledger, info: BatchInfo, advantage: str = "group_norm") -> Batch:
    records = _episode_records(await read_all(ledger, run_episodes_stream(info.run)))
    taken = [records[e] for e in info.episodes]
    return assemble_batch(await _agent_episodes(ledger, taken), info.policy, advantage)
