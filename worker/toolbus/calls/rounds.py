"""Rounds: a call that asks its caller something, answered over several requests.

A tool may need what only its caller has (an MCP server's elicitation or sampling). A
caller that said `input: true` gets the questions as its request's reply
(`input_required`, with a continuation token) and answers them with a new request
(`continuation`, `input_responses`), whose reply is the call's next round: its final
reply, or the next questions. Servers ask in one of two ways:

- held (MCP before 2026-07-28): the server asks on its open session while its call
  runs (`CallContext.ask`). The call goes on waiting here, on the worker whose session
  holds it, its deadline paused; the continuation's answers resume it, and the
  continuing request waits for its next round. Past `input_timeout_s`: declined.
- stateless (2026-07-28): the server's result is the questions and its own state (the
  backend raises `InputRequired` with `state`). The call ends; the token's record keeps
  what it takes to call again (tool, arguments, the server's state), and any worker
  resumes it (`Resume`).

A token is single-use, bound to its caller, expires (dedup/tokens.py). A held call that
ends while no request waits on it leaves its final reply on the token for a late one.
What toolbus itself cannot do for a question (the caller's `input_max_open` reached, the
token store down) is an error to the asking tool (`input_unrelayed`), never a `decline`
in the caller's name: a decline is the person's answer, and a tool may act on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from toolbus.calls.asked import Asked, asked_error, unrelayed
from toolbus.calls.kept import Kept
from toolbus.calls.preparation import Outcome
from toolbus.calls.relay import Relay
from toolbus.calls.replies import reply_for
from toolbus.calls.running import ProgressSink, RunningCall, RunningCalls
from toolbus.dedup.tokens import (
    TOKEN_CALLER_MAX_BYTES,
    MemoryTokens,
    TokenBoundExceeded,
    TokenRecord,
    TokenStore,
    account_of,
    new_token,
)
from toolbus.tools.context import Answers
from toolbus.wire.asking import InputRequest
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import (
    Cancelled,
    InputRequired,
    RateLimited,
    ReplyNotKept,
    ToolbusError,
    Unavailable,
)

log = logging.getLogger("toolbus.rounds")

MAX_ENDING_CHARS = 64 << 10  # a held call's end kept whole (the dedup reply bound's default)
HELD = "held"
STATELESS = "stateless"


@dataclass(frozen=True, slots=True)
class RoundsSettings:
    """How a worker keeps its rounds: its token store (None: this worker's memory), how
    long a question waits (`input_timeout_s`), how many of one caller's held calls may
    wait at once (`input_max_open`), the pool's relay (None: alone), and the bytes one
    caller's rounds may keep in this worker's memory (`token_caller_max_bytes`)."""

    tokens: TokenStore | None = None
    input_timeout_s: float = 120.0
    max_open: int = 8
    relay: Relay | None = None
    caller_max_bytes: int = TOKEN_CALLER_MAX_BYTES


class Held:
    """One held call: its run (a task that outlives the request that started it), the
    request waiting on its next round, and its open question."""

    def __init__(
        self, home: RunningCall, run: asyncio.Task[Outcome], tool: str, holder: str
    ) -> None:
        self.home = home
        self.run = run
        self.tool = tool
        self.holder = holder
        self.round: asyncio.Future[Asked] | None = None  # a request waits on it
        self.answers: asyncio.Future[Answers | None] | None = None  # the open question's
        self.token: str | None = None  # the open question's
        self.last_token: str | None = None  # the latest question's: where an unheard end goes
        self.origin = home.key  # the dedup key of the request the next question answers
        self.keys: list[str] = []  # its requests' keys: a cancel naming any finds it
        self.lock = asyncio.Lock()  # one question at a time


class Rounds:
    """This worker's held calls, and the tokens every worker shares.

    Args:
        tokens: where continuations live (memory, or Redis for a pool).
        input_timeout_s: how long a question waits for its caller.
        running: the running calls a cancel finds: a held call stays there while it waits.
        relay: the pool's way to a held call's worker (calls/routing.py); None: alone.
        max_open: how many of one caller's held calls may wait here at once
            (`input_max_open`): each keeps its server's request, and slot, open.
        caller_max_bytes: the bytes one caller's kept ends and origins may take here.
    """

    def __init__(
        self,
        tokens: TokenStore,
        *,
        input_timeout_s: float,
        running: RunningCalls,
        relay: Relay | None = None,
        max_open: int = 8,
        caller_max_bytes: int = TOKEN_CALLER_MAX_BYTES,
    ) -> None:
        self.tokens = tokens
        self.relay = relay
        self._max_open = max_open
        self.timeout_s = input_timeout_s
        self._running = running
        self._held: dict[str, Held] = {}
        self._unheard: set[asyncio.Task[bool]] = set()
        # A stateless call's open token by the key of the request it answered (what a
        # cancel names), until it expires: kept here, by the worker that made it.
        self._origins = Kept(input_timeout_s, caller_max_bytes)
        # A held call's end by its last token, here too for `input_timeout_s`: a
        # continuation that takes the token before the store has the end still gets it.
        # "" for an end too large to keep: it ended, its reply was not kept.
        self._endings = Kept(input_timeout_s, caller_max_bytes)

    @classmethod
    def of(cls, settings: RoundsSettings, running: RunningCalls, worker_id: str) -> Rounds:
        tokens = settings.tokens if settings.tokens is not None else MemoryTokens(worker_id)
        return cls(
            tokens,
            input_timeout_s=settings.input_timeout_s,
            running=running,
            relay=settings.relay,
            max_open=settings.max_open,
            caller_max_bytes=settings.caller_max_bytes,
        )

    def held(self, token: str) -> Held | None:
        return self._held.get(token)

    def _open(self, holder: str) -> int:
        account = account_of(holder)
        return sum(account_of(held.holder) == account for held in self._held.values())

    def __len__(self) -> int:
        return len(self._held)

    async def first(
        self, home: RunningCall, run: Coroutine[Any, Any, Outcome], tool: str, holder: str
    ) -> Outcome | Asked:
        """Run a call whose caller can answer: its outcome, or its first questions."""
        task = asyncio.create_task(run, name=f"held-{home.ident}")
        held = Held(home, task, tool, holder)
        home.asker = partial(self._ask, held)
        # Found by each of its requests' keys until it ends (a cancel may name any).
        self._found_by(held, home.key)
        task.add_done_callback(partial(self._ended, held))
        return await self._next(held, lambda: None)

    async def resume(
        self,
        held: Held,
        answers: Answers,
        key: str | None,
        sink: ProgressSink | None,
        deadline_s: float,
    ) -> Outcome | Asked | None:
        """The answers to `held`'s open question; the call's next round (None: the
        question is not open any more: it timed out, or the call ended)."""
        waiting = held.answers
        if waiting is None or waiting.done() or held.run.done():
            return None

        def answer() -> None:
            _event(held, "toolbus.input_answered", len(answers))
            held.origin = key
            held.home.sink = sink
            held.home.retime(deadline_s)  # the continuing request's deadline, from now
            waiting.set_result(answers)

        self._found_by(held, key)
        return await self._next(held, answer)

    def _found_by(self, held: Held, key: str | None) -> None:
        if key is not None and key not in held.keys:
            held.keys.append(key)
            self._running.add(key, held.home)

    async def _next(self, held: Held, before: Callable[[], None]) -> Outcome | Asked:
        """The next round of `held`: its outcome or its next questions, whichever first.
        A request that stops waiting (a stopping worker) stops the call."""
        held.round = asyncio.get_running_loop().create_future()
        before()
        waits: set[asyncio.Future[Any]] = {held.run, held.round}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            held.run.cancel()
            raise
        if held.round.done():
            asked = held.round.result()
            held.round = None
            held.home.sink = None  # the request that asked for progress has its answer
            return asked
        held.round.cancel()
        held.round = None
        return held.run.result()

    async def _ask(self, held: Held, questions: dict[str, InputRequest]) -> Answers | None:
        """A question of `held`'s tool (its server waits): the caller's answers, or None
        (declined: no request can carry it, or no answer came in time). What keeps
        toolbus itself from asking is raised (`unrelayed`): no answer in the
        caller's name."""
        async with held.lock:
            round_ = held.round
            if held.run.done() or round_ is None or round_.done():
                return None  # no request can carry it (the call is ending)
            if self._open(held.holder) >= self._max_open:
                log.warning("%s: the caller has input_max_open questions open", held.tool)
                raise unrelayed(RateLimited("input_max_open reached", limit="input_max_open"))
            token = new_token("continuation")
            body = {"kind": HELD, "tool": held.tool, "origin": held.origin}
            try:
                await self._keep(token, held.holder, body, questions)
            except ToolbusError as refused:
                log.warning("a question of %s was not put: %s", held.tool, refused.code.value)
                raise unrelayed(refused) from None
            loop = asyncio.get_running_loop()
            held.answers, held.token = loop.create_future(), token
            held.last_token = token
            self._held[token] = held
            held.home.retime(None)  # the caller is thinking: no deadline runs meanwhile
            round_.set_result(Asked(questions, token, self.timeout_s))
            _event(held, "toolbus.input_required", len(questions))
            log.info("%s asks its caller (%d questions)", held.tool, len(questions))
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await held.answers
            except TimeoutError:  # declined, and the tool's end is bounded again
                log.info("%s: no answer within input_timeout_s; declined", held.tool)
                held.home.retime(self.timeout_s)
                return None
            finally:
                self._held.pop(token, None)
                held.answers = held.token = None

    async def suspend(
        self,
        tool: str,
        arguments: dict[str, Any],
        holder: str,
        asked: InputRequired,
        origin: str | None,
    ) -> InputRequired:
        """A stateless server's questions: the token that resumes the call anywhere,
        and the round's answer (`input_required`). `origin`: the asking request's key."""
        token = new_token("continuation")
        body = {
            "kind": STATELESS,
            "tool": tool,
            "arguments": arguments,
            "state": asked.state,
            "origin": origin,
        }
        await self._keep(token, holder, body, asked.questions)
        if origin is not None:
            self._origins.put(origin, token, account_of(holder))
        return asked_error(asked.questions, token, self.timeout_s)

    def taken(self, origin: str | None) -> None:
        """A stateless call's token was taken: a cancel naming its first request finds
        nothing here any more (the resumed call is found by its own request's key)."""
        if origin is not None:
            self._origins.pop(origin)

    def ending(self, token: str) -> Reply | None:
        """The end of the held call `token` continues, if it ended here unheard (its
        reply, or `reply_not_kept` for one too large to keep)."""
        kept = self._endings.get(token)
        if kept is None:
            return None
        if not kept:
            error = ReplyNotKept("the call has ended; its reply was not kept", ended=True)
            return Reply(id="", ok=False, error=error.body(), duration_ms=0.0)
        return Reply.model_validate_json(kept)

    async def cancel(self, key: str) -> bool:
        """The caller cancels the call whose questions the request `key` got, kept on
        a token (a stateless server's): the token ends `cancelled`, and its continuation
        gets that. True when one was open and so ended. (A held call is cancelled as it
        runs; a stateless call resumed is found by its continuation's key.)"""
        token = self._origins.pop(key)
        if token is None:
            return False
        ended = Cancelled(
            "the caller cancelled the call while it waited for its answers",
            started=True,
            in_doubt=True,
            cause="caller",
        )
        reply = Reply(id="", ok=False, error=ended.body(), duration_ms=0.0)
        return await self._tell(token, reply.model_dump_json(exclude_none=True))

    async def _keep(
        self, token: str, holder: str, body: dict[str, Any], questions: dict[str, InputRequest]
    ) -> None:
        """The token's record; `rate_limited` over the caller's bound, `unavailable` when
        the store fails."""
        kept = {**body, "questions": {key: q.method for key, q in questions.items()}}
        record = TokenRecord(
            token=token,
            kind="continuation",
            holder=holder,
            owner=self.tokens.owner,
            body=json.dumps(kept, separators=(",", ":")),
            expires_at=time.time() + self.timeout_s,
        )
        try:
            await self.tokens.put(record, self.timeout_s)
        except TokenBoundExceeded:
            raise RateLimited(
                "the caller's open questions fill its bound", limit="token_bytes"
            ) from None
        except Exception as exc:
            log.warning("token store failed keeping a continuation: %s", exc)
            raise Unavailable("the token store is unreachable", store=True) from None

    def _ended(self, held: Held, task: asyncio.Task[Outcome]) -> None:
        """`held`'s run ended: no longer found by its key; an open question is closed;
        and with no request waiting, its reply is kept on its last token."""
        for key in held.keys:
            self._running.discard(key, held.home)
        if held.answers is not None and not held.answers.done():
            held.answers.set_result(None)
        if held.round is not None or task.cancelled():
            return  # a request waits: it answers (or the worker stopped it)
        last = held.last_token
        if last is None:
            return
        # Its id is the continuing request's, set when one comes for it.
        reply = reply_for("", False, task.result()).model_dump_json(exclude_none=True)
        # A larger one is kept in the store, if its bound allows; here only that it ended.
        kept = reply if len(reply) <= MAX_ENDING_CHARS else ""
        if not self._endings.put(last, kept, account_of(held.holder)):
            self._endings.put(last, "", account_of(held.holder))
        told = asyncio.ensure_future(self._tell(last, reply))
        self._unheard.add(told)
        told.add_done_callback(self._unheard.discard)

    async def _tell(self, token: str, reply: str) -> bool:
        """`reply` kept on the open token; False when it was not open (or unreachable)."""
        try:
            return await self.tokens.end(token, reply)
        except Exception as exc:
            log.warning("token store failed keeping a held call's end: %s", exc)
            return False

    async def __aenter__(self) -> Rounds:
        """The relay opened (the token store is its owner's, the pipeline's, to open)."""
        if self.relay is not None:
            await self.relay.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
        if self.relay is not None:
            await self.relay.__aexit__(*exc)

    async def close(self) -> None:
        """The worker stops: every held call is stopped (its end kept on its token)."""
        for held in list(self._held.values()):
            held.run.cancel()
        if self._unheard:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.gather(*self._unheard, return_exceptions=True)


def _event(held: Held, name: str, count: int) -> None:
    """A round on the call's span (how many questions or answers, never what they say)."""
    if held.home.span is not None:
        held.home.span.add_event(name, {"toolbus.input.count": count})
