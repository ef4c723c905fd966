"""Wiring: settings and tools into a working `Worker`, in one place.

The one composition function. Settings are read once by the entry point and arrive
here; every collaborator gets what it needs as constructor arguments, so no part
reads configuration or is completed by assigning attributes afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.metrics import Meter

from toolbus import __version__
from toolbus.backends.local.functions import LocalTool
from toolbus.calls.approvals import Approvals
from toolbus.calls.execute import Executor, Startup
from toolbus.calls.inflight import Slots
from toolbus.calls.quotas import Quotas
from toolbus.calls.relay import Relay
from toolbus.calls.rounds import RoundsSettings
from toolbus.config import Settings, tool_settings
from toolbus.dedup import Bounds, Once, open_store, open_tasks
from toolbus.dedup.tokens import MemoryTokens, TokenStore
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.normalization.guards import Guards
from toolbus.normalization.normalize import Normalizer
from toolbus.observability.export import TraceCollector
from toolbus.observability.metrics import Metrics
from toolbus.observability.recent import RecentCalls
from toolbus.tools.access import Access
from toolbus.tools.registry import Registry
from toolbus.wire.topics import Topics
from toolbus.worker.client_ids import client_ids
from toolbus.worker.fleet import Fleet
from toolbus.worker.publisher import ConnectionPublisher
from toolbus.worker.status import StatusReporter, status_expiry_s

log = logging.getLogger("toolbus.service")

if TYPE_CHECKING:
    from toolbus.worker.dispatch import Dispatch
    from toolbus.worker.service import Worker


def build_registry(local_tools: Iterable[LocalTool], settings: Settings) -> Registry:
    """The local tools, each with its resolved `[tools.NAME]` settings; aliases applied.
    A later tool of the same name (an installed package's `echo`) replaces the earlier one:
    said once at start-up, since the caller would otherwise meet another tool unawares."""
    registry = Registry(settings.aliases)
    chosen: dict[str, LocalTool] = {}
    for local in local_tools:
        earlier = chosen.get(local.name)
        if earlier is not None:
            log.warning(
                "local tool %s defined twice (%s, then %s): the later one is used",
                local.name,
                _where(earlier),
                _where(local),
            )
        chosen[local.name] = local
    registry.register_all(
        local.to_tool(
            tool_settings(settings.tools, local.name), log_arguments=settings.log_arguments
        )
        for local in chosen.values()
    )
    return registry


def _where(local: LocalTool) -> str:
    function = local.fn
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"


def build_executor(
    settings: Settings,
    registry: Registry,
    *,
    tracer: trace.Tracer | None = None,
    metrics: Metrics | None = None,
    startup: Startup | None = None,
    root_spans: bool = True,
) -> Executor:
    """Resolve, check, normalize, validate and run (tests and `toolbus mappings` use it too)."""
    return Executor(
        registry,
        Normalizer(settings.argument_maps),
        Guards(settings.guards),
        Access(settings.callers),
        default_timeout_s=settings.default_timeout_s,
        max_timeout_s=settings.max_timeout_s,
        slow_call_ms=settings.slow_call_ms,
        startup=startup,
        tracer=tracer,
        trace_arguments=settings.trace_arguments,
        trace_steps=settings.trace_steps,
        log_arguments=settings.log_arguments,
        metrics=metrics,
        root_spans=root_spans,
        approvals=Approvals(
            settings.callers,
            trusted=[name for name, server in settings.mcp_servers.items() if server.trusted],
            timeout_s=settings.approval_timeout_s,
        ),
    )


def topics_for(settings: Settings) -> Topics:
    return Topics(
        settings.topic_prefix,
        # Store dispatch: every worker receives every request (dedup/redis_dispatch.py).
        "" if settings.dispatch == "store" else settings.shared_group,
        settings.allowed_reply_prefixes,
        caller_identity=settings.caller_identity,
        require_caller=settings.require_caller,
    )


def build_worker(
    settings: Settings,
    local_tools: Iterable[LocalTool],
    *,
    tracer: trace.Tracer | None = None,
    collector: TraceCollector | None = None,
    meter: Meter | None = None,
    child_env: Mapping[str, str] | None = None,
    kept_secret: bytes | None = None,
) -> Worker:
    """A worker for `settings`, serving `local_tools` and the configured MCP servers.

    Args:
        tracer, collector, meter: telemetry; the process-wide ones by default.
        child_env: environment for stdio MCP servers (e.g. `OTEL_*`).
        kept_secret: the secret in `client_id_secret_file`, read (or made) and checked by
            the entry point (`client_ids.kept_secret`); it keys the client ids when
            `client_id_secret` is unset.
    """
    # Imported here: the registry, executor and pipeline (`toolbus mappings`, the
    # in-process tests) are built without the worker's parts. (The mcp SDK, a second to
    # import, is not among them: the backend imports it in a thread once entered.)
    from toolbus.backends.mcp import McpBackend  # noqa: PLC0415 -- see the comment above
    from toolbus.transport import max_packet_bytes  # noqa: PLC0415 -- as above
    from toolbus.transport.nodes import Nodes  # noqa: PLC0415 -- as above
    from toolbus.worker.links import Links  # noqa: PLC0415 -- imports the transport (aiomqtt)
    from toolbus.worker.service import Worker  # noqa: PLC0415 -- imports the transport (aiomqtt)

    worker_id = settings.worker_id or f"toolbus-{uuid.uuid4().hex[:12]}"
    if not settings.worker_id:
        log.warning(
            "no worker_id set: requests held at a crash are lost, not delivered again; "
            "set a stable worker_id (unique per replica) for a persistent session"
        )
    ids = client_ids(worker_id, _client_id_secret(settings, kept_secret))
    if settings.worker_id and not ids.persistent:
        log.warning(
            "no client_id_secret(_file) and no broker password: the client ids are random "
            "for this process, so a restart does not resume the broker session (requests "
            "held at a crash are lost); set client_id_secret_file for a persistent session"
        )
    topics = topics_for(settings)
    registry = build_registry(local_tools, settings)
    publisher = ConnectionPublisher(timeout_s=settings.publish_timeout_s)
    servers = {name: cfg for name, cfg in settings.mcp_servers.items() if not cfg.disabled}
    expiry_s = status_expiry_s(settings.status_interval_s)
    status = StatusReporter(
        topics,
        worker_id,
        publisher,
        servers,
        interval_s=settings.status_interval_s,
        offline_expiry_s=settings.session_expiry_s or 3600,
        version=__version__,
        # The status page's view of the fleet: only for a worker that serves the page.
        fleet=None if settings.http_port is None else Fleet(topics, stale_after_s=expiry_s),
    )
    mcp = McpBackend(
        servers,
        registry,
        settings.tools,
        settings.mcp,
        child_env=child_env,
        listeners=[status.server_changed],
        tracer=tracer,
    )
    metrics = Metrics(
        meter,
        server_states=mcp.states,
        partial_lines=mcp.partial_lines,
        # Read at each collection, long after `once` below exists: hence lambdas.
        dedup_bytes=lambda: once.store.held_bytes(),  # noqa: PLW0108 -- `once` is bound below
        dedup_gave_way=lambda: once.store.gave_way(),  # noqa: PLW0108 -- likewise
        # The status page's window and fleet: only for a worker that serves the page.
        recent=RecentCalls() if settings.http_port is not None else None,
    )
    executor = build_executor(
        settings, registry, tracer=tracer, metrics=metrics, startup=mcp, root_spans=False
    )
    once = Once(
        open_store(
            settings.dedup_store,
            worker_id,
            prefix=settings.topic_prefix,
            bounds=Bounds(
                max_records=settings.dedup_max_records,
                caller_max_bytes=settings.dedup_caller_max_bytes,
                max_bytes=settings.dedup_max_bytes,
            ),
            ttl_s=settings.dedup_ttl_s,
            on_emptied=metrics.dedup_store_emptied,
        ),
        settings.dedup_ttl_s,
        executor.idempotent,
        max_reply_bytes=settings.dedup_max_reply_bytes,
        cancel_remember_s=settings.cancel_remember_s,
        unreachable_runs=settings.dedup_unavailable == "run",
    )
    slots = Slots(settings.concurrency)
    tokens = open_tokens(settings, worker_id)
    pipeline = Pipeline(
        executor,
        topics,
        publisher,
        worker_id=worker_id,
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
        publish_traces=settings.publish_traces,
        tracer=tracer,
        collector=collector,
        metrics=metrics,
        once=once,
        quotas=Quotas(settings.callers),
        slots=slots,
        max_calls=settings.max_calls_per_message,
        progress_rate_per_s=settings.progress_rate_per_s,
        task_store=open_tasks(
            settings.dedup_store,
            worker_id,
            prefix=settings.topic_prefix,
            caller_max_bytes=settings.task_caller_max_bytes,
        ),
        task_ttl_s=settings.task_ttl_s,
        rounds=RoundsSettings(
            input_timeout_s=settings.input_timeout_s,
            max_open=settings.input_max_open,
            relay=open_relay(settings, tokens.owner),
            caller_max_bytes=settings.token_caller_max_bytes,
        ),
        token_store=tokens,
    )
    status.tasks = pipeline.tasks_in_flight  # `toolbus status`: tasks in flight
    status.waiting = pipeline.rounds.__len__  # and calls waiting for their callers
    links = Links(
        Nodes(settings.brokers),
        ids,
        slots.count,
        # A session outlives the connection only under a stable, configured identity
        # whose client ids no caller can derive (see `client_ids`).
        session_expiry_s=settings.session_expiry_s if ids.persistent else 0,
        timeout_s=settings.publish_timeout_s,
        keepalive_s=settings.keepalive_s,
        max_packet_bytes=max_packet_bytes(settings.max_payload_bytes),
        dispatch=open_dispatch(settings, worker_id),
    )
    # Each online status names the node it was published on (retained: node-local on some).
    status.node = lambda: f"{links.broker.host}:{links.broker.port}"
    return Worker(
        broker=settings.broker,
        worker_id=worker_id,
        topics=topics,
        pipeline=pipeline,
        publisher=publisher,
        status=status,
        mcp=mcp,
        metrics=metrics,
        slots=slots,
        shutdown_grace_s=settings.shutdown_grace_s,
        publish_timeout_s=settings.publish_timeout_s,
        reconnect_max_delay_s=settings.reconnect_max_delay_s,
        links=links,
    )


def open_dispatch(settings: Settings, worker_id: str) -> Dispatch | None:
    """Store dispatch (`dispatch = "store"`): which messages are this worker's, through
    the Redis the pool shares; None behind `$share`."""
    if settings.dispatch != "store":
        return None
    from toolbus.dedup.redis_dispatch import RedisDispatch  # noqa: PLC0415 -- only with Redis

    return RedisDispatch(
        settings.dedup_store, worker_id, prefix=settings.topic_prefix, keep_s=settings.dedup_ttl_s
    )


def open_tokens(settings: Settings, worker_id: str) -> TokenStore:
    """The approvals' and continuations' tokens beside the dedup store: in memory, or in
    the same Redis (a pool's: a token made by one worker is taken at another)."""
    bound = settings.token_caller_max_bytes
    if settings.dedup_store == "memory":
        return MemoryTokens(worker_id, caller_max_bytes=bound)
    from toolbus.dedup.redis_tokens import RedisTokens  # noqa: PLC0415 -- only with Redis

    return RedisTokens(
        settings.dedup_store, worker_id, prefix=settings.topic_prefix, caller_max_bytes=bound
    )


def open_relay(settings: Settings, owner: str) -> Relay | None:
    """How a continuation reaches the worker holding its call: the pool's Redis (pub/sub,
    one channel per `owner`, the tokens' name for this worker); alone, no relay."""
    if settings.dedup_store == "memory":
        return None
    from toolbus.dedup.redis_relay import RedisRelay  # noqa: PLC0415 -- only with Redis

    # A round's answers came in one request; its reply is at most one tool result.
    bound = settings.max_payload_bytes + settings.mcp.max_result_bytes + (64 << 10)
    return RedisRelay(
        settings.dedup_store, prefix=settings.topic_prefix, owner=owner, max_message_bytes=bound
    )


def _client_id_secret(settings: Settings, kept: bytes | None) -> bytes | None:
    """What keys the client ids: `client_id_secret`, else `client_id_secret_file`'s (`kept`),
    else the broker password (only a stable worker_id makes ids worth keeping across
    starts)."""
    if settings.worker_id is None:
        return None
    if settings.client_id_secret is not None:
        return settings.client_id_secret.get_secret_value().encode()
    if kept is not None:
        return kept
    if settings.broker_password is not None:
        return settings.broker_password.get_secret_value().encode()
    return None


def serve_http(
    settings: Settings, worker: Worker
) -> contextlib.AbstractAsyncContextManager[object]:
    """The HTTP listener (the status page, /metrics, /healthz, /readyz) `http_port` asks
    for; nothing without one. Entered before `worker.run`, so /readyz answers while it
    connects."""
    if settings.metrics_port is not None:
        log.warning(
            "metrics_port is deprecated: set http_port (here %s), whose listener serves "
            "/metrics, /healthz and /readyz",
            settings.http_port,
        )
    if settings.http_port is None:
        return contextlib.nullcontext()
    # Imported here: starlette and uvicorn load only for a worker that listens.
    from toolbus.worker.http import HttpListener  # noqa: PLC0415 -- see above

    return HttpListener(worker, host=settings.http_host, port=settings.http_port)
