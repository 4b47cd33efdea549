"""Which external model (LiteLLM) answers a seat: one the gateway was started with for the seat's policy
(`--external POLICY=MODEL`), or one the seat's run recorded for it (its environment seats the model under that
policy: the run's `RunSettings.external_models`).

Contract: a run's external models are fixed when the run is made, so they are read from the ledger once per
run and kept (the newest `MAX_RUNS_REMEMBERED` runs); a seat of no run has only the configured ones. A run
trains its own lineage of a policy (`{run}/{policy}`): an external model is named by the policy's last part.

Where a model is sent is the gateway's configuration, never a ledger writer's: a run's model that names an API
base (`MODEL@API_BASE`), or whose name holds a URL (`huggingface/https://HOST/...`: LiteLLM sends there,
whatever the provider prefix), is served only when that base is one the gateway was configured with (an
`--external` model's, or one of `services.gateway.external_api_bases`); any other raises
`ExternalModelRefused` (the gateway's 403), so no prompt, and no provider key LiteLLM would send with it,
reaches a server a run chose.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from rollout.engines.external import ExternalModel
from rollout.gateway.admission import Admission
from rollout.gateway.seats import Seat

MAX_RUNS_REMEMBERED = 1024


class ExternalModelRefused(Exception):
    """A run names an external model at an API base this gateway was not configured to reach."""


# An endpoint written into the model's name: LiteLLM sends `huggingface/https://HOST/...` to that URL,
# whatever `api_base` says.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def _base(url: str) -> str:
    return url.rstrip("/")


class ExternalModels:
    def __init__(
        self,
        admission: Admission,
        configured: Mapping[str, ExternalModel] | None = None,
        api_bases: Collection[str] = (),
    ) -> None:
        self.admission = admission
        self.configured = dict(configured or {})
        self.api_bases = {_base(b) for b in api_bases} | {
            _base(m.api_base) for m in self.configured.values() if m.api_base
        }
        self._by_run: dict[str, dict[str, ExternalModel]] = {}

    async def for_seat(self, seat: Seat) -> ExternalModel | None:
        policy = seat.policy.rpartition("/")[2]
        configured = self.configured.get(seat.policy) or self.configured.get(policy)
        if configured is not None or seat.run is None:
            return configured
        models = self._by_run.get(seat.run)
        if models is None:
            settings = await self.admission.run_settings(seat.run)
            models = {p: ExternalModel.from_spec(m) for p, m in settings.external_models.items()}
            if len(self._by_run) >= MAX_RUNS_REMEMBERED:
                self._by_run.pop(next(iter(self._by_run)))
            self._by_run[seat.run] = models
        model = models.get(policy)
        if model is None:
            return None
        for where in (model.api_base, *_URL.findall(model.model)):
            if where and not self._allowed(_base(where)):
                raise ExternalModelRefused(
                    f"run {seat.run} seats {policy!r} with {model.model} at {where}, an API base this gateway "
                    "was not configured with: add it to services.gateway.external_api_bases"
                )
        return model

    def _allowed(self, where: str) -> bool:
        """Whether `where` is a configured base, or a path under one (`BASE/models/NAME`)."""
        return any(where == base or where.startswith(base + "/") for base in self.api_bases)
