"""Answers to one request as they come, and what each says of it (`Said`): the
requester's bookkeeping (see `requester`'s docstring for how it waits on them)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from toolbus.wire.contracts import CallsReply, ErrorBody, ErrorCode, Progress, Reply
from toolbus.wire.errors import ToolbusError

log = logging.getLogger("toolbus.client")

# How a worker's progress update starts (`Progress.model_dump_json`: `type` comes first);
# everything else on the reply topic is an answer.
PROGRESS_START = b'{"type":"progress"'
TASK_START = b'{"type":"task"'  # a task's state (`TaskState`): `working`, a status change
OnProgress = Callable[[Progress], object]


class Said(IntEnum):
    """What an answer says of its request, for `Requester.request` to weigh. Ordered: of
    answers held, the greatest is given."""

    NOT_RUN = 0  # this delivery did not run (nothing claimed, or the claim refused)
    UNKNOWN = 1  # this delivery may have run and did not finish; another copy may know more
    FINAL = 2  # what became of the request: the answer


def final(_answer: object) -> Said:
    """Every answer is the request's (the first wins): for answers that cannot say less."""
    return Said.FINAL


@dataclass(slots=True)
class Pending:
    """One request's answers as they come: the first final one, else the greatest held."""

    parse: Callable[[bytes], Any]
    judge: Callable[[Any], Said]
    copies: int  # the most copies sent: no more answers than that are counted
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    final: Any = None  # the answer: ends the wait
    held: Any = None  # the greatest answer of those that say less, the first among equals
    held_said: Said = Said.NOT_RUN
    answered: int = 0  # copies answered with less than a final answer
    # Digests of the answers held: the same answer delivered again (QoS 1 is at least
    # once; a worker answers its request's redelivery with the reply it kept) is one
    # copy's answer, not another's. Two copies answered byte for byte alike (rare: the
    # durations differ) count as one: the wait then ends at the deadline, unknown, which
    # is safe; the other way round would end it early while a copy may still run.
    seen: set[bytes] = field(default_factory=set)
    closed: bool = False
    on_progress: OnProgress | None = None  # the request's progress updates, in order

    def take(self, payload: bytes) -> None:
        if self.final is not None or self.closed:
            return  # answered already (a late original, a replay)
        if payload.startswith(PROGRESS_START):  # an update, not an answer
            if self.on_progress is not None:
                self._progress(payload)
            return
        digest = hashlib.blake2b(payload, digest_size=16).digest()
        if digest in self.seen:
            return
        try:
            answer = self.parse(payload)  # raises for an answer we cannot read: not counted
        except (ValueError, RecursionError):
            if payload.startswith(TASK_START):
                return  # a task's state where its final reply is awaited (`run_task`)
            raise
        said = self.judge(answer)
        if said is Said.FINAL:
            self.final = answer
        elif self.answered < self.copies:
            self.seen.add(digest)
            self.answered += 1
            if self.held is None or said > self.held_said:
                self.held, self.held_said = answer, said
        self.arrived.set()

    def _progress(self, payload: bytes) -> None:
        """One update to the caller's callback: one it cannot read, or a callback that
        raises, is logged and the request goes on."""
        assert self.on_progress is not None
        try:
            self.on_progress(Progress.model_validate_json(payload))
        except Exception:
            log.exception("a progress update could not be handled")


def read_answer(payload: bytes) -> Reply | CallsReply:
    """A worker's answer: a `CallsReply` (it has `results`) or a plain `Reply`."""
    data = json.loads(payload)
    if isinstance(data, dict) and "results" in data:
        return CallsReply.model_validate(data)
    return Reply.model_validate(data)


def said(answer: Reply | CallsReply) -> Said:
    """What an answer says of its request: a message's, the least any of its calls says
    (one call's "did not run" may be contradicted by another copy of the message)."""
    if isinstance(answer, CallsReply):
        return min((said(reply) for reply in answer.results), default=Said.FINAL)
    error = answer.error
    if answer.ok or error is None or answer.replayed:
        return Said.FINAL  # it ran, or the record of its run answered
    details = error.details
    if (
        error.code is ErrorCode.RATE_LIMITED
        or (error.code is ErrorCode.UNAVAILABLE and details.get("store") is True)
        or (error.code is ErrorCode.TIMEOUT and details.get("expired") is True)
    ):
        return Said.NOT_RUN  # nothing claimed or run for this delivery, by its own word
    if error.code is ErrorCode.UNAVAILABLE:
        # A server down when it came (it did not run), or one lost mid-call, or a worker
        # stopping (it may have): the other copies' answers say which.
        return Said.UNKNOWN
    return Said.FINAL


def raise_failed(reply: Reply) -> Reply:
    """`reply`, when it is ok; else its error raised as the class of its code."""
    if reply.ok:
        return reply
    error = reply.error or ErrorBody(code=ErrorCode.INTERNAL, message="failed, without an error")
    raise ToolbusError.from_body(error, reply=reply)
