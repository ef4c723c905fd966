"""Continuing: a call over its rounds, from the answerer's side (calls/rounds.py holds them).

`run` runs a prepared call whose caller can answer its tool's questions: its outcome, or
its questions as the round's answer (`input_required`, recorded as that request's reply,
so a copy of the request gets the same token). `answer` answers a continuation: the
token taken once for the request (a copy of it takes it again), then the call resumed:
a held call's open question answered (claimed under the continuation's own id: a copy
gets its reply, never a second delivery of the answers), or a stateless server's call
run again as a new call of the same tool and arguments with the answers (`Resume`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from opentelemetry import trace

from toolbus.calls.asked import Asked
from toolbus.calls.call import Call
from toolbus.calls.execute import Executor
from toolbus.calls.preparation import Outcome, Prepared
from toolbus.calls.replies import replayed
from toolbus.calls.rounds import STATELESS, Rounds
from toolbus.calls.routing import Routing
from toolbus.calls.running import ProgressSink, RunningCall, StatusSink
from toolbus.dedup import RUN_UNCLAIMED, Once, Verdict, fingerprint
from toolbus.dedup.tokens import ENDED, TokenRecord
from toolbus.dedup.tokens import holder_of as tokens_holder
from toolbus.tools.context import Answers, Resume
from toolbus.wire.asking import answer_errors
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import (
    BadRequest,
    ContinuationInvalid,
    InputRequired,
    ReplyNotKept,
    ToolbusError,
    Unavailable,
)

log = logging.getLogger("toolbus.pipeline")


class Continuing:
    """The answerer's rounds: what it runs for a caller that can answer, and how it
    answers a continuation. `admitted`, `closed`, `concluded`, `refuse`: the answerer's own steps
    (a stateless call's resumption is admitted as any call is)."""

    def __init__(  # noqa: PLR0917 -- the answerer's own steps, handed over once
        self,
        rounds: Rounds,
        once: Once | None,
        executor: Executor,
        admitted: Callable[[Call, ProgressSink | None, StatusSink | None], Awaitable[Reply]],
        closed: Callable[[Verdict, Outcome, Reply], Awaitable[None]],
        concluded: Callable[[Call, Verdict, Outcome], Awaitable[Reply]],
        refuse: Callable[[Call, ToolbusError], Reply],
    ) -> None:
        self._rounds = self.rounds = rounds
        self._routing = None if rounds.relay is None else Routing(rounds, rounds.relay)
        self._once = once
        self._executor = executor
        self._admitted = admitted
        self._closed = closed
        self._concluded = concluded
        self._refuse = refuse

    async def run(self, call: Call, prepared: Prepared, home: RunningCall) -> Outcome:
        """The prepared call run; a caller that can answer its tool's questions may get
        them instead (calls/rounds.py): held on this worker, or kept on a token."""
        rounds, holder = self._rounds, holder_of(call)
        runs = prepared.tool is not None and prepared.outcome.error is None
        if holder is None or not call.wants_input or not runs:
            return await self._executor.run(prepared)
        tool = prepared.outcome.tool or call.tool
        ended = await rounds.first(home, self._executor.run(prepared), tool, holder)
        if isinstance(ended, Asked):
            return asking(prepared.outcome, ended.error(), prepared.elapsed_s())
        return await self._suspended(ended, prepared.arguments, holder, home.key)

    async def _suspended(
        self, outcome: Outcome, arguments: dict[str, Any], holder: str, origin: str | None
    ) -> Outcome:
        """A stateless server's questions: kept on a token any worker resumes."""
        asked = outcome.error
        if self._rounds is None or not isinstance(asked, InputRequired) or not asked.questions:
            return outcome
        try:
            outcome.error = await self._rounds.suspend(
                outcome.tool or "", arguments, holder, asked, origin
            )
        except ToolbusError as refused:
            outcome.error = refused
        return outcome

    async def answer(
        self, call: Call, sink: ProgressSink | None, status: StatusSink | None
    ) -> Reply:
        """A continuation: the call its token names, resumed with the caller's answers.
        Taken once (a copy of this request takes it again); a stateless server's call
        runs again here as a new call of the same tool and arguments."""
        try:
            record, body = await self._take(call)
        except ToolbusError as refused:
            return self._refuse(call, refused)
        answers = call.input_responses or {}
        if record.state == ENDED:  # the call ended while nobody waited: its answer
            return ended_reply(call, record.reply)
        if body["kind"] == STATELESS:
            self._rounds.taken(body.get("origin"))  # a cancel now finds the resumed call
            resumed = replace(
                call,
                tool=body["tool"],
                arguments=body["arguments"],
                resume=Resume(answers, body.get("state"), body.get("questions")),
                continuation=None,
                input_responses=None,
                topic_path=False,
            )
            return await self._admitted(resumed, sink, status)
        return await self._resume(call, record, body["tool"], answers, sink)

    async def _take(self, call: Call) -> tuple[TokenRecord, dict[str, Any]]:
        """The token `call` continues, taken for it, and what its record keeps (parsed
        once); why not, raised."""
        token, holder = call.continuation, holder_of(call)
        key = Once.key(call.caller, call.reply_topic, call.id)
        if token is None or holder is None or key is None:
            raise ContinuationInvalid("no such call", reason="unknown")
        tokens = self._rounds.tokens
        try:
            record = await tokens.get(token)
            other = record is not None and record.kind != "continuation"  # an approval's
            body = {} if record is None else json.loads(record.body)
            # Answers that fit no question are refused before the take: the token stays
            # for the corrected request (checked only for the caller the token is for).
            bad = [] if record is None or record.holder != holder or other else _misfits(call, body)
            stop = body.get("origin") == key or other or bool(bad)
            taken = None if stop else await tokens.take(token, holder, key, None)
        except Exception as exc:
            log.warning("token store failed for %s: %s", call.id, exc)
            raise Unavailable("the token store is unreachable", store=True) from None
        if other:  # not taken: it is not this kind's to use
            raise ContinuationInvalid("the continuation continues no call", reason="unknown")
        if bad:
            raise BadRequest(
                "input_responses do not answer the questions asked",
                reason="bad_input_responses",
                errors=bad,
            )
        if taken is None:  # its first request's id: a dedup record holds that one's reply
            raise BadRequest("a continuation takes an id of its own", reason="id_reused")
        if taken.record is None:
            raise ContinuationInvalid("the continuation continues no call", reason=taken.refused)
        return taken.record, body

    async def _resume(
        self,
        call: Call,
        record: TokenRecord,
        tool: str,
        answers: Answers,
        sink: ProgressSink | None,
    ) -> Reply:
        """A held call's next round, for the continuation `call`: claimed under its own
        id (a copy of it gets its reply, never a second delivery of the answers)."""
        assert self._rounds is not None
        verdict = RUN_UNCLAIMED
        key = Once.key(call.caller, call.reply_topic, call.id)
        if self._once is not None and key is not None and not call.id_generated:
            asks = fingerprint("continuation", {"token": call.continuation, "answers": answers})
            deadline_s = self._executor.request_deadline_s(call)
            try:
                verdict = await self._once.begin(key, asks, tool, deadline_s)
            except Exception as exc:
                log.warning("dedup store failed for %s: %s", call.id, exc)
                return self._refuse(call, Unavailable("the dedup store is unreachable", store=True))
            if verdict.reply is not None:
                return replayed(call, verdict.reply, [trace.get_current_span()])
            if verdict.error is not None:
                return self._refuse(call, verdict.error)
        started = time.perf_counter()
        ended = await self._next_round(record, answers, key, sink, call)
        if isinstance(ended, Reply):  # the holder's final reply, for this request
            reply = ended.model_copy(update={"id": call.id, "id_generated": call.id_generated})
            if verdict.key is not None:
                await self._closed(verdict, Outcome(invoked=True), reply)
            return reply
        if ended is None:
            outcome = Outcome(
                error=ContinuationInvalid("the question has expired", reason="expired")
            )
        elif isinstance(ended, Asked):
            outcome = asking(Outcome(tool=tool), ended.error(), time.perf_counter() - started)
        else:
            outcome = ended
        return await self._concluded(call, verdict, outcome)

    async def _next_round(
        self,
        record: TokenRecord,
        answers: Answers,
        key: str | None,
        sink: ProgressSink | None,
        call: Call,
    ) -> Outcome | Asked | Reply | None:
        """The held call's next round: here, or asked of the worker holding it."""
        deadline_s = self._executor.request_deadline_s(call)
        held = self._rounds.held(record.token)
        if held is not None:
            return await self._rounds.resume(held, answers, key, sink, deadline_s)
        if (ending := self._rounds.ending(record.token)) is not None:
            return ending  # it ended here unheard a moment ago
        if self._routing is not None and record.owner != self._rounds.tokens.owner:
            return await self._routing.resume(record.owner, record.token, answers, key, deadline_s)
        return None  # its question timed out here


def _misfits(call: Call, body: dict[str, Any]) -> list[dict[str, Any]]:
    """What in `call`'s answers fits none of the token's questions (`answer_errors`)."""
    return answer_errors(body.get("questions") or {}, call.input_responses or {})


def holder_of(call: Call) -> str | None:
    """Who may use a token a call's answer holds (`tokens.holder_of`, as approvals'); None:
    a call with neither caller nor reply topic, which no one could continue."""
    if not call.caller and not call.reply_topic:
        return None
    return tokens_holder(call.caller, call.reply_topic)


def asking(before: Outcome, error: ToolbusError, elapsed_s: float) -> Outcome:
    """A round that ends in questions: the tool was asked (its reply is recorded)."""
    return Outcome(
        tool=before.tool,
        error=error,
        normalized=before.normalized,
        duration_ms=elapsed_s * 1000,
        invoked=True,
    )


def ended_reply(call: Call, stored: str | None) -> Reply:
    """The answer a held call left on its token when it ended unheard."""
    if stored is None:
        error = ReplyNotKept("the call has ended; its reply was not kept", ended=True)
        return Reply(id=call.id, ok=False, error=error.body(), duration_ms=0.0)
    return Reply.model_validate_json(stored).model_copy(
        update={"id": call.id, "id_generated": call.id_generated}
    )
