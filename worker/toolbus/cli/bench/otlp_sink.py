"""A local OTLP/HTTP receiver that drops what it gets: tracing's far end, costing nothing.

It answers 200 to every POST (spans on `/v1/traces`, anything else too) from a thread of
the bench's own process, and counts the span exports, so a run with tracing on can
fail loudly when no span arrived: tracing was then not on at all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TRACES_PATH = "/v1/traces"


class _Sink(ThreadingHTTPServer):
    daemon_threads = True
    traces_received = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Sink

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == TRACES_PATH:
            self.server.traces_received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


class OtlpSink:
    """Where the worker's exporter sends: `endpoint` is its OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self, server: _Sink) -> None:
        self._server = server

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_received(self) -> int:
        return self._server.traces_received


@contextmanager
def otlp_sink() -> Iterator[OtlpSink]:
    server = _Sink(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-sink", daemon=True)
    thread.start()
    try:
        yield OtlpSink(server)
    finally:
        server.shutdown()
        server.server_close()
