"""Which external model (LiteLLM) answers a seat: one the gateway was started with for the seat's policy
(`--external POLICY=MODEL`), or one the seat's run recorded for it (its environment seats the model under that
policy: the run's `external_model/POLICY` settings).

Contract: a run's external models are fixed when the run is made, so they are read from the ledger once per
run and kept (the newest `MAX_RUNS_REMEMBERED` runs); a seat of no run has only the configured ones. A run
trains its own lineage of a policy (`{run}/{policy}`): an external model is named by the policy's last part.
"""

from __future__ import annotations

from collections.abc import Mapping

from rollout.engines.external import ExternalModel
from rollout.gateway.admission import Admission
from rollout.gateway.seats import Seat

MAX_RUNS_REMEMBERED = 1024


class ExternalModels:
    def __init__(self, admission: Admission, configured: Mapping[str, ExternalModel] | None = None) -> None:
        self.admission = admission
        self.configured = dict(configured or {})
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
        return models.get(policy)
