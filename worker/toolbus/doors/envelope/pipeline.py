"""Pipeline: one message end to end. Decode, execute, encode, reply or dead-letter.

`Pipeline.handle(message)` takes one `Inbound` value and publishes what it owes the
sender through a `Publisher`: the reply on the sender's reply topic, a dead letter
when there is no reply address, and the call's spans on `{reply}/trace` when asked.
It never raises: whatever fails while building an answer still answers `internal`
with the call id (or dead-letters), and is counted. It returns the reply the broker
did not acknowledge, if any: the worker then leaves the request unacknowledged. No
broker is involved here, so every case is testable in-process with a publisher that
collects into a list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Self

from opentelemetry import trace

from toolbus.calls.answer import Answerer
from toolbus.calls.call import Call, ReplyAddress
from toolbus.calls.execute import Executor
from toolbus.calls.inflight import Slots
from toolbus.calls.quotas import Quotas
from toolbus.calls.replies import INTERNAL, internal_reply
from toolbus.calls.rounds import Rounds, RoundsSettings
from toolbus.calls.running import ProgressSink, RunningCalls, StatusSink
from toolbus.calls.tasks import Tasks
from toolbus.dedup import Once
from toolbus.dedup.tasks import TaskBoundExceeded, TaskStore
from toolbus.dedup.tokens import MemoryTokens, TokenStore
from toolbus.doors.envelope.cancel import hear_cancel
from toolbus.doors.envelope.decode import MAX_CALLS, Calls, Rejected, decode
from toolbus.doors.envelope.encode import (
    calls_failure,
    calls_reply,
    outbound_reply,
    reply_for_rejected,
)
from toolbus.doors.envelope.outbox import Outbox
from toolbus.doors.envelope.progress import ProgressStream
from toolbus.doors.envelope.tasks_get import TaskDoor, refusal
from toolbus.doors.envelope.together import run_together
from toolbus.observability.export import COLLECTOR, TraceCollector
from toolbus.observability.metrics import Metrics
from toolbus.observability.propagation import carrying_baggage, extract_context
from toolbus.observability.sampling import call_context
from toolbus.observability.spans import (
    default_tracer,
    mark_failed,
    messaging_attributes,
    records_nothing,
)
from toolbus.wire.contracts import CallsReply, Reply
from toolbus.wire.errors import RateLimited, ToolbusError
from toolbus.wire.messages import Inbound, Publisher, Unconfirmed
from toolbus.wire.topics import Topics
from toolbus.wire.untrusted import shown

log = logging.getLogger("toolbus.pipeline")


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
        slots: the worker's message slots; a message of many calls borrows the free ones
            to run them at once (none: one after another).
        max_calls: the most calls one message may carry.
        progress_rate_per_s: the most progress updates per second per call (0: no limit).
        task_store, task_ttl_s: where calls run as tasks are kept, and how long.
        rounds: how calls that ask their callers are kept (calls/rounds.py).
        token_store: the approvals' and continuations' tokens (default: in memory).
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
        slots: Slots | None = None,
        max_calls: int = MAX_CALLS,
        progress_rate_per_s: float = 10.0,
        task_store: TaskStore | None = None,
        task_ttl_s: float = 3600.0,
        rounds: RoundsSettings | None = None,
        token_store: TokenStore | None = None,
    ) -> None:
        self.executor = executor
        self._once = once
        self.topics = topics
        self._publisher = publisher
        self._worker_id = worker_id
        self._max_payload_bytes = max_payload_bytes
        self._publish_traces = publish_traces
        self._tracer = tracer or default_tracer()
        self._collector = collector or COLLECTOR
        self._metrics = metrics or executor.metrics
        self._outbox = Outbox(
            publisher,
            tracer=self._tracer,
            collector=self._collector,
            metrics=self._metrics,
            worker_id=worker_id,
            dead_topic=topics.dead,
            dead_letter_max_bytes=dead_letter_max_bytes,
        )
        self._reply, self._dead = self._outbox.reply, self._outbox.dead
        running = RunningCalls()
        self.token_store = token_store or MemoryTokens(worker_id)
        rounds = replace(rounds or RoundsSettings(), tokens=self.token_store)
        self.rounds = Rounds.of(rounds, running, worker_id)
        self._answerer = Answerer(
            executor,
            self._metrics,
            require_caller=topics.require_caller,
            once=once,
            quotas=quotas if quotas is not None else Quotas({}),
            running=running,
            rounds=self.rounds,
            tokens=self.token_store,
        )
        self._slots = slots if slots is not None else Slots(0)
        self._max_calls = max_calls
        self._progress_rate_per_s = progress_rate_per_s
        self.running = self._answerer.running  # what a cancel finds (calls/running.py)
        self._task_door = TaskDoor(topics, publisher, self._reply, self._dead)
        push = self._task_door.push
        self.tasks = (
            None
            if task_store is None
            else Tasks(task_store, push, ttl_s=task_ttl_s, tracer=self._tracer)
        )

    async def __aenter__(self) -> Self:
        """Open what the pipeline keeps across messages (the dedup store)."""
        if self._once is not None:
            await self._once.store.__aenter__()
        await self.token_store.__aenter__()
        if self.tasks is not None:
            await self.tasks.store.__aenter__()
            self.tasks.sweeping()
        await self.rounds.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.rounds.__aexit__(*exc)
        if self.tasks is not None:
            await self.tasks.drain(0.0)  # ended failed already unless `drain_tasks` ran
            await self.tasks.store.__aexit__(*exc)
        await self.token_store.__aexit__(*exc)
        if self._once is not None:
            await self._once.store.__aexit__(*exc)

    def tasks_in_flight(self) -> int:
        return 0 if self.tasks is None else self.tasks.in_flight()

    async def drain_tasks(self, deadline: float) -> None:
        """The worker stops: tasks not done by `deadline` (loop time) end failed in doubt."""
        if self.tasks is not None:
            within_s = deadline - asyncio.get_running_loop().time()
            await self.tasks.drain(max(0.0, within_s))

    def stopping(self) -> None:
        """From now on a call cancelled mid-way answers `unavailable` (the worker stops)."""
        self._answerer.stopping()

    async def cancel(self, message: Inbound) -> bool:
        """A cancel message: True when the call it names runs here (`hear_cancel`)."""
        return await hear_cancel(message, self.topics, self._answerer.cancel)

    async def handle(self, message: Inbound) -> Unconfirmed | None:
        """Answer one message: a reply, a dead letter, or (last resort) `internal`.

        Returns the reply if the broker did not acknowledge it (None: answered). A dead
        letter or a published trace given up on is only logged: nobody waits for those.
        """
        decoded: Call | Calls | Rejected | None = None
        answered = False
        unconfirmed: Unconfirmed | None = None
        try:
            is_get, topic_caller = self.topics.task_caller(message.topic)
            if is_get:
                answered = True  # a refusal to answer is logged, never `internal`
                await self._task_door.get(message, topic_caller, self.tasks)
                return None
            decoded = decode(message, self.topics, self._max_payload_bytes, self._max_calls)
            context = extract_context(message.user_properties, decoded.trace_fields)
            if context is None and records_nothing(self._tracer):
                # No SDK and no caller's trace to pass on: no span at all, not even a no-op
                # one (three of them cost a fifth of a local call).
                unconfirmed = await self._dispatch(message, decoded)
                answered = True
                return unconfirmed
            traced = self._trace_wanted(decoded)
            with (
                carrying_baggage(context),
                self._tracer.start_as_current_span(
                    f"process {shown(message.topic)}",
                    # Marked as a call's: its caller's sampled flag records for the copy
                    # it asks for at most, never for the exporter (`sampling`).
                    context=call_context(context, copy_wanted=traced),
                    kind=trace.SpanKind.CONSUMER,
                    attributes=messaging_attributes(
                        "process",
                        shown(message.topic),
                        decoded.id,
                        self._worker_id,
                        **{"messaging.message.body.size": len(message.payload)},
                    ),
                ) as span,
            ):
                if traced:
                    self._collector.watch(span.get_span_context().trace_id)
                if isinstance(decoded, Rejected):
                    mark_failed(span, decoded.error.code.value)
                unconfirmed = await self._dispatch(message, decoded)
                answered = True
            if traced and not isinstance(decoded, Rejected) and decoded.reply is not None:
                await self._outbox.trace(decoded.id, decoded.reply, span)
        except Exception:
            log.exception("failed handling a message on %s", shown(message.topic))
            # After the answer only the trace could fail: the caller has heard already.
            self._metrics.internal_error("trace" if answered else "handle")
            if not answered:
                unconfirmed = await self._last_resort(message, decoded)
        return unconfirmed

    async def _dispatch(
        self, message: Inbound, decoded: Call | Calls | Rejected
    ) -> Unconfirmed | None:
        if isinstance(decoded, Rejected):
            return await self._reject(message, decoded)
        if isinstance(decoded, Calls):
            return await self._calls(message, decoded)
        return await self._call(message, decoded)

    def _trace_wanted(self, decoded: Call | Calls | Rejected) -> bool:
        return (
            not isinstance(decoded, Rejected)
            and decoded.reply is not None
            and (decoded.publish_trace or self._publish_traces)
        )

    async def _reject(self, message: Inbound, rejected: Rejected) -> Unconfirmed | None:
        log.warning(
            "rejected message",
            extra={
                "topic": shown(message.topic),
                "code": rejected.error.code.value,
                "error": rejected.error.message,
            },
        )
        if rejected.reply is not None:
            return await self._reply(rejected.reply, reply_for_rejected(rejected))
        await self._dead(message, rejected.error.body(), rejected.id)
        return None

    async def _call(self, message: Inbound, call: Call) -> Unconfirmed | None:
        """One call: its reply, or its dead letter when it failed and has no address; as
        a task, `working` now and the final reply pushed when it ends (calls/tasks.py)."""
        as_task = call.task or self.executor.runs_as_task(call)
        if as_task and (address := call.reply) is not None and self.tasks is not None:
            # Its record is its caller's: `call/{caller}/{tool}` names it (a mismatch is
            # the answerer's to refuse, in the task's end).
            with contextlib.suppress(ToolbusError):
                call = self.executor.locate(call)
            call = replace(call, wants_input=False)  # nobody waits on a reply to answer
            try:
                await self.tasks.start(call, lambda status: self._answer(call, address, status))
            except TaskBoundExceeded:
                refused = RateLimited("the caller's tasks fill its bound", limit="task_bytes")
                return await self._reply(address, refusal(call.id, refused))
            return None
        reply = await self._answer(call, call.reply)
        if call.reply is None:  # a failed call's dead letter (a replay has had one)
            if reply.error is not None and not reply.replayed:
                await self._dead(message, reply.error, call.id)
            return None
        return await self._answer_with(message, call, call.reply, lambda: reply)

    async def _calls(self, message: Inbound, calls: Calls) -> Unconfirmed | None:
        """A message's calls, run together; one reply holds every answer, in order."""
        room = self._answerer.room(calls.calls[0].caller)
        replies = await run_together(
            calls.calls,
            lambda call: self._answer(call, calls.reply),
            self._slots,
            self._answerer.is_stopping,
            max_lanes=room,
        )
        if calls.reply is None:
            error = calls_failure(calls, replies)
            if error is not None:
                await self._dead(message, error, calls.id)
            return None
        return await self._answer_with(
            message,
            calls,
            calls.reply,
            lambda: calls_reply(calls, replies, message.received_at),
            # One call's reply that cannot be encoded fails that call alone:
            instead=lambda: calls_reply(calls, replies, message.received_at, checked=True),
        )

    async def _answer(
        self, call: Call, address: ReplyAddress | None, status: StatusSink | None = None
    ) -> Reply:
        """The call's reply; with its progress, when asked, published to `address` under
        the call's own id, all of it before the reply (the stream closes first). `status`:
        a task's status pushes (calls/tasks.py), whose final push follows the progress."""
        if not call.progress or address is None:
            return await self._answerer.answer(call, None, status)
        stream = ProgressStream(
            self._publisher, address, call.id, rate_per_s=self._progress_rate_per_s
        )
        sink: ProgressSink = stream
        try:
            return await self._answerer.answer(call, sink, status)
        finally:
            await stream.close()

    async def _answer_with(
        self,
        message: Inbound,
        decoded: Call | Calls,
        address: ReplyAddress,
        build: Callable[[], Reply | CallsReply],
        *,
        instead: Callable[[], CallsReply] | None = None,
    ) -> Unconfirmed | None:
        """Build and publish the reply; one that cannot be built or encoded (a tool's
        result the reply model rejects, say) still answers: `instead`, else `internal`."""
        try:
            return await self._reply(address, self._noted(decoded, build()))
        except Exception:
            log.exception("could not encode the reply to %s", decoded.id)
            self._metrics.internal_error("encode")
            if instead is not None:
                return await self._answer_with(message, decoded, address, instead)
            return await self._last_resort(message, decoded)

    def _noted(self, decoded: Call | Calls, reply: Reply | CallsReply) -> Reply | CallsReply:
        """The reply to a request that asked for its spans, when none will follow: why
        (the message's span, current here, does not record), not silence."""
        if not self._trace_wanted(decoded) or trace.get_current_span().is_recording():
            return reply
        reason = "not_recording" if records_nothing(self._tracer) else "not_sampled"
        return reply.model_copy(update={"trace_unavailable": reason})

    async def _last_resort(
        self, message: Inbound, decoded: Call | Calls | Rejected | None
    ) -> Unconfirmed | None:
        """`internal`, with the call id when known, to the reply address or the dead letters.

        Through the usual reply path when it works (trace id, PRODUCER span, 3.1.1
        traceparent), and as a bare publish when even that fails.
        """
        error = INTERNAL
        mark_failed(trace.get_current_span(), error.code.value)  # a no-op outside a span
        address = decoded.reply if decoded is not None else None
        ident = decoded.id if decoded is not None else None
        reply = internal_reply(ident or "", decoded.id_generated if decoded else False)
        try:
            if address is None or ident is None:
                await self._dead(message, error, ident)
                return None
            try:
                return await self._reply(address, reply)
            except Exception:
                log.exception("could not send the internal reply to %s normally", ident)
                return await self._publisher.publish(outbound_reply(address, reply))
        except Exception:
            log.exception("could not answer a message on %s at all", shown(message.topic))
        return None
