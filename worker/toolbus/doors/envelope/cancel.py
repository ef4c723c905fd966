"""Cancel messages: `{prefix}/cancel` and `{prefix}/cancel/{caller}`, read into a dedup key.

A cancel names its call as the call's own dedup key does (`Once.key`): the caller and
the id, or, for an anonymous caller, the reply topic and the id. The caller is learnt
by the same rules as a call's (`caller_identity`): in `claim` mode the body's `caller`
(or the topic's level), in `topic` mode the topic's level, which the broker's ACL ties
to the login (`cancel/%u`). An anonymous caller's cancel must carry the call's reply
topic (v5 Response Topic, or the body's `reply_to`): that is what makes the call its own.
So a cancel can only ever name its own caller's calls; one naming nothing running (a
call already answered, someone else's id, a mistake) changes nothing but a bounded
tombstone under its own key (dedup/cancels.py).

A cancel is never answered: its effect is the call's own final reply (`cancelled`).
Every worker of a pool hears every cancel, and all but the one running the call would
answer "not here": an acknowledgement would say nothing a caller could act on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from toolbus.dedup import Once
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import ANONYMOUS_CALLER, MAX_NAME_CHARS, Topics
from toolbus.wire.untrusted import shown, text_problem

log = logging.getLogger("toolbus.pipeline")

MAX_CANCEL_BYTES = 4096  # `{"id", "caller", "reply_to"}`: more is no cancel


@dataclass(frozen=True, slots=True)
class CancelOrder:
    """What a cancel message names: the call's dedup key, and its id for the logs."""

    key: str
    ident: str
    caller: str | None


class _Refused(Exception):
    """Why a cancel names no call (a reason key for the log)."""


def decode_cancel(message: Inbound, topics: Topics) -> CancelOrder | str:
    """The call a cancel names, or why it names none (a reason key for the log)."""
    try:
        return _decode(message, topics)
    except _Refused as refused:
        return str(refused)


def _decode(message: Inbound, topics: Topics) -> CancelOrder:
    level = topics.cancel_caller(message.topic)
    if level is None:
        raise _Refused("bad_topic")
    body = _body(message.payload)
    ident, claimed, reply_to = body.get("id"), body.get("caller"), body.get("reply_to")
    if not isinstance(ident, str) or not ident or text_problem(ident) is not None:
        raise _Refused("bad_id")
    if claimed is not None and (
        not isinstance(claimed, str) or text_problem(claimed) or len(claimed) > MAX_NAME_CHARS
    ):
        raise _Refused("bad_caller")
    caller = _caller(topics, level, claimed or None)
    reply_topic = message.response_topic or (reply_to if isinstance(reply_to, str) else None)
    anonymous_reply = None if caller else reply_topic
    if anonymous_reply is not None and topics.reply_problem(anonymous_reply, None) is not None:
        raise _Refused("bad_reply_topic")
    key = Once.key(caller, anonymous_reply, ident)
    if key is None:  # neither caller nor reply topic: no call could be this one's
        raise _Refused("no_owner")
    return CancelOrder(key, ident, caller)


async def hear_cancel(
    message: Inbound, topics: Topics, cancel: Callable[[str], Awaitable[bool]]
) -> bool:
    """A cancel message, never answered, never raising: True when the call it names
    runs here and was cancelled (`cancel`: the answerer's, by dedup key). What it names
    is logged by the request id only (a caller's reply topic may say who it is)."""
    order = decode_cancel(message, topics)
    if isinstance(order, str):
        log.info("ignored a cancel on %s: %s", shown(message.topic), order)
        return False
    try:
        found = await cancel(order.key)
    except Exception:
        log.exception("failed cancelling %s", shown(order.ident))
        return False
    # Not here: at another worker, early, answered already, or someone else's id.
    log.info("cancel of %s: %s", shown(order.ident), "running here" if found else "remembered")
    return found


def _body(payload: bytes) -> dict[str, object]:
    if len(payload) > MAX_CANCEL_BYTES:
        raise _Refused("too_large")
    try:
        body = json.loads(payload)
    except ValueError:
        raise _Refused("not_json") from None
    if not isinstance(body, dict):
        raise _Refused("not_an_object")
    return body


def _caller(topics: Topics, level: str, claimed: str | None) -> str | None:
    """The cancel's caller by the calls' rules (`decode._caller`)."""
    if topics.caller_identity == "topic":
        if claimed is not None and claimed != (level or None):
            raise _Refused("caller_mismatch")
        if level == ANONYMOUS_CALLER:
            raise _Refused("reserved_caller")
        return level or None
    if level and claimed and level != claimed:
        raise _Refused("caller_mismatch")
    return level or claimed
