"""The HTTP listener: the status page, /metrics, /healthz and /readyz, opt-in (`http_port`).

    /          the status page (`status_page`): one static HTML file that polls
    /status.json  what it shows: the fleet, MCP servers, tools per caller profile, calls
               in flight, recent errors by code, p50/p99 over the last minutes
    /metrics   Prometheus text (or OpenMetrics, as the scraper asks) of the worker's
               OpenTelemetry metrics; 501 saying which extra to install without it
    /healthz   200 while the process lives and its event loop answers: served from the
               worker's own loop, so a blocked loop fails it (by the prober's timeout);
               the body reports the loop's lag
    /readyz    200 when connected to the broker and subscribed, 503 otherwise; the body
               names the broker state and each MCP server's state and last error

A starlette app on uvicorn, in the worker's event loop as the task `http-listener`. The
socket is bound before anything else runs, so a port already taken fails the start with
a readable error, and connections wait in its backlog until uvicorn takes them. uvicorn's
own signal handling is turned off: SIGTERM belongs to the worker, which drains first.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from toolbus.worker import status_page

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from toolbus.worker.service import Worker

log = logging.getLogger("toolbus.http")

STOP_BOUND_S = 3.0  # from stop asked to the listener gone; longer, it is cancelled
GRACEFUL_S = 1  # seconds: what a request already being answered gets of that
# The page runs its own inline script only, fetches only from here, and is never framed.
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# Never `pip install 'toolbus[prometheus]'`: toolbus is not on PyPI, and a package of
# that name there would be someone else's.
NO_PROMETHEUS = (
    "/metrics needs the prometheus extra: install opentelemetry-exporter-prometheus and "
    "prometheus-client where toolbus is installed (in a checkout: pip install -e "
    "'.[prometheus]'; under pipx: pipx inject toolbus opentelemetry-exporter-prometheus "
    "prometheus-client; docs/deployment.md)\n"
)


def default_registry() -> CollectorRegistry | None:
    """prometheus_client's default registry (where the SDK's Prometheus reader and the
    process collectors report), or None when the `prometheus` extra is not installed."""
    try:
        client = importlib.import_module("prometheus_client")
    except ImportError:
        return None
    registry: CollectorRegistry = client.REGISTRY
    return registry


class HttpListener:
    """Serves the worker's health and metrics while `async with` lasts.

    Args:
        worker: whose readiness, MCP servers and id are reported.
        host, port: where to listen (`http_host`, `http_port`; port 0 picks a free one,
            then `port` says which, and `address` what was bound).
        registry: what /metrics renders; `default_registry()` when not given.
    """

    def __init__(
        self,
        worker: Worker,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._worker = worker
        self.host, self.port = host, port
        self._registry = registry if registry is not None else default_registry()
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = time.monotonic()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/", self._page),
                Route("/status.json", self._status),
                Route("/metrics", self._metrics),
                Route("/healthz", self._healthz),
                Route("/readyz", self._readyz),
            ]
        )

    async def __aenter__(self) -> Self:
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            sock = socket.create_server((self.host, self.port), family=family)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen on {self.host}:{self.port} (http_port): {exc.strerror}"
            ) from exc
        self.address: tuple[str, int] = sock.getsockname()[:2]  # as bound, for the record
        self.port = self.address[1]
        config = uvicorn.Config(
            self.app(),
            lifespan="off",
            http="h11",
            ws="none",
            log_config=None,  # the worker's logging set-up applies
            log_level=logging.WARNING,  # uvicorn's start and stop lines say nothing new
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_S,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http-listener")
        self._task.add_done_callback(_report_end)
        log.info(
            "serving the status page, /metrics, /healthz and /readyz on http://%s:%d",
            self.host,
            self.port,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        _, pending = await asyncio.wait({self._task}, timeout=STOP_BOUND_S)
        if pending:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=STOP_BOUND_S)

    # -- endpoints ------------------------------------------------------------

    async def _page(self, request: Request) -> Response:
        return HTMLResponse(status_page.PAGE, headers=_PAGE_HEADERS)

    async def _status(self, request: Request) -> Response:
        body = status_page.snapshot(self._worker, self._started)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def _metrics(self, request: Request) -> Response:
        if self._registry is None:
            return PlainTextResponse(NO_PROMETHEUS, status_code=501)
        exposition = importlib.import_module("prometheus_client.exposition")
        encoder, content_type = exposition.choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(self._registry), headers={"Content-Type": content_type})

    async def _healthz(self, request: Request) -> Response:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(0)  # once round the loop: what is ready to run delays us this long
        lag_ms = (loop.time() - started) * 1000
        return JSONResponse(
            {"status": "ok", "worker_id": self._worker.worker_id, "loop_lag_ms": round(lag_ms, 3)}
        )

    async def _readyz(self, request: Request) -> Response:
        body = readiness(self._worker)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)


def readiness(worker: Worker) -> dict[str, Any]:
    """What /readyz answers. Ready is the broker alone: a failed MCP server takes its own
    tools away (callers get `unavailable`), not the worker's others."""
    state = worker.broker_state
    broker = worker.broker
    return {
        "ready": state == "subscribed",
        "worker_id": worker.worker_id,
        # Never the user name or password: the listener answers anyone who reaches it.
        "broker": {"address": f"{broker.host}:{broker.port}", "state": state},
        "servers": {
            name: {"state": server.state, "last_error": server.last_error}
            for name, server in worker.mcp.summaries().items()
        },
    }


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: it would take SIGTERM and SIGINT
    from the worker (which drains on them) and raise them again only once it stopped."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _report_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("the HTTP listener stopped: %r", error)
