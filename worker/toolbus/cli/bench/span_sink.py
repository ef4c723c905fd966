"""A local OTLP/HTTP receiver in a thread of the bench's process: tracing's far end.

It answers 200 to every POST and counts the span exports (`traces_received`), so a
measured run with tracing on fails loudly when no span arrived. By default it drops what
it gets, so that measuring tracing costs the bench nothing. With `keep` (the guards
step) it decodes each `ExportTraceServiceRequest` (opentelemetry-proto, which comes with
the OTLP exporter) into `Span`s with their service's name, for the guard that needs the
worker's `tools/call` CLIENT span and the MCP server's own span in one trace.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TRACES_PATH = "/v1/traces"
SERVICE_NAME = "service.name"


@dataclass(frozen=True, slots=True)
class Span:
    """What the guard reads of a span: ids as hex, OTLP's kind number, the service."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # OTLP's SpanKind: 2 SERVER, 3 CLIENT
    service: str


def decode(body: bytes) -> list[Span]:
    """The spans of one OTLP/HTTP protobuf export body."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        service = next(
            (
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == SERVICE_NAME
            ),
            "",
        )
        spans += [
            Span(
                span.name,
                span.trace_id.hex(),
                span.span_id.hex(),
                span.parent_span_id.hex(),
                span.kind,
                service,
            )
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
    return spans


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, keep: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.keep = keep
        self.traces_received = 0  # exports to TRACES_PATH, kept or not
        self.spans: list[Span] = []
        self.undecodable = 0  # bodies that were not OTLP protobuf
        self.arrived = threading.Condition()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == TRACES_PATH:
            self._received(body)
        self.send_response(200)  # an empty ExportTraceServiceResponse: all accepted
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _received(self, body: bytes) -> None:
        received: list[Span] = []
        server = self.server
        if server.keep:
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                received = decode(body)
            except (OSError, DecodeError):  # not gzip after all, or not OTLP protobuf
                with server.arrived:
                    server.undecodable += 1
        with server.arrived:  # handlers run in threads of their own
            server.traces_received += 1
            server.spans += received
            server.arrived.notify_all()

    def log_message(self, *args: Any) -> None:
        return None


class SpanSink:
    """Where a worker exports: `endpoint` is its OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self, server: _Server) -> None:
        self._server = server

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_received(self) -> int:
        return self._server.traces_received

    @property
    def undecodable(self) -> int:
        return self._server.undecodable

    def spans(self) -> list[Span]:
        with self._server.arrived:
            return list(self._server.spans)

    def wait_for(self, done: Callable[[list[Span]], bool], timeout_s: float) -> list[Span]:
        """The spans so far, once `done` holds for them or `timeout_s` has passed."""
        server = self._server
        with server.arrived:
            server.arrived.wait_for(lambda: done(server.spans), timeout_s)
            return list(server.spans)


@contextmanager
def span_sink(*, keep: bool = False) -> Iterator[SpanSink]:
    """A sink for the block; `keep`: decode and keep the spans (else only counted)."""
    server = _Server(keep)
    thread = threading.Thread(target=server.serve_forever, name="span-sink", daemon=True)
    thread.start()
    try:
        yield SpanSink(server)
    finally:
        server.shutdown()
        server.server_close()
