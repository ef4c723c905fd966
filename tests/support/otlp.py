"""A test OTLP/HTTP trace receiver: what a collector would be given, decoded and kept.

It stands in for the OpenTelemetry Collector (compose/otel-collector/config.yaml): the
worker's exporter posts `ExportTraceServiceRequest` protobufs to `/v1/traces`, as it
would to the collector. Spans are kept with their resource's attributes, so a test can
tell which replica sent which span; `wait_for` waits, bounded, on each arrival.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    resource: dict[str, str]
    span_id: str = ""
    parent_span_id: str = ""  # empty for a root span
    kind: int = 0  # OTLP's SpanKind: 2 SERVER, 3 CLIENT, 4 PRODUCER, 5 CONSUMER
    attributes: dict[str, str] = field(default_factory=dict)  # string values only
    encoded: bytes = b""  # the whole span as received (events, status): to search for text


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[ReceivedSpan] = []
        self.arrived = threading.Condition()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != TRACES_PATH:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        received = [
            ReceivedSpan(
                span.name,
                span.trace_id.hex(),
                {a.key: a.value.string_value for a in resource_spans.resource.attributes},
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                kind=span.kind,
                attributes={a.key: a.value.string_value for a in span.attributes},
                encoded=span.SerializeToString(),
            )
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self.server.arrived:
            self.server.spans.extend(received)
            self.server.arrived.notify_all()
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        return None


class OtlpReceiver:
    """Where the worker's exporter sends: `endpoint` is its OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self, server: _Server) -> None:
        self._server = server

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._server.arrived:
            return list(self._server.spans)

    async def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """The spans received, once `done` holds for them; fails after `timeout_s`."""
        server = self._server

        def wait() -> bool:
            with server.arrived:
                return server.arrived.wait_for(lambda: done(list(server.spans)), timeout_s)

        assert await asyncio.to_thread(wait), f"spans received: {self.spans}"
        return self.spans


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield OtlpReceiver(server)
    finally:
        server.shutdown()
        server.server_close()
