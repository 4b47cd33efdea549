"""The OTLP backend: a run's traces exported to an OpenTelemetry collector over OTLP/HTTP.

Contract:
- Up to `batch` entries of the trace streams (rollout.tracking.traces) are one export of their spans
  through OpenTelemetry's own exporter (`OTLPSpanExporter`, protobuf over HTTP), with the ids, parents and
  times the ledger gave them (rollout.tracking.spans) and the resource `service.name=rollout`,
  `rollout.run=RUN` (what `OTEL_RESOURCE_ATTRIBUTES` adds is kept). The exporter's own settings apply:
  headers (an API key) from `OTEL_EXPORTER_OTLP_HEADERS` or `OTEL_EXPORTER_OTLP_TRACES_HEADERS`,
  certificates, compression; the endpoint is the run's `tracking.otlp_endpoint` (a base URL gets
  `/v1/traces`).
- A collector cannot be asked what it holds, so the position is kept beside the feed: after each export
  that the collector accepted, each stream's step is written to `DIR/RUN.json` (replaced whole). A feed
  killed between the two exports those entries again, with the same span ids (a receiver that keys spans
  by id keeps one); no entry is skipped.
- A refused export raises with the collector's answer in one line (what the exporter logged); the exporter
  retries a transient refusal only within its `EXPORT_TIMEOUT_S`, and the feed retries later.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.tracking.entries import Entry
from rollout.tracking.sinks import run_slug
from rollout.tracking.spans import Span
from rollout.workflows.tracking_types import OtlpSpec

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan

EXPORT_TIMEOUT_S = 10.0
TRACES_PATH = "/v1/traces"
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def traces_url(endpoint: str) -> str:
    """Where an endpoint's spans are posted: a base URL gets OTLP's `/v1/traces` path."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


class OtlpRefused(RuntimeError):
    pass


class OtlpSink:
    backend = "otlp"
    setting = "tracking.otlp_endpoint"
    batch = 100  # traces in one export: a poll's episodes in a few requests, each well under 64 MiB

    def __init__(self, run: str, spec: OtlpSpec, directory: Path) -> None:
        self.run = run
        self.url = traces_url(spec.endpoint)
        self.position_file = directory / f"{run_slug(run)}.json"
        self._exporter: Any = None
        self._resource: Resource | None = None

    def open(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource

        self.position_file.parent.mkdir(parents=True, exist_ok=True)
        self._exporter = OTLPSpanExporter(endpoint=self.url, timeout=EXPORT_TIMEOUT_S)
        self._resource = Resource.create({"service.name": "rollout", "rollout.run": self.run})

    def positions(self, streams: set[str]) -> dict[str, int]:
        try:
            held = json.loads(self.position_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            return {}  # a file cut short by a crash mid-write cannot be: it is replaced whole
        return (
            {str(k): int(v) for k, v in held.items() if isinstance(v, int)} if isinstance(held, dict) else {}
        )

    def log(self, entries: Sequence[Entry]) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        assert self._exporter is not None and self._resource is not None, "open() first"
        if spans := [_readable(s, self._resource) for entry in entries for s in entry.spans]:
            with _ExporterLog() as said:
                result = self._exporter.export(spans)
            if result != SpanExportResult.SUCCESS:
                raise OtlpRefused(f"{self.url} did not take the spans: {said.last or 'no answer'}")
        held = self.positions(set())
        for entry in entries:
            held[entry.stream] = max(entry.step, held.get(entry.stream, -1))
        partial = self.position_file.with_suffix(".json.partial")
        partial.write_text(json.dumps(held, sort_keys=True))
        os.replace(partial, self.position_file)

    def close(self, final: bool) -> None:
        if self._exporter is not None:
            self._exporter.shutdown()
            self._exporter = None


def _readable(given: Span, resource: Resource) -> ReadableSpan:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    def context(span_id: str) -> SpanContext:
        return SpanContext(
            trace_id=int(given.trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )

    return ReadableSpan(
        name=given.name,
        context=context(given.span_id),
        parent=None if given.parent_id is None else context(given.parent_id),
        resource=resource,
        attributes=given.attributes,
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, given.error) if given.error else Status(StatusCode.UNSET),
        start_time=_nanoseconds(given.start),
        end_time=_nanoseconds(given.end),
        instrumentation_scope=InstrumentationScope("rollout.tracking"),
    )


def _nanoseconds(at: datetime) -> int:
    whole = at.replace(microsecond=0)
    return int(whole.timestamp()) * 1_000_000_000 + at.microsecond * 1000


class _ExporterLog(logging.Handler):
    """What OpenTelemetry's exporter logs on this thread while it exports: its only word on why it failed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.thread = threading.get_ident()
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.last = " ".join(record.getMessage().split())[:300]

    def __enter__(self) -> _ExporterLog:
        logging.getLogger(_EXPORTER_LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(_EXPORTER_LOGGER).removeHandler(self)
