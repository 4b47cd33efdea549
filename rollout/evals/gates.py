"""Eval gates: after a training run's checkpoint is scored, compare it with the best checkpoint of its lineage
before it, and decide, once, whether the run must pause, roll back or be warned.

Contract:
- `judge(results, checkpoint=, max_drop=)` is pure: of the `EvalResult`s of one suite version and one
  lineage, those of `checkpoint` are compared, environment by environment, with the best score an earlier
  checkpoint (a lower version) of the lineage had there; a drop of more than `max_drop` in any environment
  trips the gate. The reason names the environment, both checkpoints and both scores. With no earlier
  checkpoint scored, nothing trips.
- `decide(ledger, suite=, version=, checkpoint=, lineage=, max_drop=, action=, decided_by=)` judges the
  recorded results and records the decision (`EvalGateDecided` on `evals/{suite}/gates`, keyed
  `{version}/{checkpoint}`), tripped or not, once: a checkpoint already decided keeps its first decision. It
  answers the decision and whether `decided_by` (the deciding eval's Temporal run) recorded it: only that
  eval acts on it, so a retried activity acts, and a repeated eval of the same checkpoint never acts twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from rollout.evals.records import results
from rollout.ledger import Kind, Ledger, NewEvent
from rollout.ledger.errors import KeyConflictError
from rollout.ledger.streams import eval_gates_stream
from rollout.records.evals import EvalResult, GateDecision


@dataclass(frozen=True)
class Verdict:
    tripped: bool
    reason: str
    best: str | None


def judge(scored: Sequence[EvalResult], *, checkpoint: str, max_drop: float) -> Verdict:
    mine = {r.environment: r for r in scored if r.checkpoint == checkpoint}
    if not mine:
        return Verdict(False, "", None)
    version = next(iter(mine.values())).checkpoint_version
    worst: tuple[float, EvalResult, EvalResult] | None = None
    for environment, current in sorted(mine.items()):
        earlier = [r for r in scored if r.environment == environment and r.checkpoint_version < version]
        if not earlier:
            continue
        best = max(earlier, key=lambda r: (r.score, -r.checkpoint_version))
        drop = best.score - current.score
        if drop > max_drop and (worst is None or drop > worst[0]):
            worst = (drop, best, current)
    if worst is None:
        return Verdict(False, "", None)
    drop, best, current = worst
    reason = (
        f"eval {current.suite}@{current.version}: {current.environment} scored {current.score:.3f} on "
        f"{checkpoint}, {drop:.3f} below the best before it ({best.score:.3f} on {best.checkpoint}); "
        f"eval.gate.max_drop is {max_drop:g}"
    )
    return Verdict(True, reason, best.checkpoint)


async def decide(
    ledger: Ledger,
    *,
    suite: str,
    version: str,
    checkpoint: str,
    lineage: str,
    max_drop: float,
    action: str,
    decided_by: str,
) -> tuple[GateDecision, bool]:
    stream = eval_gates_stream(suite)
    recorded = await _recorded(ledger, stream, version, checkpoint)
    if recorded is None:
        scored = [r for r in await results(ledger, suite) if r.version == version and r.policy == lineage]
        verdict = judge(scored, checkpoint=checkpoint, max_drop=max_drop)
        decision = GateDecision(
            suite=suite,
            version=version,
            checkpoint=checkpoint,
            lineage=lineage,
            tripped=verdict.tripped,
            action=action,
            max_drop=max_drop,
            reason=verdict.reason,
            best=verdict.best,
            decided_by=decided_by,
        )
        # Another eval of this checkpoint may have decided first: its decision stands.
        with contextlib.suppress(KeyConflictError):
            await ledger.append_one(
                stream, NewEvent(decision.key, Kind.EVAL_GATE_DECIDED, decision.to_payload())
            )
        recorded = await _recorded(ledger, stream, version, checkpoint)
        assert recorded is not None
    return recorded, recorded.decided_by == decided_by


async def _recorded(ledger: Ledger, stream: str, version: str, checkpoint: str) -> GateDecision | None:
    event = await ledger.find(stream, f"{version}/{checkpoint}")
    if event is None or event.kind != Kind.EVAL_GATE_DECIDED:
        return None
    return GateDecision.from_payload(dict(event.payload))
