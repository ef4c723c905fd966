"""Pipeline: one message end to end. Decode, execute, encode, reply or dead-letter.

`Pipeline.handle(message)` takes one `Inbound` value and publishes what it owes the
sender through a `Publisher`: the reply on the sender's reply topic, a dead letter
when there is no reply address, and the call's spans on `{reply}/trace` when asked.
It never raises: whatever fails while building an answer still answers `internal`
with the call id (or dead-letters), and is counted. No broker is involved here, so
every case is testable in-process with a publisher that collects into a list.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, Self

from opentelemetry import trace

from toolbus.contracts import ErrorBody, Reply
from toolbus.decode import Call, Rejected, ReplyAddress, decode
from toolbus.dedup import RUN_UNCLAIMED, Once, Verdict
from toolbus.encode import dead_letter, outbound_reply, reply_for_call, reply_for_rejected
from toolbus.errors import Forbidden, InternalError, RateLimited, ToolbusError, Unavailable
from toolbus.execute import Executor, Outcome
from toolbus.messages import Inbound, Outbound
from toolbus.observability.export import COLLECTOR, TraceCollector, descendants, otlp_json
from toolbus.observability.metrics import Metrics
from toolbus.observability.propagation import extract_context, inject_headers
from toolbus.observability.spans import (
    default_tracer,
    mark_failed,
    messaging_attributes,
    trace_id_of,
)
from toolbus.quotas import Quotas
from toolbus.topics import MAX_REPLY_TOPIC_BYTES, Topics
from toolbus.untrusted import shown

log = logging.getLogger("toolbus.pipeline")


class Publisher(Protocol):
    """Where the pipeline's messages go. Never raises: a lost message is logged there."""

    async def publish(self, out: Outbound) -> None: ...


class Pipeline:
    """Handles messages one at a time per call of `handle`; safe to run concurrently.

    Args:
        executor: resolves, checks and runs calls; classifies every outcome.
        topics: the topic layout (decoding rules, reply prefixes, dead-letter topic).
        publisher: where replies, dead letters and published traces go.
        worker_id: names this worker in span attributes.
        max_payload_bytes: the largest request accepted.
        dead_letter_max_bytes: how much of a request's payload its dead letter keeps.
        publish_traces: send every caller its call's spans, not only those who ask.
        tracer, collector, metrics: telemetry; the process-wide ones by default.
        once: deduplication by request id; none without it.
        quotas: per-caller admission (`[callers.NAME]` rates and in-flight bounds).
    """

    def __init__(
        self,
        executor: Executor,
        topics: Topics,
        publisher: Publisher,
        *,
        worker_id: str,
        max_payload_bytes: int,
        dead_letter_max_bytes: int,
        publish_traces: bool = False,
        tracer: trace.Tracer | None = None,
        collector: TraceCollector | None = None,
        metrics: Metrics | None = None,
        once: Once | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.executor = executor
        self._once = once
        self._quotas = quotas if quotas is not None else Quotas({})
        self.topics = topics
        self._publisher = publisher
        self._worker_id = worker_id
        self._max_payload_bytes = max_payload_bytes
        self._dead_letter_max_bytes = dead_letter_max_bytes
        self._publish_traces = publish_traces
        self._tracer = tracer or default_tracer()
        self._collector = collector or COLLECTOR
        self._metrics = metrics or executor.metrics
        self._stopping = False

    async def __aenter__(self) -> Self:
        """Open what the pipeline keeps across messages (the dedup store)."""
        if self._once is not None:
            await self._once.store.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._once is not None:
            await self._once.store.__aexit__(*exc)

    def stopping(self) -> None:
        """From now on a call cancelled mid-way answers `unavailable` (the worker stops)."""
        self._stopping = True

    async def handle(self, message: Inbound) -> None:
        """Answer one message: a reply, a dead letter, or (last resort) `internal`."""
        decoded: Call | Rejected | None = None
        answered = False
        try:
            decoded = decode(message, self.topics, self._max_payload_bytes)
            fields = decoded.trace_fields if isinstance(decoded, Call) else None
            with self._tracer.start_as_current_span(
                f"process {shown(message.topic)}",
                context=extract_context(message.user_properties, fields),
                kind=trace.SpanKind.CONSUMER,
                attributes=messaging_attributes(
                    "process",
                    shown(message.topic),
                    decoded.id,
                    self._worker_id,
                    **{"messaging.message.body.size": len(message.payload)},
                ),
            ) as span:
                traced = self._trace_wanted(decoded)
                if traced:
                    self._collector.watch(span.get_span_context().trace_id)
                if isinstance(decoded, Rejected):
                    mark_failed(span, decoded.error.code.value)
                    await self._reject(message, decoded)
                else:
                    await self._call(message, decoded)
                answered = True
            if traced and isinstance(decoded, Call) and decoded.reply is not None:
                await self._publish_trace(decoded, decoded.reply, span)
        except Exception:
            log.exception("failed handling a message on %s", shown(message.topic))
            # After the answer only the trace could fail: the caller has heard already.
            self._metrics.internal_error("trace" if answered else "handle")
            if not answered:
                await self._last_resort(message, decoded)

    def _trace_wanted(self, decoded: Call | Rejected) -> bool:
        return (
            isinstance(decoded, Call)
            and decoded.reply is not None
            and (decoded.publish_trace or self._publish_traces)
        )

    async def _reject(self, message: Inbound, rejected: Rejected) -> None:
        log.warning(
            "rejected message on %s: %s (%s)",
            shown(message.topic),
            rejected.error.code.value,
            rejected.error.message,
        )
        if rejected.reply is not None:
            await self._reply(rejected.reply, reply_for_rejected(rejected))
        else:
            await self._dead(message, rejected.error.body(), rejected.id)

    async def _call(self, message: Inbound, call: Call) -> None:
        # The caller as quotas, dedup and access will see it (`call/{a}/{b}` may name one).
        try:
            call = self.executor.locate(call)
            if call.caller is None and self.topics.require_caller:
                raise Forbidden("this worker answers only named callers", reason="caller_required")
        except ToolbusError as refused:
            await self._refuse(message, call, refused)
            return
        try:
            ticket = self._quotas.admit(call.caller)
        except RateLimited as error:
            # Logged at DEBUG only (a flood would flood the log); counted instead.
            log.debug("rate limited %s from %s: %s", call.id, shown(call.caller or "-"), error)
            self._metrics.rate_limited(str(error.details.get("limit")))
            await self._refuse(message, call, error, quiet=True)
            return
        with ticket:
            await self._admitted(message, call)

    async def _refuse(
        self, message: Inbound, call: Call, error: ToolbusError, *, quiet: bool = False
    ) -> None:
        """Answered at once, nothing claimed or run."""
        mark_failed(trace.get_current_span(), error.code.value)
        reply = reply_for_call(call, Outcome(tool=None, error=error))
        if call.reply is not None:
            await self._reply(call.reply, reply)
        else:
            await self._dead(message, error.body(), call.id, quiet=quiet)

    async def _admitted(self, message: Inbound, call: Call) -> None:
        verdict = await self._claim(call)
        if verdict.reply is not None:  # a repeat of an answered request: the same answer
            await self._replay(call, verdict.reply)
            return
        outcome = Outcome(tool=call.tool, error=verdict.error) if verdict.error else None
        try:
            outcome = outcome or await self.executor.execute(call)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._stopping or task is None:
                raise
            task.uncancel()  # the worker stops: this call still gets its answer
            # The claim stays open: a repeat finds this run cut short (in doubt).
            verdict = RUN_UNCLAIMED
            outcome = Outcome(
                tool=call.tool,
                error=Unavailable("the worker shut down before the call finished"),
            )
        if outcome.error is not None:
            mark_failed(trace.get_current_span(), outcome.error.code.value)
        try:
            reply = reply_for_call(call, outcome)
            await self._close(verdict, outcome, reply)  # before the reply: a crash in
            if call.reply is not None:  # between replays it rather than running it twice
                await self._reply(call.reply, reply)
            elif reply.error is not None:
                await self._dead(message, reply.error, call.id)
        except Exception:
            # The outcome is known but its reply cannot be built (a tool's result the
            # reply model rejects, say): the caller still hears, with our code.
            log.exception("could not encode the reply to %s (%s)", call.id, outcome.tool)
            self._metrics.internal_error("encode")
            await self._last_resort(message, call)

    async def _claim(self, call: Call) -> Verdict:
        """Deduplication by the request's own id (generated ids are never repeated)."""
        if self._once is None or call.id_generated:
            return RUN_UNCLAIMED
        deadline_s = self.executor.request_deadline_s(call)
        try:
            return await self._once.begin(call.caller, call.id, call.tool, deadline_s)
        except Exception as exc:  # the store is unreachable: say so, run nothing
            log.warning("dedup store failed for %s: %s", call.id, exc)
            return Verdict(error=Unavailable("the dedup store is unreachable", store=True))

    async def _close(self, verdict: Verdict, outcome: Outcome, reply: Reply) -> None:
        """A call that reached its tool is answered for good; one that did not (unknown
        tool, bad arguments, server down) leaves its id free to run again."""
        if self._once is None or verdict.key is None:
            return
        try:
            if outcome.invoked:
                await self._once.finish(verdict, reply.model_dump_json(by_alias=True).encode())
            else:
                await self._once.release(verdict)
        except Exception as exc:
            log.warning("dedup store failed closing %s: %s", reply.id, exc)

    async def _replay(self, call: Call, stored: bytes) -> None:
        if call.reply is None:
            return  # answered before, and nowhere to answer again
        reply = Reply.model_validate_json(stored).model_copy(
            update={"replayed": True, "id": call.id, "id_generated": False}
        )
        await self._reply(call.reply, reply)

    async def _last_resort(self, message: Inbound, decoded: Call | Rejected | None) -> None:
        """`internal`, with the call id when known, to the reply address or the dead letters.

        Through the usual reply path when it works (trace id, PRODUCER span, 3.1.1
        traceparent), and as a bare publish when even that fails.
        """
        error = InternalError("the worker failed while answering this call").body()
        mark_failed(trace.get_current_span(), error.code.value)  # a no-op outside a span
        address = decoded.reply if decoded is not None else None
        ident = decoded.id if decoded is not None else None
        reply = Reply(
            id=ident or "",
            id_generated=decoded.id_generated if decoded is not None else False,
            ok=False,
            error=error,
            duration_ms=0.0,
        )
        try:
            if address is None or ident is None:
                await self._dead(message, error, ident)
                return
            try:
                await self._reply(address, reply)
            except Exception:
                log.exception("could not send the internal reply to %s normally", ident)
                await self._publisher.publish(outbound_reply(address, reply))
        except Exception:
            log.exception("could not answer a message on %s at all", shown(message.topic))

    async def _publish_trace(self, call: Call, address: ReplyAddress, span: trace.Span) -> None:
        """This call's finished spans, as OTLP JSON, after its reply (on `{reply}/trace`)."""
        context = span.get_span_context()
        mine = descendants(self._collector.take(context.trace_id), context.span_id)
        if not mine:
            return
        await self._publisher.publish(
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
            attributes=messaging_attributes("send", address.topic, reply.id, self._worker_id),
        ):
            out = outbound_reply(address, reply, inject_headers())
            await self._publisher.publish(out)

    async def _dead(
        self, message: Inbound, error: ErrorBody, ident: str | None, *, quiet: bool = False
    ) -> None:
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "dead-lettering message on %s: %s",
            shown(message.topic),
            error.code.value,
        )
        self._metrics.dead_lettered(error.code.value)
        await self._publisher.publish(
            dead_letter(
                dead_topic=self.topics.dead,
                topic=shown(message.topic, MAX_REPLY_TOPIC_BYTES),
                payload=message.payload,
                error=error,
                ident=ident,
                max_payload_bytes=self._dead_letter_max_bytes,
            )
        )
