"""Rounds: a call whose tool asks its caller, or that waits for a person's approval,
driven to its end by the caller's callbacks (`toolbus.Client.call(..., on_input=...)`).

A tool may ask (an MCP server's elicitation or sampling request): with `on_input` or
`on_sampling` the request says `input: true`, and a reply `input_required` is answered
with a new request, under a new id, holding the reply's `continuation` and an answer to
each of its `input_requests`; that request's reply is the next round. A call the caller's
profile gates gets `approval_required`: with `on_approval` the call is shown to it, and
re-sent with the token (under a new id) when it says yes. At most `max_rounds` requests
follow the first; each is one request as any other (its own deadline, its re-sends).

A question no callback answers is answered as MCP's clients do: an elicitation
`decline`; a sampling request is left unanswered (its key absent from `input_responses`),
which the worker answers its server with an error for, as for a caller that cannot
sample. `on_sampling` may return None to do the same. Whatever ends the rounds (a final
reply, an approval refused, a question left over after `max_rounds`) is the call's reply:
the client raises it as the class of its code, `details` holding the tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from toolbus.wire.asking import ELICITATION, SAMPLING
from toolbus.wire.contracts import CallsReply, ErrorCode, Reply
from toolbus.wire.errors import ToolbusError
from toolbus.wire.formats.incoming import Wanted, read
from toolbus.wire.formats.outgoing import Answered, conversation

MAX_ROUNDS = 10  # requests after the first, as the MCP SDK's input-required driver
ELICIT_ACTIONS = frozenset({"accept", "decline", "cancel"})

OnInput = Callable[[dict[str, Any]], Any]
"""An elicitation's `params` (form mode: `message`, `requestedSchema`; URL mode:
`message`, `url`, `elicitationId`) -> an `ElicitResult`: `{"action", "content"}`."""
OnSampling = Callable[[dict[str, Any]], Any]
"""`CreateMessageRequestParams` (`messages`, `maxTokens`, `systemPrompt`, ...) -> a
`CreateMessageResult` (`role`, `content`, `model`, `stopReason`), or None: declined."""
OnApproval = Callable[[dict[str, Any]], Any]
"""The call as it would run, `{"tool", "arguments"}` -> True to run it, False not to."""
Send = Callable[[str, dict[str, Any], str], Awaitable[Reply]]
"""Publish one request body on a topic, under its id; its reply, as it came."""
Cancel = Callable[[str], Awaitable[None]]
"""Tell the workers the call with this id is not wanted any more."""


class Callbacks(TypedDict, total=False):
    """What `Client.call` and `run_tool_calls` take to answer a tool's questions and
    approvals; each callback a plain function (run in a thread of its own, so it may
    block on `input()`) or an async one."""

    on_input: OnInput | None
    on_sampling: OnSampling | None
    on_approval: OnApproval | None
    max_rounds: int


@dataclass(frozen=True, slots=True)
class Asked:
    """One call as it was first sent: where its continuations go, and what to re-send,
    approved, under a new id."""

    topic: str
    body: dict[str, Any]
    continue_on: str
    ident: str | None = None  # the id of its first request (None: it had none)


@dataclass(frozen=True, slots=True)
class Rounds:
    """The callbacks of one call (`Rounds.of`), and the driving of its rounds."""

    on_input: OnInput | None = None
    on_sampling: OnSampling | None = None
    on_approval: OnApproval | None = None
    max_rounds: int = MAX_ROUNDS
    # One question at a time, across the calls of a message too: a person answers one
    # at a time, and a callback need not be re-entrant.
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock, compare=False, repr=False)

    @classmethod
    def of(cls, callbacks: Callbacks) -> Rounds | None:
        """None when no callback is given: the call goes as it always has."""
        rounds = cls(
            callbacks.get("on_input"),
            callbacks.get("on_sampling"),
            callbacks.get("on_approval"),
            callbacks.get("max_rounds", MAX_ROUNDS),
        )
        if rounds.max_rounds < 0:
            raise ValueError("max_rounds cannot be negative")
        return rounds if (rounds.input or rounds.on_approval is not None) else None

    @property
    def input(self) -> bool:
        """Does the caller answer questions (the request's `input: true`)?"""
        return self.on_input is not None or self.on_sampling is not None

    def asks(self, reply: Reply) -> bool:
        """Is `reply` a round these callbacks go on from?"""
        code = reply.error.code if reply.error is not None and not reply.ok else None
        return (code is ErrorCode.INPUT_REQUIRED and self.input) or (
            code is ErrorCode.APPROVAL_REQUIRED and self.on_approval is not None
        )

    async def drive(
        self, reply: Reply, asked: Asked, send: Send, cancel: Cancel | None = None
    ) -> Reply:
        """The rounds that follow `reply`, to the call's last reply. Cancelled meanwhile
        (waiting for a callback, say), the call is cancelled at the workers by the id of
        the request that got the question: the question waiting there is given up, not
        kept to its expiry (a round's request in flight is cancelled by its own, as any)."""
        asking = [asked.ident]  # the id of the request whose reply asks now
        try:
            return await self._rounds(reply, asked, send, asking)
        except asyncio.CancelledError:
            if cancel is not None and asking[0] is not None:
                await cancel(asking[0])
            raise

    async def _rounds(
        self, reply: Reply, asked: Asked, send: Send, asking: list[str | None]
    ) -> Reply:
        for _ in range(self.max_rounds):
            if not self.asks(reply):
                return reply
            assert reply.error is not None
            details = reply.error.details
            if reply.error.code is ErrorCode.APPROVAL_REQUIRED:
                call = details.get("call")
                shown = dict(call) if isinstance(call, Mapping) else {}
                async with self._turn:
                    approved = await _called(self.on_approval, shown)
                if approved is not True:
                    return reply  # refused: raised as `ApprovalRequired`
                topic, body = asked.topic, {**asked.body, "approval": details.get("approval")}
            else:
                topic = asked.continue_on
                body = {
                    "continuation": details.get("continuation"),
                    "input_responses": await self.answers(details.get("input_requests")),
                    "input": True,  # a next round may ask again
                }
                for option in ("progress", "extend_on_progress"):  # as the call asked
                    if option in asked.body:
                        body[option] = asked.body[option]
            ident = uuid.uuid4().hex  # a round is a new request, never a repeat
            reply = await send(topic, {**body, "id": ident}, ident)
            asking[0] = ident
        return reply  # still asking after `max_rounds`: raised, with its tokens

    async def answers(self, requests: object) -> dict[str, dict[str, Any]]:
        """An answer to each question by its key, one after another in the order listed."""
        found: dict[str, dict[str, Any]] = {}
        for key, question in requests.items() if isinstance(requests, Mapping) else ():
            async with self._turn:
                answer = await self._answer(question)
            if answer is not None:
                found[str(key)] = answer
        return found

    async def _answer(self, question: object) -> dict[str, Any] | None:
        if not isinstance(question, Mapping):
            return None
        params = question.get("params")
        params = dict(params) if isinstance(params, Mapping) else {}
        method = question.get("method")
        if method == ELICITATION:
            if self.on_input is None:
                return {"action": "decline"}
            return _elicit_result(await _called(self.on_input, params))
        if method == SAMPLING and self.on_sampling is not None:
            result = await _called(self.on_sampling, params)
            return None if result is None else _mapping(result, "on_sampling")
        return None  # sampling nobody answers, or a method of a later contract

    async def settle(
        self, answer: CallsReply, body: dict[str, Any], send: Send, on: str, cancel: Cancel
    ) -> CallsReply:
        """A provider message's answer with each call that asked driven to its end (its
        rounds as plain requests on `on`), and `append` rendered again from the ends."""
        calls = _calls(body)
        if calls is None or len(calls) != len(answer.results):
            return answer  # not calls we can tell apart: as it came
        options = {"input": True} if self.input else {}
        pairs = list(zip(calls, answer.results, strict=True))
        ends = await asyncio.gather(
            *(
                self.drive(
                    reply,
                    Asked(
                        on, {"tool": call.name, "arguments": call.arguments, **options}, on, call.id
                    ),
                    send,
                    cancel,
                )
                if self.asks(reply)
                else _same(reply)
                for call, reply in pairs
            )
        )
        if all(end is reply for end, (_, reply) in zip(ends, pairs, strict=True)):
            return answer
        answered = [
            Answered(call.id or "", call.name, end)
            for (call, _), end in zip(pairs, ends, strict=True)
        ]
        return answer.model_copy(
            update={
                "results": list(ends),
                "append": conversation(answer.format, answered),
                "ok": all(end.ok for end in ends),
            }
        )


def _calls(body: dict[str, Any]) -> tuple[Wanted, ...] | None:
    try:
        return read(body).calls
    except ToolbusError:  # the worker read it; a client of another version may not
        return None


async def _same(reply: Reply) -> Reply:
    return reply


def _elicit_result(result: object) -> dict[str, Any]:
    answer = _mapping(result, "on_input")
    if answer.get("action") not in ELICIT_ACTIONS:
        raise ValueError("on_input returns an ElicitResult: action accept, decline or cancel")
    return answer


def _mapping(result: object, who: str) -> dict[str, Any]:
    """What a callback returned as JSON: a dict, or a pydantic model (an SDK's type)."""
    dump = getattr(result, "model_dump", None)
    if callable(dump):
        result = dump(mode="json", by_alias=True, exclude_none=True)
    if not isinstance(result, Mapping):
        raise TypeError(f"{who} returns a JSON object, not {type(result).__name__}")
    return dict(result)


async def _called(
    callback: Callable[[dict[str, Any]], Any] | None, argument: dict[str, Any]
) -> Any:
    """`callback(argument)`: awaited when async; a plain function in a daemon thread of
    its own, so a blocking prompt neither stalls the connection nor, on Ctrl-C, keeps
    the process from ending (the executor's threads are waited for at exit)."""
    assert callback is not None
    if inspect.iscoroutinefunction(callback):
        return await callback(argument)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():  # the caller's task may have been cancelled meanwhile
            outcome()

    def run() -> None:
        outcome: Callable[[], None]
        try:
            outcome = functools.partial(done.set_result, callback(argument))
        except Exception as exc:  # the callback's failure is the call's
            outcome = functools.partial(done.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop ended (Ctrl-C): nobody waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="toolbus-callback", daemon=True).start()
    value = await done
    return await value if inspect.isawaitable(value) else value
