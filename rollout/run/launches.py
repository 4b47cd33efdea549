"""How a training run was launched, recorded by the run as an event of its own: enough to bring a stack back
to it.

Contract:
- `RunLaunch` is the payload of a run's `RunLaunched` event (key `LAUNCHED` in the run's stream), appended
  with its `RunCreated` when `rollout train` starts the run; a run started without training (`rollout run
  start`) records none. It holds the settings the run's trainer and stack were started with, as `key=value`
  overrides (`trainer.*`, the loss's parameters `trainer.loss_params.*` included, `gpu.*`, each policy's own
  model and settings `policies.*`, and what the engines serve: `SERVING_SETTINGS`), and where its environment
  was imported from.
- It is checked where it is made and where it is read back from the ledger (`from_payload`): an override of
  any other setting (a ledger or Temporal address, a data directory), a value or path holding a control
  character, or an import path entry that is not absolute raises `ValueError`. `rollout run attach` starts
  processes with what it holds, so nothing the ledger says can point them elsewhere.
- The run's other settings (max_lag, paused, max_tokens, external models) are its `RunCreated` settings, which
  change mid-run; this record never changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rollout.config.overrides import setting_given
from rollout.records import Payload

LAUNCHED = "launched"  # the event's key in the run's stream: one launch per run

# The settings of what serves a run's turns: the model and context the engines serve, the engine's kind, and
# the groups in flight, which the sandboxes its episodes claim are counted by.
SERVING_SETTINGS = (
    "services.gateway.model",
    "services.gateway.max_context",
    "services.engine.kind",
    "run.groups_in_flight",
)
LAUNCH_SECTIONS = ("trainer", "gpu", "policies", *SERVING_SETTINGS)
_SECTION_SETTING = re.compile(
    r"(trainer|gpu)\.[a-z_]+|trainer\.loss_params\.[A-Za-z_][A-Za-z0-9_]*|policies\.[A-Za-z0-9_-]+\.[a-z_]+"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class RunLaunch(Payload):
    """How training run `run` of `environment` was launched (see the module's contract)."""

    run: str
    environment: str
    overrides: list[str]  # `key=value`, one per setting of LAUNCH_SECTIONS
    import_path: list[str] = field(default_factory=list[str])  # where its environment was imported from

    def __post_init__(self) -> None:
        for override in self.overrides:
            key, equals, value = override.partition("=")
            if not equals or not (_SECTION_SETTING.fullmatch(key) or key in SERVING_SETTINGS):
                raise ValueError(
                    f"a launch records trainer.*, gpu.*, policies.* and the serving settings only, not {key!r}"
                )
            if _CONTROL.search(value):
                raise ValueError(f"launch setting {key} holds a control character")
        for entry in self.import_path:
            if not entry.startswith("/") or _CONTROL.search(entry):
                raise ValueError(f"a launch's import path entry must be an absolute path, not {entry!r}")

    @property
    def model(self) -> str:
        """The model the run trains (and its engines serve)."""
        return setting_given(self.overrides, "trainer.model") or ""
