"""Outbox: how the envelope door's answers leave, traced.

A reply goes out in a PRODUCER span whose context travels with it (W3C headers as v5
user properties; for 3.1.1 callers in the body), a dead letter is logged and counted,
and a call's finished spans follow its reply on `{reply}/trace` when asked. The
pipeline, the task door and a task's pushes all send through here.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

from toolbus.calls.call import ReplyAddress
from toolbus.doors.envelope.encode import dead_letter, outbound_reply
from toolbus.observability.export import TraceCollector, descendants, otlp_json
from toolbus.observability.metrics import Metrics
from toolbus.observability.propagation import inject_headers
from toolbus.observability.spans import child_span, messaging_attributes, trace_id_of
from toolbus.wire.contracts import CallsReply, ErrorBody, ErrorCode, Reply
from toolbus.wire.messages import Inbound, Outbound, Publisher, Unconfirmed
from toolbus.wire.topics import MAX_REPLY_TOPIC_BYTES
from toolbus.wire.untrusted import shown

log = logging.getLogger("toolbus.pipeline")


class Outbox:
    """Replies, dead letters and published traces, through `publisher`."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        tracer: trace.Tracer,
        collector: TraceCollector,
        metrics: Metrics,
        worker_id: str,
        dead_topic: str,
        dead_letter_max_bytes: int,
    ) -> None:
        self._publisher, self._tracer, self._collector = publisher, tracer, collector
        self._metrics, self._worker_id = metrics, worker_id
        self._dead_topic, self._dead_letter_max_bytes = dead_topic, dead_letter_max_bytes

    async def trace(self, ident: str, address: ReplyAddress, span: trace.Span) -> None:
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
                user_properties=(("toolbus-id", ident),),
            )
        )

    async def reply(self, address: ReplyAddress, reply: Reply | CallsReply) -> Unconfirmed | None:
        """Publish a reply in a PRODUCER span whose context travels with it (a span only
        when the message's span records; the caller's context travels regardless)."""
        current = trace.get_current_span()
        if not current.get_span_context().is_valid:  # untraced: nothing to add or pass on
            return await self._publisher.publish(outbound_reply(address, reply))
        reply = reply.model_copy(update={"trace_id": trace_id_of(current)})
        with child_span(
            self._tracer,
            f"send {address.topic}",
            messaging_attributes("send", address.topic, reply.id, self._worker_id),
            kind=trace.SpanKind.PRODUCER,
        ):
            out = outbound_reply(address, reply, inject_headers())
            return await self._publisher.publish(out)

    async def dead(self, message: Inbound, error: ErrorBody, ident: str | None) -> None:
        quiet = error.code is ErrorCode.RATE_LIMITED  # a flood must not flood the log
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "dead letter",
            extra={"topic": shown(message.topic), "code": error.code.value},
        )
        self._metrics.dead_lettered(error.code.value)
        await self._publisher.publish(
            dead_letter(
                dead_topic=self._dead_topic,
                topic=shown(message.topic, MAX_REPLY_TOPIC_BYTES),
                payload=message.payload,
                error=error,
                ident=ident,
                max_payload_bytes=self._dead_letter_max_bytes,
            )
        )
