"""The MLflow backend: one MLflow run per rollout run, on a tracking server or a local store.

Contract:
- The MLflow run is the one in the experiment tagged `rollout.run=RUN`: `open()` finds it (a restarted feed,
  another runner) or creates it, then logs the rollout run's settings as its params (a param, once logged,
  keeps its value: a setting changed mid-run stays a metric of the run, never a second param).
- `positions()` asks the server: each known stream's newest `STREAM/step` in its metric history.
- Each entry is one `log_batch` call (MLflow applies a batch whole): every number at the entry's step, its
  axis `STREAM/step` included. A sample table is also written, before the batch, as the artifact
  `STREAM/step-NNNNNN.json` (written again, whole, by a retry).
- Without `tracking_uri` the store is `sqlite:///DIR/mlflow.db` under the runner's data directory, artifacts
  beside it. Credentials are MLflow's own variables; a URI never holds them (rollout.config refuses it). A
  server that does not answer is given `HTTP_TIMEOUT_S` and no retries of MLflow's own: the feed retries.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.tracking.entries import Entry
from rollout.tracking.sinks import axis, metric_names
from rollout.workflows.tracking_types import MlflowSpec

HTTP_TIMEOUT_S = 10
RUN_TAG = "rollout.run"
PARAM_CHARS = 6000  # MLflow's limit on a param's value


class MlflowSink:
    backend = "mlflow"
    setting = "tracking.mlflow.tracking_uri"
    batch = 1  # one `log_batch` an entry (its table's artifact first)

    def __init__(self, run: str, spec: MlflowSpec, directory: Path, config: dict[str, str]) -> None:
        self.run = run
        self.spec = spec
        self.directory = directory
        self.config = config
        self.uri = spec.tracking_uri or f"sqlite:///{directory / 'mlflow.db'}"
        self.run_id: str | None = None
        self._client: Any = None
        self._streams: set[str] = set()

    def open(self) -> None:
        # MLflow reads these per request; its default retries a refusing server for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
        from mlflow import MlflowClient
        from mlflow.entities import Param

        if self.spec.tracking_uri is None:
            self.directory.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=self.uri)
        experiment = client.get_experiment_by_name(self.spec.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = None if self.spec.tracking_uri else (self.directory / "mlflow-artifacts").as_uri()
            experiment_id = client.create_experiment(self.spec.experiment, artifact_location=artifacts)
        found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{_quoted(self.run)}'")
        if found:
            self.run_id = found[0].info.run_id
            logged = set(found[0].data.params)
        else:
            created = client.create_run(
                experiment_id,
                run_name=self.spec.run_name or self.run,
                tags={RUN_TAG: self.run, **self.spec.tags},
            )
            self.run_id = created.info.run_id
            logged = set()
        # A feed killed between creating the run and logging its params logs the rest now.
        params = [Param(k, str(v)[:PARAM_CHARS]) for k, v in sorted(self.config.items()) if k not in logged]
        for start in range(0, len(params), 100):  # MLflow takes 100 params a batch
            client.log_batch(self.run_id, params=params[start : start + 100])
        self._client = client

    def positions(self, streams: set[str]) -> dict[str, int]:
        client, run_id = self._client, self.run_id
        assert client is not None and run_id is not None, "open() first"
        held: dict[str, int] = {}
        for stream in sorted(streams | self._streams):
            steps = [int(m.step) for m in client.get_metric_history(run_id, axis(stream))]
            if steps:
                held[stream] = max(steps)
        return held

    def log(self, entries: Sequence[Entry]) -> None:
        [entry] = entries
        from mlflow.entities import Metric

        client, run_id = self._client, self.run_id
        assert client is not None and run_id is not None, "open() first"
        if entry.table is not None:
            table = {"columns": list(entry.table.columns), "data": entry.table.rows}
            client.log_text(run_id, json.dumps(table, indent=1), f"{entry.stream}/step-{entry.step:06d}.json")
        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, entry.step) for name, value in metric_names(entry).items()]
        client.log_batch(run_id, metrics=metrics)
        self._streams.add(entry.stream)

    def close(self, final: bool) -> None:
        if final and self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
