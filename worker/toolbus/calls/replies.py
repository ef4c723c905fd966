"""Replies: what became of a call, as the answer a caller gets and dedup keeps.

The engine's answer to one call is a `Reply` (the wire's); the door encodes it for its
caller (doors/envelope/encode.py: a provider's format, a message of many calls, a dead
letter) and dedup stores it whole for a repeat.
"""

from __future__ import annotations

from opentelemetry.trace import Span

from toolbus.calls.call import Call
from toolbus.calls.preparation import Outcome
from toolbus.observability.spans import DEDUP_REPLAYED, mark_failed
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import InternalError
from toolbus.wire.report import to_wire


def reply_for_call(call: Call, outcome: Outcome) -> Reply:
    return reply_for(call.id, call.id_generated, outcome)


def reply_for(ident: str, id_generated: bool, outcome: Outcome) -> Reply:
    return Reply(
        id=ident,
        id_generated=id_generated,
        ok=outcome.ok,
        tool=outcome.tool,
        result=outcome.result if outcome.ok else None,
        error=outcome.error.body() if outcome.error is not None else None,
        duration_ms=round(outcome.duration_ms, 3),
        normalized=to_wire(outcome.normalized),
    )


INTERNAL = InternalError("the worker failed while answering this call").body()


def internal_reply(ident: str, id_generated: bool) -> Reply:
    """The last-resort answer: `internal`, with the call's id."""
    return Reply(id=ident, id_generated=id_generated, ok=False, error=INTERNAL, duration_ms=0.0)


def replayed(call: Call, stored: bytes, spans: list[Span]) -> Reply:
    """A repeat's answer: the stored reply again, under this request's id; `spans` say it
    is a replay and fail as the stored reply did."""
    reply = Reply.model_validate_json(stored).model_copy(
        update={"replayed": True, "id": call.id, "id_generated": False}
    )
    for span in spans:
        span.set_attribute(DEDUP_REPLAYED, True)
        if reply.error is not None:
            mark_failed(span, reply.error.code.value)
    return reply
