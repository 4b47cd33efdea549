"""An OTLP/HTTP trace receiver on loopback, built on the OpenTelemetry protocol's own message classes: it
decodes each `ExportTraceServiceRequest` it is posted and keeps its spans (or refuses, when told to)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it, with its resource's attributes."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    error: str | None


@dataclass
class OtlpReceiver:
    refuse: int | None = None  # answer every export with this status
    spans: list[ReceivedSpan] = field(default_factory=list[ReceivedSpan])
    requests: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests += 1
                if self.path != "/v1/traces" or receiver.refuse is not None:
                    self.send_response(receiver.refuse or 404)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"this collector takes no spans today")
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _take(self, request: ExportTraceServiceRequest) -> None:
        taken: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    taken.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex() or None,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            resource=resource,
                            error=s.status.message if s.status.code == s.status.STATUS_CODE_ERROR else None,
                        )
                    )
        with self._lock:
            self.spans += taken

    def of_run(self, run: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.resource.get("rollout.run") == run]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
