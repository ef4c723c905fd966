"""Answer: one call's reply. Who calls, admission, a run at most once, the run itself.

`Answerer.answer(call)` finds the caller (`call/{a}/{b}` may name one), admits the call
against the caller's quotas, claims its id (a repeat gets the first run's reply, or
`in_doubt`), runs it through the executor and closes the claim before the reply leaves.
It never raises and publishes nothing: the pipeline sends one call's reply alone and a
message's many calls together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Protocol

from opentelemetry import trace

from toolbus.calls.call import Call
from toolbus.calls.continuing import Continuing
from toolbus.calls.execute import Executor, Outcome
from toolbus.calls.preparation import Prepared
from toolbus.calls.quotas import Quotas
from toolbus.calls.replies import internal_reply, replayed, reply_for_call
from toolbus.calls.rounds import Rounds
from toolbus.calls.running import ProgressSink, RunningCall, RunningCalls, StatusSink
from toolbus.dedup import RUN_UNCLAIMED, Once, Verdict, fingerprint
from toolbus.dedup.memory import closes_at_once
from toolbus.dedup.tokens import TokenStore
from toolbus.observability.metrics import Metrics
from toolbus.observability.spans import mark_failed
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import Cancelled, Forbidden, RateLimited, ToolbusError, Unavailable
from toolbus.wire.untrusted import shown

log = logging.getLogger("toolbus.pipeline")


class Answer(Protocol):
    """The engine's one entry point for a door: a call in, its reply out, never raising
    (`Answerer.answer`); `sink` takes the call's progress (None: its caller did not ask)."""

    def __call__(self, call: Call, sink: ProgressSink | None = None, /) -> Awaitable[Reply]: ...


CLOSE_GRACE_S = 2.0  # a stopping worker waits this long for a run's record, then answers


class Answerer:
    """Answers calls, concurrently; `stopping()` turns a cancelled run into `unavailable`.

    Args:
        executor: resolves, checks and runs calls; classifies every outcome.
        metrics: counts what could not be answered normally.
        require_caller: refuse calls that name no caller (`forbidden`).
        once: deduplication by request id; none without it.
        quotas: per-caller admission (`[callers.NAME]` rates and in-flight bounds).
        running: the calls running now, by dedup key (what a cancel finds).
        rounds: calls that ask their callers (None: every tool's questions are declined).
        tokens: where approvals (and continuations) are kept; no approval gate without.
    """

    def __init__(
        self,
        executor: Executor,
        metrics: Metrics,
        *,
        require_caller: bool,
        once: Once | None,
        quotas: Quotas,
        running: RunningCalls | None = None,
        rounds: Rounds | None = None,
        tokens: TokenStore | None = None,
    ) -> None:
        self._executor = executor
        self._metrics = metrics
        self._require_caller = require_caller
        self._once = once
        self._quotas = quotas
        self._tokens = tokens
        self.running = running if running is not None else RunningCalls()
        self._continuing = (
            None
            if rounds is None
            else Continuing(
                rounds, once, executor, self._admitted, self._closed, self._concluded, self._refused
            )
        )
        self._stopping = False
        # A store whose close never waits (`closes_at_once`: the in-process one) closes a
        # run before anything can cut it short: `_closed` need not shield it in a task of
        # its own (a task and a turn of the loop per call).
        self._closes_at_once = once is not None and closes_at_once(once.store)

    def stopping(self) -> None:
        """From now on a call cancelled mid-way answers `unavailable` (the worker stops)."""
        self._stopping = True

    def is_stopping(self) -> bool:
        return self._stopping

    async def cancel(self, key: str) -> bool:
        """The caller cancels the call `key` names: remembered first (a call that comes
        later, here or at another worker, is answered `cancelled` without running), then
        looked for here. The order makes it race-free: a call registers in `running`
        before it claims its key, and the claim sees the tombstone. True: it runs here."""
        if self._once is not None:
            try:
                await self._once.remember_cancel(key)
            except Exception as exc:  # a running call is still cancelled below
                log.warning("dedup store failed remembering a cancel: %s", exc)
        if self._continuing is not None and await self._continuing.rounds.cancel(key):
            return True  # its questions were open, kept on a token: it ends there
        return self.running.cancel(key, "caller") > 0

    def room(self, caller: str | None) -> int | None:
        """How many more of `caller`'s calls its quota lets run at once (None: any)."""
        return self._quotas.room(caller)

    async def answer(
        self, call: Call, sink: ProgressSink | None = None, status: StatusSink | None = None
    ) -> Reply:
        """One call's reply, never raising: refused, replayed, or run and classified.

        Nothing is published here: a message of many calls answers them all at once.
        `sink`: where the door sends the call's progress (None: the caller did not ask);
        `status`: where an upstream task's status goes (a call run as a toolbus task).
        """
        try:
            return await self._reply_to_call(call, sink, status)
        except Exception:
            log.exception("failed answering %s (%s)", call.id, shown(call.tool))
            self._metrics.internal_error("answer")
            return internal_reply(call.id, call.id_generated)

    async def _reply_to_call(
        self, call: Call, sink: ProgressSink | None, status: StatusSink | None = None
    ) -> Reply:
        if call.problem is not None:  # what the call itself got wrong (a provider shape's)
            return self._refused(call, call.problem)
        # The caller as quotas, dedup and access will see it (`call/{a}/{b}` may name one).
        try:
            call = self._executor.locate(call)
            if call.caller is None and self._require_caller:
                raise Forbidden("this worker answers only named callers", reason="caller_required")
        except ToolbusError as refused:
            return self._refused(call, refused)
        try:
            ticket = self._quotas.admit(call.caller)
        except RateLimited as error:
            # Logged at DEBUG only (a flood would flood the log); counted instead.
            log.debug("rate limited %s from %s: %s", call.id, shown(call.caller or "-"), error)
            self._metrics.rate_limited(str(error.details.get("limit")))
            return self._refused(call, error)
        with ticket:
            if call.continuation is not None and self._continuing is not None:
                return await self._continuing.answer(call, sink, status)
            return await self._admitted(call, sink, status)

    def _refused(self, call: Call, error: ToolbusError) -> Reply:
        """Answered at once, nothing claimed or run."""
        mark_failed(trace.get_current_span(), error.code.value)
        return reply_for_call(call, Outcome(tool=None, error=error))

    async def _admitted(
        self, call: Call, sink: ProgressSink | None, status: StatusSink | None = None
    ) -> Reply:
        """Prepared once, claimed with what was prepared, then run, replayed or refused.

        A stop cancels whatever this is waiting for (MCP servers starting, a repeat's
        running twin, the tool) and the call still gets `unavailable`. Cancelled before
        its claim came back, nothing is claimed that this call knows of. A claim the store
        made just before the cancel stays `started` under this stopping worker: once it is
        gone a repeat finds the run cut short (`in_doubt`, or a rerun for an idempotent
        tool), as for a run cut short. Releasing it instead could release another
        request's claim (the key's owner is unknown here) and run a call twice.
        """
        prepared: Prepared | None = None
        verdict = RUN_UNCLAIMED
        try:
            if call.list_tools:
                outcome = await self._executor.execute(call)
            else:
                prepared = self._executor.start(call)
                # Found by its key from before its claim to its reply: a cancel that comes
                # while the claim waits is not lost (the executor then does not start it).
                key = Once.key(call.caller, call.reply_topic, call.id)
                home = RunningCall(
                    key,
                    call.caller,
                    call.id,
                    call.deadline_at,
                    sink,
                    extend_on_progress=call.extend_on_progress,
                )
                home.status_sink, home.resume = status, call.resume
                with self.running.running(home):
                    prepared.running, home.span = home, prepared.span
                    await self._executor.ready(prepared)
                    verdict = await self._claim(call, prepared)
                    if verdict.reply is not None:  # a repeat of an answered request
                        return self._replayed(call, prepared, verdict.reply)
                    # Gated after the claim: a repeat of an approved call that ran is
                    # replayed above, whatever became of its token; a gated call leaves
                    # its id free (not invoked: `_close` releases the claim).
                    refused = verdict.error or await self._gate(call, prepared)
                    if refused is not None:
                        self._executor.refuse(prepared, refused)
                    outcome = await self._run(call, prepared, home)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._stopping or task is None:
                if prepared is not None and prepared.owned:
                    prepared.span.end()
                raise
            task.uncancel()  # the worker stops: this call still gets its answer
            # The claim stays open: a repeat finds this run cut short (in doubt).
            verdict = RUN_UNCLAIMED
            stopped = Unavailable("the worker shut down before the call finished")
            if prepared is None:
                outcome = Outcome(tool=call.tool, error=stopped)
            else:
                self._executor.refuse(prepared, stopped)
                outcome = self._executor.conclude(prepared)
        return await self._concluded(call, verdict, outcome)

    async def _concluded(self, call: Call, verdict: Verdict, outcome: Outcome) -> Reply:
        """`call`'s reply for `outcome`, its span failed as the reply is, its claim closed."""
        if outcome.error is not None:
            mark_failed(trace.get_current_span(), outcome.error.code.value)
        reply = reply_for_call(call, outcome)
        # Closed before the reply leaves: a crash in between replays it, never runs it twice.
        if verdict.key is not None:
            await self._closed(verdict, outcome, reply)
        return reply

    async def _run(self, call: Call, prepared: Prepared, home: RunningCall) -> Outcome:
        if self._continuing is None:
            return await self._executor.run(prepared)
        return await self._continuing.run(call, prepared, home)  # it may ask its caller

    async def _closed(self, verdict: Verdict, outcome: Outcome, reply: Reply) -> None:
        """`_close`, which a stop does not cut short: the tool has run, so its reply must
        still go out, and go out recorded. A stop meanwhile waits for the record, within
        `CLOSE_GRACE_S` (a store that hangs must not hold the stop), then answers."""
        if self._closes_at_once:
            await self._close(verdict, outcome, reply)  # it never suspends: nothing to cut
            return
        closing = asyncio.ensure_future(self._close(verdict, outcome, reply))
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._stopping or task is None:
                raise
            task.uncancel()  # the worker stops: the reply still leaves
            try:
                async with asyncio.timeout(CLOSE_GRACE_S):
                    await asyncio.shield(closing)
            except TimeoutError:
                log.warning("dedup store too slow closing %s while stopping", reply.id)

    async def _gate(self, call: Call, prepared: Prepared) -> ToolbusError | None:
        """The approval gate (calls/approvals.py): what a call a person must approve first
        gets instead of running; None when it runs. A stateless server's call resumed
        with its caller's answers (`Resume`) passed the gate in its first round: its
        tool and arguments come from its token, not from the continuing request."""
        approvals = self._executor.approvals
        if self._tokens is None or not approvals.any or call.resume is not None:
            return None
        refused = await approvals.gate(call, prepared, self._tokens)
        if isinstance(refused, RateLimited):
            self._metrics.rate_limited("token_bytes")
        return refused

    async def _claim(self, call: Call, prepared: Prepared) -> Verdict:
        """Deduplication by the request's own id (generated ids are never repeated) and
        what it asks for, as prepared: the same id asking for something else is no
        repeat. What is compared is what will run (`Prepared.asked`)."""
        if self._once is None or call.id_generated or call.list_tools:
            return RUN_UNCLAIMED
        # Past its deadline the call will not run, but its id may have: a finished run's
        # reply is replayed (it is true), a running twin is not waited for (0 s), and a
        # claim made meanwhile is released. Never "not run" for an id that ran.
        deadline_s = 0.0 if prepared.expired else self._executor.request_deadline_s(call)
        asked = prepared.asked()
        if asked is None:  # refused while preparing: nothing to claim, `run` says why
            return RUN_UNCLAIMED
        tool, arguments = asked
        key = Once.key(call.caller, call.reply_topic, call.id)
        if key is None:  # no caller, no reply topic: no client owns the id
            return RUN_UNCLAIMED
        # Beside a provider's id (reused turn after turn) only our ids make it a key: the
        # correlation data and `toolbus.id` a retry sends again and a new turn anew.
        provider = call.provider_id
        ours = bool(call.correlation) or call.message_id is not None
        asks = fingerprint(
            tool,
            arguments,
            call.correlation if provider else None,
            call.message_id if provider else None,
        )
        try:
            verdict = await self._once.begin(
                key,
                asks,
                tool,
                deadline_s,
                provider_id=provider,
                provider_only=provider and not ours,
                redelivered=call.redelivered,
                delivery=call.delivery,
            )
        except Exception as exc:  # the store is unreachable
            return self._unclaimed(call, prepared, exc)
        if prepared.expired and verdict.key is not None:  # ours, but it will not run
            await self._release(verdict, call.id)
            return RUN_UNCLAIMED
        return verdict

    def _unclaimed(self, call: Call, prepared: Prepared, exc: Exception) -> Verdict:
        """A call the store could not be asked about: refused `unavailable`, nothing run;
        or, where the operator chose availability (`dedup_unavailable = "run"`), run
        unrecorded (a repeat of it may run again), said and counted each time."""
        assert self._once is not None
        if prepared.expired:  # it was not going to run anyway: it says so
            log.warning("dedup store failed for %s: %s", call.id, exc)
            return RUN_UNCLAIMED
        if self._once.unreachable_runs:
            log.warning("dedup store failed for %s, run without dedup: %s", call.id, exc)
            self._metrics.ran_without_dedup()
            return RUN_UNCLAIMED
        log.warning("dedup store failed for %s: %s", call.id, exc)
        return Verdict(error=Unavailable("the dedup store is unreachable", store=True))

    async def _release(self, verdict: Verdict, ident: str) -> None:
        """The id free again: a claim this call made but will not run under."""
        assert self._once is not None
        try:
            await self._once.release(verdict)
        except Exception as exc:  # left as a run cut short is: its repeats find it so
            log.warning("dedup store failed releasing %s: %s", ident, exc)

    async def _close(self, verdict: Verdict, outcome: Outcome, reply: Reply) -> None:
        """A call that reached its tool is answered for good; one that did not (unknown
        tool, bad arguments, server down) leaves its id free to run again."""
        if self._once is None or verdict.key is None:
            return
        try:
            # A call cancelled before it started is answered for good too: "not run" must
            # stay true, so a copy of it (a redelivery, a retry) must not run it later.
            if outcome.invoked or isinstance(outcome.error, Cancelled):
                await self._once.finish(verdict, reply)
            else:
                await self._once.release(verdict)
        except Exception as exc:
            log.warning("dedup store failed closing %s: %s", reply.id, exc)

    @staticmethod
    def _replayed(call: Call, prepared: Prepared, stored: bytes) -> Reply:
        """The stored reply again. The tool does not run, but the call was prepared to be
        compared: its `execute_tool` span ends (the steps' spans, with `trace_steps`, are
        its children), and it and the message's span say the reply is a replay and fail
        as the stored reply did. No call line: the first run had it."""
        spans = [trace.get_current_span()]
        if prepared.owned:
            spans.append(prepared.span)
        reply = replayed(call, stored, spans)
        if prepared.owned:
            prepared.span.end()
        return reply
