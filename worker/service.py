"""Service: the worker pool. Consume, bound, handle, reply, drain, shut down.

One MQTT v5 connection per worker, reconnected with jittered exponential backoff.
Requests arrive on a shared subscription so replicas split the load; each message
is handled in its own named task while at most `concurrency` run at once (the
consumer stops taking messages while every slot is busy). On stop the worker
unsubscribes, finishes what it already holds within the grace period, answers
anything still running with `unavailable`, then marks itself offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from opentelemetry import trace

from toolbus.access import Access
from toolbus.backends.local import LocalTool
from toolbus.backends.mcp import McpBackend, McpServer
from toolbus.config import Settings, tool_settings
from toolbus.contracts import ErrorBody, Reply, ServerStatus, WorkerStatus
from toolbus.decode import Call, Rejected, ReplyAddress, decode
from toolbus.encode import dead_letter, outbound_reply, reply_for_call, reply_for_rejected
from toolbus.errors import Unavailable
from toolbus.execute import Executor, Outcome, Startup
from toolbus.normalization.guards import Guards
from toolbus.normalization.normalize import Normalizer
from toolbus.observability.export import COLLECTOR, TraceCollector, descendants, otlp_json
from toolbus.observability.metrics import Metrics
from toolbus.observability.propagation import extract_context, inject_headers
from toolbus.observability.spans import default_tracer, messaging_attributes, trace_id_of
from toolbus.registry import Registry
from toolbus.topics import Topics
from toolbus.transport import Inbound, MqttConnection, Outbound, TransportError

log = logging.getLogger("toolbus.service")

RETRY_PUBLISH_DELAY_S = 0.2
RECONNECT_FIRST_DELAY_S = 0.5


def build_registry(local_tools: Iterable[LocalTool], settings: Settings) -> Registry:
    registry = Registry(settings.aliases)
    registry.register_all(
        local.to_tool(tool_settings(settings.tools, local.name)) for local in local_tools
    )
    return registry


def build_executor(
    settings: Settings,
    registry: Registry,
    tracer: trace.Tracer | None = None,
    metrics: Metrics | None = None,
    startup: Startup | None = None,
) -> Executor:
    """The pipeline a worker runs, from the settings (tests and `toolbus mappings` use it too)."""
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
        metrics=metrics,
    )


class Worker:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        *,
        tcp_nodelay: bool = True,
        tracer: trace.Tracer | None = None,
        collector: TraceCollector | None = None,
        metrics: Metrics | None = None,
        child_env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self._tracer = tracer or default_tracer()
        self._collector = collector or COLLECTOR
        self.metrics = metrics or Metrics()
        self._tcp_nodelay = tcp_nodelay  # off only for the benchmark's baseline
        self.worker_id = settings.worker_id or f"toolbus-{uuid.uuid4().hex[:12]}"
        self.topics = Topics(
            settings.topic_prefix, settings.shared_group, settings.allowed_reply_prefixes
        )
        self.registry = registry
        self.mcp = McpBackend(
            settings.mcp_servers,
            registry,
            settings.tools,
            settings.mcp,
            child_env=child_env,
            listeners=[self._on_server_state],
        )
        self.executor = build_executor(
            settings, registry, self._tracer, self.metrics, startup=self.mcp
        )
        self.metrics.watch_servers(self.mcp.states)
        self.subscribed = asyncio.Event()
        self.draining = asyncio.Event()  # set once stopping has begun
        self.in_flight = 0
        self.max_in_flight = 0
        self.handled = 0
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._conn: MqttConnection | None = None
        self._connected = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._sequence = 0

    # -- lifecycle -------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain and return."""
        log.info(
            "worker %s starting: broker %s, %d local tools, MCP servers: %s",
            self.worker_id,
            self.settings.broker,
            len(self.registry),
            ", ".join(self.mcp.servers) or "none",
        )
        async with self.mcp:
            self._background_task(self._report_configuration(), "report-configuration")
            await self._serve(stop)
        log.info("worker %s stopped after %d messages", self.worker_id, self.handled)

    async def _serve(self, stop: asyncio.Event) -> None:
        delay_s = RECONNECT_FIRST_DELAY_S
        while not stop.is_set():
            try:
                async with MqttConnection(
                    self.settings.broker,
                    client_id=self.worker_id,
                    will=self._status("offline"),
                    timeout_s=self.settings.publish_timeout_s,
                    tcp_nodelay=self._tcp_nodelay,
                ) as conn:
                    self._conn = conn
                    self._connected.set()
                    await conn.publish(self._status("online"))
                    await conn.subscribe(self.topics.subscriptions())
                    self.subscribed.set()
                    log.info("subscribed to %s", ", ".join(self.topics.subscriptions()))
                    delay_s = RECONNECT_FIRST_DELAY_S
                    if await self._consume_until(conn, stop):
                        await self._drain(conn)
                        return
            except TransportError as exc:
                log.warning(
                    "broker connection lost or refused (%s); retrying in %.1f s", exc, delay_s
                )
            finally:
                self._connected.clear()
                self._conn = None
                self.subscribed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s * random.uniform(0.8, 1.2)):  # noqa: S311
                    await stop.wait()
            delay_s = min(delay_s * 2, self.settings.reconnect_max_delay_s)
        # Stopped while disconnected: calls still running get their grace period too.
        await self._finish_handlers()

    async def _consume_until(self, conn: MqttConnection, stop: asyncio.Event) -> bool:
        """Consume until stop (True) or until the connection fails (raises)."""
        consumer = asyncio.create_task(self._consume(conn), name="consume")
        stopper = asyncio.create_task(stop.wait(), name="stop-wait")
        done, _ = await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if consumer in done:
            stopper.cancel()
            consumer.result()  # re-raises the TransportError
            return False
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        return True

    async def _consume(self, conn: MqttConnection, *, only_queued: bool = False) -> None:
        """Take messages one free slot at a time.

        The slot is taken before the message: cancelling this loop at shutdown then
        never drops a message the client has already acknowledged to the broker.
        """
        messages = conn.messages()
        while not only_queued or conn.queued():
            await self._slots.acquire()
            try:
                message = await anext(messages)
            except BaseException:
                self._slots.release()
                raise
            self._spawn(message)

    def _spawn(self, message: Inbound) -> None:
        self.in_flight += 1
        self.metrics.message_started()
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._sequence += 1
        task = asyncio.create_task(self._handle(message), name=f"handle:{self._sequence}")
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _drain(self, conn: MqttConnection) -> None:
        """Stop taking requests, finish held ones within the grace period, then go offline."""
        self._stopping = True
        self.draining.set()
        grace_s = self.settings.shutdown_grace_s
        deadline = asyncio.get_running_loop().time() + grace_s
        log.info("stopping: %d calls in flight, grace %.1f s", len(self._handlers), grace_s)
        try:
            async with asyncio.timeout(self.settings.publish_timeout_s):
                await conn.unsubscribe(self.topics.subscriptions())
            # Messages the client already acknowledged must not be lost: handle them too.
            async with asyncio.timeout_at(deadline):
                await self._consume(conn, only_queued=True)
        except (TransportError, TimeoutError) as exc:
            log.warning("could not take every queued message before stopping: %s", exc)
        await self._finish_handlers(deadline)
        with contextlib.suppress(TransportError, TimeoutError):
            await conn.publish(self._status("offline"), timeout_s=self.settings.publish_timeout_s)

    async def _finish_handlers(self, deadline: float | None = None) -> None:
        """Let running calls finish until the deadline; answer the rest `unavailable`."""
        self._stopping = True
        self.draining.set()
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.settings.shutdown_grace_s
        if self._handlers:
            remaining_s = max(0.0, deadline - loop.time())
            _, late = await asyncio.wait(set(self._handlers), timeout=remaining_s)
            for task in late:
                task.cancel()  # each answers `unavailable` before it ends
            if late:
                log.warning("%d calls did not finish within the grace period", len(late))
                await asyncio.wait(late, timeout=self.settings.publish_timeout_s)

    # -- one message -----------------------------------------------------

    async def _handle(self, message: Inbound) -> None:
        try:
            decoded = decode(message, self.topics, self.settings.max_payload_bytes)
            fields = decoded.trace_fields if isinstance(decoded, Call) else None
            with self._tracer.start_as_current_span(
                f"process {message.topic}",
                context=extract_context(message.user_properties, fields),
                kind=trace.SpanKind.CONSUMER,
                attributes=messaging_attributes(
                    "process",
                    message.topic,
                    decoded.id,
                    self.worker_id,
                    **{"messaging.message.body.size": len(message.payload)},
                ),
            ) as span:
                publish_trace = (
                    isinstance(decoded, Call)
                    and decoded.reply is not None
                    and (decoded.publish_trace or self.settings.publish_traces)
                )
                if publish_trace:
                    self._collector.watch(span.get_span_context().trace_id)
                if isinstance(decoded, Rejected):
                    span.set_status(trace.StatusCode.ERROR, decoded.error.code.value)
                    span.set_attribute("error.type", decoded.error.code.value)
                    await self._reject(message, decoded)
                else:
                    await self._call(message, decoded)
            if publish_trace and isinstance(decoded, Call) and decoded.reply is not None:
                await self._publish_trace(decoded, decoded.reply, span)
        except Exception:
            log.exception("failed handling a message on %s", message.topic)
        finally:
            self.handled += 1
            self.in_flight -= 1
            self.metrics.message_done()
            self._slots.release()

    async def _reject(self, message: Inbound, rejected: Rejected) -> None:
        log.warning(
            "rejected message on %s: %s (%s)",
            message.topic,
            rejected.error.code.value,
            rejected.error.message,
        )
        if rejected.reply is not None:
            await self._reply(rejected.reply, reply_for_rejected(rejected))
        else:
            await self._dead(message, rejected.error.body(), rejected.id)

    async def _call(self, message: Inbound, call: Call) -> None:
        try:
            outcome = await self.executor.execute(call)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._stopping or task is None:
                raise
            task.uncancel()
            outcome = Outcome(
                tool=call.tool,
                error=Unavailable("the worker shut down before the call finished"),
            )
        reply = reply_for_call(call, outcome)
        if outcome.error is not None:
            span = trace.get_current_span()
            span.set_status(trace.StatusCode.ERROR, outcome.error.code.value)
            span.set_attribute("error.type", outcome.error.code.value)
        if call.reply is not None:
            await self._reply(call.reply, reply)
        elif reply.error is not None:
            await self._dead(message, reply.error, call.id)

    async def _publish_trace(self, call: Call, address: ReplyAddress, span: trace.Span) -> None:
        """This call's finished spans, as OTLP JSON, after its reply (on `{reply}/trace`)."""
        context = span.get_span_context()
        taken = self._collector.take(context.trace_id)
        mine = descendants(taken, context.span_id)
        if not mine:
            return
        await self._publish(
            Outbound(
                topic=f"{address.topic}/trace",
                payload=otlp_json(mine),
                correlation_data=address.correlation_data,
                user_properties=(("toolbus-id", call.id),),
            )
        )

    async def _reply(self, address: ReplyAddress, reply: Reply) -> None:
        """Publish a reply in a PRODUCER span whose context travels with it."""
        reply = reply.model_copy(update={"trace_id": trace_id_of(trace.get_current_span())})
        with self._tracer.start_as_current_span(
            f"send {address.topic}",
            kind=trace.SpanKind.PRODUCER,
            attributes=messaging_attributes("send", address.topic, reply.id, self.worker_id),
        ):
            await self._publish(outbound_reply(address, reply, inject_headers()))

    async def _dead(self, message: Inbound, error: ErrorBody, ident: str | None) -> None:
        log.warning("dead-lettering message on %s: %s", message.topic, error.code.value)
        self.metrics.dead_lettered(error.code.value)
        await self._publish(
            dead_letter(
                dead_topic=self.topics.dead,
                topic=message.topic,
                payload=message.payload,
                error=error,
                ident=ident,
                max_payload_bytes=self.settings.max_payload_bytes,
            )
        )

    async def _publish(self, out: Outbound) -> None:
        """Publish through the live connection, waiting out a reconnect within the bound."""
        try:
            async with asyncio.timeout(self.settings.publish_timeout_s):
                while True:
                    await self._connected.wait()
                    conn = self._conn
                    if conn is None:
                        continue
                    try:
                        await conn.publish(out)
                    except TransportError as exc:
                        log.debug("publish to %s failed (%s); retrying", out.topic, exc)
                        await asyncio.sleep(RETRY_PUBLISH_DELAY_S)
                    else:
                        return
        except TimeoutError:
            log.error(  # noqa: TRY400
                "could not publish to %s within %.1f s: message lost",
                out.topic,
                self.settings.publish_timeout_s,
            )

    # -- configuration ---------------------------------------------------------

    async def _report_configuration(self) -> None:
        """Once every MCP server has settled, report names in the config that lead nowhere."""
        await self.mcp.wait_settled()
        for alias, target in self.registry.unknown_aliases().items():
            log.warning("alias %s points at %s, which is no tool", alias, target)
        self.executor.access.report_unknown()

    def _background_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- status ----------------------------------------------------------

    def _status(self, state: str) -> Outbound:
        status = WorkerStatus(
            state=state,
            worker_id=self.worker_id,
            servers=self.mcp.states(),
        )
        return Outbound(
            topic=self.topics.status(self.worker_id),
            payload=status.model_dump_json().encode(),
            retain=True,
        )

    def _on_server_state(self, server: McpServer) -> None:
        log.info("MCP server %s is %s", server.name, server.state)
        if self._connected.is_set() and not self._stopping:
            self._background_task(self._publish_states(server), f"status:{server.name}")

    async def _publish_states(self, server: McpServer) -> None:
        status = ServerStatus(
            server=server.name,
            state=server.state,
            worker_id=self.worker_id,
            last_error=server.last_error,
            tools=server.tool_names,
            bad_stdout_lines=server.bad_stdout_lines,
        )
        await self._publish(
            Outbound(
                topic=self.topics.server_status(server.name),
                payload=status.model_dump_json().encode(),
                retain=True,
            )
        )
        await self._publish(self._status("online"))
