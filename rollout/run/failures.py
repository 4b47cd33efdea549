"""Why an episode failed, in the environment author's terms: one record per failure, classified once where it
happens.

Contract:
- `Failure` is what an episode's `EpisodeAbandoned` records of its first failure: its `kind` (one of `KINDS`),
  whether it is `deterministic` (a retry would fail the same way, so none is made), a one-line `reason`,
  `where` in the environment's own code it happened (`file:line` of the innermost frame under the
  environment's package; None when the failure is not in its code), `detail` (the traceback, at most
  `DETAIL_CHARS`, for the dashboard) and the `seat` whose play failed (its transcript shows how far it got).
- Deterministic kinds: the Task (or `make_task`, a task source's draw, `scripted_reply`, `trains`) raised
  (`TaskFailed`), one of its calls ran past its limit (`TaskTimedOut`: `Environment.turn_timeout_s`,
  `episode_timeout_s`), its reward was not a finite number (`InvalidReward`), the gateway refused the request
  its conversation made (`RequestRefused`: a prompt past the context, a malformed tool call), the environment
  does not load (`EnvironmentLoadError`), the sandbox it needs was not free in time or refused its limits
  (`NoSandboxFree`, `SandboxRefused`), the gateway takes no more turns for the seat (`SeatClosed`: its run
  was stopped, or its episode had ended). Anything else (a runner's death, an outage that outlasted its
  window) is `Transient`: retried within the episode's budget, recorded only when that runs out.
- `failure_in(error, kind, doing, package)` builds one from an exception: the reason says what the
  environment was doing (`"respond raised ZeroDivisionError: division by zero"`). `advice(kind)` says what
  to change, in a sentence.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.records import Payload

TASK_FAILED = "TaskFailed"
TASK_TIMED_OUT = "TaskTimedOut"
INVALID_REWARD = "InvalidReward"
REQUEST_REFUSED = "RequestRefused"
ENVIRONMENT_LOAD = "EnvironmentLoadError"
NO_SANDBOX_FREE = "NoSandboxFree"
SANDBOX_REFUSED = "SandboxRefused"
SEAT_CLOSED = "SeatClosed"
TRANSIENT = "Transient"
DETERMINISTIC = (
    TASK_FAILED,
    TASK_TIMED_OUT,
    INVALID_REWARD,
    REQUEST_REFUSED,
    ENVIRONMENT_LOAD,
    NO_SANDBOX_FREE,
    SANDBOX_REFUSED,
    SEAT_CLOSED,
)
KINDS = (*DETERMINISTIC, TRANSIENT)
DETAIL_CHARS = 8000
REASON_CHARS = 300


@dataclass(frozen=True)
class Failure(Payload):
    """How an episode failed (see the module's contract)."""

    kind: str  # one of KINDS
    reason: str  # one line, in the environment author's terms
    where: str | None = None  # file:line in the environment's package, innermost
    detail: str = ""  # the traceback, cut to DETAIL_CHARS
    seat: str | None = None  # the seat whose play failed (its transcript shows how far it got)

    @property
    def deterministic(self) -> bool:
        return self.kind in DETERMINISTIC

    def markers(self) -> dict[str, Any]:
        return {"deterministic": self.deterministic}  # its class, beside its kind, for readers of the ledger

    @property
    def summary(self) -> str:
        """The reason, and where: `respond raised KeyError: 'x' (buggy.py:27)`."""
        return f"{self.reason} ({self.where})" if self.where else self.reason


_ADVICE = {
    TASK_FAILED: "Fix the environment's code where it raised; `rollout env check ENV --tasks N` replays it.",
    TASK_TIMED_OUT: "Find what the Task waits on (`rollout env check ENV --tasks N` bounds it the same way), or "
    "raise the Environment's turn_timeout_s or episode_timeout_s if it is just slow.",
    INVALID_REWARD: "Return a finite number as the reward.",
    REQUEST_REFUSED: "Keep observations within the model's context (services.gateway.max_context) and tool calls "
    "well formed.",
    ENVIRONMENT_LOAD: "Check it with `rollout env check ENV`.",
    NO_SANDBOX_FREE: "Serve more sandboxes of its kind (`rollout sandbox serve`), or lower run.groups_in_flight.",
    SANDBOX_REFUSED: "Check the environment's SandboxSpec limits and network (docs/sandboxes.md).",
    SEAT_CLOSED: "Nothing to fix in the environment: its run was stopped (or its episode had ended) while it "
    "played.",
}


def advice(kind: str) -> str:
    """What to change about a failure of `kind`, in a sentence."""
    return _ADVICE.get(kind, "`rollout status` and the runner's log (DATA_DIR/logs/runner.log) say more.")


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def _package_folder(package: str) -> Path | None:
    module = sys.modules.get(package.partition(".")[0])
    file = getattr(module, "__file__", None) if module else None
    return Path(file).resolve().parent if file else None


def where_in(error: BaseException, package: str) -> str | None:
    """`file:line` of the innermost frame of `error`'s traceback that lies in `package`'s folder (the
    environment's own code), relative to the folder above it; None when no frame does."""
    folder = _package_folder(package)
    if folder is None:
        return None
    found: str | None = None
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(folder):
            found = f"{path.relative_to(folder.parent)}:{frame.lineno}"
    return found


def failure_in(error: BaseException, kind: str, doing: str, package: str) -> Failure:
    """The failure of `error`, raised while the environment of `package` was `doing` something (`respond`)."""
    said = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    detail = "".join(traceback.format_exception(error))
    return Failure(
        kind=kind,
        reason=one_line(f"{doing} raised {said}"),
        where=where_in(error, package),
        detail=detail[-DETAIL_CHARS:],
    )
